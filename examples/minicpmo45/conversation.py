"""MiniCPM-o 4.5's duplex unit for the conversation engine: every stage batched across the conversations.

The unit is :mod:`.live`'s (``MiniCPMODuplex``'s ``streaming_prefill`` and ``streaming_generate``, see that
module's docstring for the upstream files it follows), restated over rows: a round takes one second of audio of
each of R conversations and runs

* LISTEN: each conversation's mel (the CPU front end, :class:`.live_model.UnitAudio`), then for all R at
  once the Whisper encoder's convolutions and its layers over each row's cached past (50 new frames a row,
  :class:`~duplexcadence.interpreter.engine.stacks.WhisperStack`), the projector and pooling (10 embeddings a
  row), and one LLM prefill of ``<unit>`` and those 10 embeddings (11 tokens a row) after each row's cache;
* the LLM's decisions: one-token steps over the rows still deciding, rows leaving as they feed a chunk
  terminator (a listening unit after one step, a speaking unit after its text), then ``</unit>`` for all of
  them and each row's sliding window;
* the TTS for the rows that speak: each row's condition (its text tokens and their LLM hidden states) prefilled
  after its turn's cache, rows grouped by condition length, then up to 25 + 1 one-token steps, rows leaving at
  their end of speech;
* the token2wav tail of each speaking row, its regular chunks stepped together across the runtime's lanes.

The one-token steps and the LISTEN prefill are :class:`~duplexcadence.interpreter.engine.rowgraphs.RowGraphs`:
on CUDA a graph per row count, replayed for any conversations in its rows. Every conversation's KV caches are
rows of :class:`~duplexcadence.interpreter.engine.kv.SlotKV` allocated once at the capacities of the plan; the
attention reads each row's exact length.

What is exact against what: the tail's audio of a conversation is ``torch.equal`` to the stock tail
(:class:`.stock.StockToken2wavSession`) fed the same speech tokens. The autoregressive stages of a round are the
same batched computation on every run, graphed or not (the same kernels on the same rows); they are not
batch-1 eager: a row's arithmetic depends on how many rows share its matrix products, and the attention is the
engine's, not ``transformers``' (tests/engine/ compares it with ``transformers``' per-row forward).

Sampling is the model's (``StreamDecoder.decode``'s two-stage text sampling, ``generate_chunk``'s speech
sampling), batched on the device, each conversation drawing from its own generator seeded at open and at every
reset; a :class:`~duplexcadence.interpreter.engine.api.Decision` replaces the chosen tokens as upstream's
``force_listen`` does (scripted conversations, random weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize

from duplexcadence.examples.minicpmo45.live import (
    AUDIO_AMPLITUDE,
    AUDIO_EMBEDDINGS_PER_SECOND,
    REFERENCE_AUDIO_SECONDS,
    SYSTEM_PREFIX,
    SYSTEM_SUFFIX,
)
from duplexcadence.examples.minicpmo45.live_config import (
    CHUNK_EOS_TOKEN,
    CHUNK_TERMINATORS,
    LISTEN_TOKEN,
    SAMPLE_RATE_IN,
    SPEAK_TOKEN,
    TEXT_TOKENS,
    TTS_AUDIO_BOS_TOKEN,
    TTS_AUDIO_TOKENS,
    TTS_BOS_TOKEN,
    TTS_PAD_TOKEN,
    TTS_TOKENS_PER_UNIT,
    TURN_EOS_TOKEN,
    UNIT_END_TOKEN,
    UNIT_TOKEN,
    DecodeSettings,
    LiveSizes,
)
from duplexcadence.examples.minicpmo45.live_model import (
    DuplexModel,
    UnitAudio,
    UnitSpan,
    WindowSettings,
    rope_theta,
    rotate_keys,
)
from duplexcadence.examples.minicpmo45.unit_plan import unit_plan
from duplexcadence.interpreter.engine.api import LISTEN, SPEAK, Decision, UnitInput
from duplexcadence.interpreter.engine.attention import default_backend
from duplexcadence.interpreter.engine.attention import get as attention_backend
from duplexcadence.interpreter.engine.engine import Engine
from duplexcadence.interpreter.engine.kv import SlotKV
from duplexcadence.interpreter.engine.rowgraphs import RowGraphs
from duplexcadence.interpreter.engine.sampling import NEVER, Sampler, SamplingConfig
from duplexcadence.interpreter.engine.stacks import LlamaStack, WhisperStack

OUTPUT_RATE = 24_000
LISTEN_TOKENS = 1 + AUDIO_EMBEDDINGS_PER_SECOND
"""Tokens a unit's LISTEN prefills: ``<unit>`` and a second's 10 audio embeddings."""
ENCODER_FRAMES_PER_UNIT = 50
"""Whisper frames a unit adds to the encoder's cache (100 mel frames a second, halved by its strided conv)."""
ENCODER_CONTEXT_FRAMES = 2
"""Mel frames of context either side of a unit (``cnn_redundancy_ms``), trimmed after the convolutions."""
SYSTEM_TOKENS = len(SYSTEM_PREFIX) + int(REFERENCE_AUDIO_SECONDS * AUDIO_EMBEDDINGS_PER_SECOND) + len(SYSTEM_SUFFIX)
"""The system prompt's LLM tokens: the prefix, the reference audio's embeddings, the suffix (43)."""
STAGES = ("listen", "llm", "tts", "tail")
SPEECH_STREAM = 2**40
"""Added to a conversation's seed for its speech sampler's stream (the text sampler's is the seed itself)."""


def decision_tokens(decision: Decision) -> tuple[int, ...]:
    """The tokens the LLM's decode steps choose under ``decision``, in order."""
    if decision.kind == LISTEN:
        return (LISTEN_TOKEN,)
    return (SPEAK_TOKEN, *decision.text, *((TURN_EOS_TOKEN,) if decision.end_of_turn else ()), CHUNK_EOS_TOKEN)


# ---------------------------------------------------------------------------------------------- sampling


# ---------------------------------------------------------------------------------------------- state


@attrs.define
class ConversationState:
    """One conversation's host-side state (its device state lives in the slot rows of the caches)."""

    slot: int
    seed: int
    audio: UnitAudio
    units: list[UnitSpan] = attrs.field(factory=list)
    """The units in the LLM cache after the system prompt (the sliding window drops them from the front)."""
    next_unit_id: int = 0
    unit_start: int = 0
    """The LLM cache's length when the current unit began."""
    system_length: int = 0
    turn_ended: bool = True
    tts_position: int = 0
    """``text_start_pos``: where the turn's next TTS condition goes (the TTS cache's length)."""
    dropped_units: int = 0
    dropped_tokens: int = 0


@attrs.define
class TextDecisions:
    """What the LLM decided in one unit of one row."""

    tokens: list[int] = attrs.field(factory=list)
    hidden: list[torch.Tensor] = attrs.field(factory=list)
    end_of_turn: bool = False
    is_listen: bool = False


@attrs.frozen
class UnitResult:
    """One unit of one row, as the engine reports it."""

    kind: str
    text_tokens: tuple[int, ...]
    speech_tokens: tuple[int, ...]
    audio: np.ndarray
    end_of_turn: bool


@attrs.define
class StageTimes:
    """Wall milliseconds of each stage of a round (each bracketed by a device synchronisation)."""

    listen: float = 0.0
    llm: float = 0.0
    tts: float = 0.0
    tail: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return attrs.asdict(self)


# ---------------------------------------------------------------------------------------------- the model


class MiniCPMo45Conversations:
    """MiniCPM-o 4.5's modules (seeded random weights at ``sizes``), its token2wav tail under the runtime, and
    ``slots`` conversations' caches on one device (see the module docstring)."""

    name = "minicpmo45"
    input_rate = SAMPLE_RATE_IN
    output_rate = OUTPUT_RATE
    unit_samples = SAMPLE_RATE_IN

    def __init__(
        self,
        sizes: LiveSizes,
        device: str | torch.device = "cpu",
        slots: int = 4,
        n_timesteps: int = 10,
        lanes: int = 1,
        capture: bool = True,
        attention: str | None = None,
        settings: DecodeSettings | None = None,
        window: WindowSettings | None = None,
        turn_seconds: int = 60,
        memory_fraction: float = 0.9,
        model_seed: int = 4242,
        tail_seed: int = 1234,
        mel_threads: int = 8,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        from duplexcadence.examples.minicpmo45.cadence import load_runtime
        from duplexcadence.examples.minicpmo45.model import build_tail, random_prompt

        def say(message: str) -> None:
            if progress is None:
                return
            if self.device.type == "cuda":  # what each phase holds, for the plan's bytes to be checked against
                message += f" ({torch.cuda.memory_allocated(self.device) / 2**30:.2f} GiB allocated)"
            progress(message)

        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.device = torch.device(device)
        self.sizes = sizes
        self.slots = slots
        self.settings = settings or DecodeSettings()
        self.window = window or WindowSettings()
        say(f"building MiniCPM-o 4.5's duplex modules ({sizes.name} sizes, bfloat16, seeded random weights)")
        self.model = DuplexModel(sizes, device, seed=model_seed)
        for module in self.model.modules():  # inference only: no autograd graph may keep a step's activations
            module.requires_grad_(False)
        self.device = self.model.device
        self.attention = attention or default_backend(self.device)
        self.capture = capture and self.device.type == "cuda"
        if self.capture and not attention_backend(self.attention).capturable:
            raise ValueError(
                f"attention backend {self.attention!r} reads each row's length on the host, which a CUDA graph cannot "
                "capture: with it pass capture=False, or choose a capturable backend (attention='triton')"
            )
        self.prompt = random_prompt(sizes.prompt_frames, seed=4321, device=self.device)
        self.plan = unit_plan(
            sizes,
            window=self.window,
            settings=self.settings,
            conversations=slots,
            n_timesteps=n_timesteps,
            turn_seconds=turn_seconds,
        )
        if self.device.type == "cuda":
            free = int(torch.cuda.mem_get_info(self.device)[0] * memory_fraction)
            fits = self.plan.fits(free, lanes)
            if fits is not None and slots > fits:
                raise ValueError(
                    f"{slots} conversations need {slots * self.plan.bytes_per_conversation / 2**30:.1f} GiB "
                    f"({self.plan.bytes_per_conversation / 2**20:.0f} MiB each, the plan of "
                    f"models.minicpmo45_duplex); {memory_fraction:.0%} of the {free / memory_fraction / 2**30:.1f} "
                    f"GiB free on {self.device} holds {fits}: ask for at most {fits}"
                )
        say(f"loading the token2wav tail under the runtime: {slots} sessions, {lanes} lane(s)")
        self.tail = load_runtime(
            build_tail(sizes.tail, seed=tail_seed, device=self.device),
            prompt_frames=sizes.prompt_frames,
            n_timesteps=n_timesteps,
            sessions=slots,
            lanes=lanes,
        )
        voice = self.tail.voice_initial(self.prompt)  # one copy for every conversation of the voice
        self.tail_sessions = [self.tail.session(self.prompt, seed=0, initial=voice) for _ in range(slots)]
        capacity = {name: self._capacity(name) for name in ("llm_kv", "tts_kv", "audio_kv")}
        llm, tts, apm = self.model.llm, self.model.tts, self.model.apm
        before = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        dtype = llm.lm_head.weight.dtype
        self.llm_kv = SlotKV(
            layers=llm.config.num_hidden_layers,
            slots=slots,
            kv_heads=llm.config.num_key_value_heads,
            capacity=capacity["llm_kv"],
            head_dim=llm.config.head_dim,
            dtype=dtype,
            device=self.device,
        )
        tts_config = tts.model.config
        self.tts_kv = SlotKV(
            layers=tts_config.num_hidden_layers,
            slots=slots,
            kv_heads=tts_config.num_key_value_heads,
            capacity=capacity["tts_kv"],
            head_dim=tts_config.hidden_size // tts_config.num_attention_heads,
            dtype=dtype,
            device=self.device,
        )
        self.audio_kv = SlotKV(
            layers=len(apm.layers),
            slots=slots,
            kv_heads=apm.layers[0].self_attn.num_heads,
            capacity=capacity["audio_kv"],
            head_dim=apm.layers[0].self_attn.head_dim,
            dtype=dtype,
            device=self.device,
        )
        caches = (
            (torch.cuda.memory_allocated(self.device) - before)
            if self.device.type == "cuda"
            else sum(kv.bytes for kv in (self.llm_kv, self.tts_kv, self.audio_kv))
        )
        self.allocated_per_conversation = caches // slots + self.tail.runtime.report().session_bytes
        """What one conversation's slot holds on the device, as allocated: its rows of the three caches and its
        tail session's block of the arena (:meth:`bytes_per_conversation` is the plan's figure)."""
        self.llm_stack = LlamaStack(llm.model, self.llm_kv, self.attention)
        self.tts_stack = LlamaStack(tts.model, self.tts_kv, self.attention)
        self.encoder_stack = WhisperStack(apm, self.audio_kv, self.attention)
        self.rope_theta = rope_theta(llm.config)
        settings = self.settings
        self.text_sampler = Sampler(
            SamplingConfig(
                vocab=llm.config.vocab_size,
                window=settings.text_repetition_window_size,
                penalty="distinct",
                banned=2,
                candidates=settings.top_k,
            ),
            slots,
            self.device,
        )
        self.speech_sampler = Sampler(
            SamplingConfig(vocab=TTS_AUDIO_TOKENS, window=settings.tts_repetition_window, penalty="repeat", banned=1),
            slots,
            self.device,
        )
        self.states: dict[int, ConversationState] = {}
        self.mel_pool = ThreadPoolExecutor(max_workers=max(1, min(mel_threads, slots)), thread_name_prefix="mel")
        say(
            f"caches of {slots} conversations allocated: {self.allocated_per_conversation / 2**20:.1f} MiB each "
            f"(the plan: {self.bytes_per_conversation() / 2**20:.1f} MiB)"
        )
        self._build_steps()
        if self.capture:
            self.capture_steps()
            self._warm_kernels()
            say("graphs captured at every row count, kernels compiled")

    # -- the graphed steps

    def _build_steps(self) -> None:
        slots, device = self.slots, self.device
        llm, tts = self.model.llm, self.model.tts
        hidden, tts_hidden = llm.config.hidden_size, tts.model.config.hidden_size
        dtype = llm.lm_head.weight.dtype
        self.rows = torch.zeros(slots, dtype=torch.int64, device=device)
        self.llm_step_in = torch.zeros(slots, 1, hidden, dtype=dtype, device=device)
        self.llm_logits = torch.zeros(slots, llm.config.vocab_size, dtype=dtype, device=device)
        self.llm_hidden = torch.zeros(slots, hidden, dtype=dtype, device=device)
        self.tts_step_in = torch.zeros(slots, 1, tts_hidden, dtype=dtype, device=device)
        self.tts_logits = torch.zeros(slots, TTS_AUDIO_TOKENS, dtype=torch.float32, device=device)
        apm = self.model.apm
        self.encoder_in = torch.zeros(slots, ENCODER_FRAMES_PER_UNIT, apm.config.d_model, dtype=dtype, device=device)
        self.unit_embed = self._embed([UNIT_TOKEN]).detach().clone()  # <unit>, every LISTEN's first token
        pool = torch.cuda.graph_pool_handle() if self.capture else None

        def llm_step(rows: int) -> None:
            out = self.llm_stack(self.llm_step_in[:rows], self.rows[:rows])[:, -1]
            self.llm_hidden[:rows].copy_(out)
            self.llm_logits[:rows].copy_(llm.lm_head(out))

        def listen(rows: int) -> None:
            self.llm_logits[:rows].copy_(self._listen_rows(self.encoder_in[:rows], self.rows[:rows]))

        def tts_step(rows: int) -> None:
            out = self.tts_stack(self.tts_step_in[:rows], self.rows[:rows])[:, -1]
            self.tts_logits[:rows].copy_(self._speech_logits(out))

        self.llm_step = RowGraphs("llm_step", llm_step, slots, device, self.capture, pool)
        self.listen = RowGraphs("listen", listen, slots, device, self.capture, pool)
        self.tts_step = RowGraphs("tts_step", tts_step, slots, device, self.capture, pool)

    @torch.no_grad()
    def capture_steps(self) -> None:
        """Capture every row count's graphs now (the first use would otherwise capture it)."""
        for graphs in self.step_graphs():
            graphs.capture(range(1, self.slots + 1))

    def step_graphs(self) -> tuple[RowGraphs, ...]:
        return (self.listen, self.llm_step, self.tts_step)

    def step_outputs(self) -> dict[str, tuple[torch.Tensor, ...]]:
        """The static buffers each batched step writes, by its graphs' name (a replay is compared on them)."""
        return {
            "listen": (self.llm_logits,),
            "llm_step": (self.llm_logits, self.llm_hidden),
            "tts_step": (self.tts_logits,),
        }

    @torch.no_grad()
    def _warm_kernels(self) -> None:
        """Compile, before the first round, the attention kernels the eager calls will launch (a kernel is
        compiled for each tile and split shape it meets): the TTS condition prefills at every length and row
        count, the system prompt's prefill."""
        decode_steps = self.settings.max_new_speak_tokens_per_chunk
        for stack, steps, counts in (
            (self.tts_stack, range(1, decode_steps + 1), range(1, self.slots + 1)),
            (self.llm_stack, (SYSTEM_TOKENS,), (1,)),
        ):
            kv, first = stack.kv, stack.model.layers[0].self_attn
            heads = first.config.num_attention_heads
            for rows in counts:
                slots = torch.arange(rows, device=self.device)
                for count in steps:
                    query = torch.zeros(rows, count, heads, stack.head_dim, dtype=kv.dtype, device=self.device)
                    stack.attention(query, kv.keys[0], kv.values[0], slots, kv.lengths, causal=True, scale=stack.scale)
        torch.cuda.synchronize(self.device)

    def _speech_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with parametrize.cached():
            return self.model.tts.head_code[0](hidden).float()

    def _set_rows(self, slots: Sequence[int]) -> torch.Tensor:
        self.rows[: len(slots)].copy_(torch.tensor(list(slots), dtype=torch.int64), non_blocking=True)
        return self.rows[: len(slots)]

    def _advance(self, kv: SlotKV, slots: Sequence[int], count: int) -> None:
        kv.advance(self._set_rows(slots), count)
        kv.host_lengths[list(slots)] += count

    # -- memory

    def _capacity(self, region: str) -> int:
        capacity = self.plan.region(region).capacity
        if capacity is None:
            raise ValueError(f"models.minicpmo45_duplex declares {region} without a time axis; the engine needs one")
        return capacity

    def bytes_per_conversation(self) -> int:
        """Device bytes one conversation holds, from the plan of ``models.minicpmo45_duplex`` (its caches at the
        declared capacities and its tail session's block)."""
        return self.plan.bytes_per_conversation

    def detokenize(self, tokens: tuple[int, ...]) -> str:
        """Token ids as text: the released tokenizer cannot be read here, so each id is written ``<id>``."""
        return "".join(f"<{token}>" for token in tokens)

    # -- conversations

    def start(self, slot: int, seed: int) -> None:
        """A conversation in ``slot``: fresh caches, its generators seeded, the system prompt prefilled (the prefix
        tokens, the reference audio's embeddings, the suffix: one prefill), its tail at a turn start."""
        for kv in (self.llm_kv, self.tts_kv, self.audio_kv):
            kv.clear(slot)
        settings = self.settings
        self.text_sampler.open(
            slot,
            seed,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            penalty=settings.text_repetition_penalty,
            banned=[(TTS_PAD_TOKEN, NEVER), (CHUNK_EOS_TOKEN, NEVER)],
        )
        self.speech_sampler.open(
            slot, seed + SPEECH_STREAM, temperature=settings.tts_temperature, penalty=settings.tts_repetition_penalty
        )
        tail = self.tail_sessions[slot]
        tail.session_seed = tail.session.seed = seed  # the tail's draws: the conversation's own, as stock's
        tail.reset()
        state = ConversationState(slot, seed, UnitAudio(self.sizes.mel_bins))
        reference = np.random.default_rng(seed + 1000).standard_normal(int(REFERENCE_AUDIO_SECONDS * SAMPLE_RATE_IN))
        mel = state.audio.mel.log_mel((AUDIO_AMPLITUDE * reference).astype(np.float32), dynamic=True)
        with torch.no_grad():
            audio = self.model.audio_embeddings(torch.from_numpy(np.ascontiguousarray(mel))[None])
            embeds = torch.cat([self._embed(SYSTEM_PREFIX), audio, self._embed(SYSTEM_SUFFIX)])
            self.llm_kv.check_room([slot], embeds.shape[0])
            rows = self._set_rows([slot])
            self.llm_stack(embeds[None], rows)
            self._advance(self.llm_kv, [slot], embeds.shape[0])
        state.system_length = int(self.llm_kv.host_lengths[slot])
        state.audio.reset()
        self.states[slot] = state

    def refusal(self, slot: int, unit: UnitInput) -> str | None:
        """Why ``unit`` cannot be the next unit of the conversation in ``slot`` (None when it can)."""
        decision = unit.decision
        if decision is not None and decision.kind == LISTEN and not self.states[slot].turn_ended:
            return "a listening decision inside a speaking turn: the turn must end first (a speaking decision with end_of_turn)"
        if decision is not None and any(not 0 <= token < TEXT_TOKENS for token in decision.text):
            return f"decision text tokens must be text ids 0..{TEXT_TOKENS - 1}"
        if decision is not None and decision.kind == SPEAK:
            most = self._text_tokens_per_unit() - decision.end_of_turn
            if len(decision.text) > most:
                ending = " and the turn's end" if decision.end_of_turn else ""
                return (
                    f"a unit speaks at most {most} text tokens{ending} "
                    f"(max_new_speak_tokens_per_chunk {self.settings.max_new_speak_tokens_per_chunk} less the "
                    f"speak and chunk-end tokens), got {len(decision.text)}"
                )
        return None

    def _text_tokens_per_unit(self) -> int:
        """The most text tokens a speaking unit gives: the LLM's decode steps but the speak and chunk-end ones."""
        return self.settings.max_new_speak_tokens_per_chunk - 2

    def release(self, slot: int) -> None:
        self.states.pop(slot, None)

    def _embed(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.model.llm.model.embed_tokens(torch.tensor(list(tokens), device=self.device))

    # -- a round

    @torch.no_grad()
    def run_units(self, slots: Sequence[int], inputs: Sequence[UnitInput]) -> tuple[list[UnitResult], StageTimes]:
        """One unit of each conversation in ``slots`` (see the module docstring)."""
        times = StageTimes()
        started = time.perf_counter()
        logits = self._listen(slots, [unit.audio for unit in inputs])
        times.listen = self._lap(started)
        started = time.perf_counter()
        decisions = self._decide(slots, logits, [unit.decision for unit in inputs])
        times.llm = self._lap(started)
        started = time.perf_counter()
        speaking = [index for index, decided in enumerate(decisions) if not decided.is_listen]
        speech = self._speak([slots[i] for i in speaking], [decisions[i] for i in speaking])
        times.tts = self._lap(started)
        started = time.perf_counter()
        audio = self._tail([slots[i] for i in speaking], speech, [decisions[i].end_of_turn for i in speaking])
        times.tail = self._lap(started)
        results = []
        spoken = dict(zip(speaking, zip((tokens for tokens, _ in speech), audio)))
        for index, decided in enumerate(decisions):
            tokens, pcm = spoken.get(index, ((), np.zeros(0, dtype=np.float32)))
            results.append(
                UnitResult(
                    LISTEN if decided.is_listen else SPEAK,
                    tuple(decided.tokens),
                    tuple(tokens),
                    pcm,
                    decided.end_of_turn,
                )
            )
        return results, times

    def _lap(self, started: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - started) * 1000

    # -- LISTEN

    def _listen(self, slots: Sequence[int], audio: Sequence[np.ndarray]) -> torch.Tensor:
        """LISTEN of every row -> the LLM's logits after ``<unit>`` and the unit's audio embeddings [R, vocab]:
        each row's mel and the encoder's convolutions (rows grouped by their mel's frames), then the encoder's
        layers and the LLM's prefill of all rows in one step (the ``listen`` graph)."""
        states = [self.states[slot] for slot in slots]
        mels = list(self.mel_pool.map(lambda state, second: state.audio.next_unit(second), states, audio))
        groups: dict[tuple[int, bool], list[int]] = {}
        for index, (mel, first) in enumerate(mels):
            groups.setdefault((mel.shape[-1], first), []).append(index)
        frames = {
            index: hidden
            for (_, first), members in groups.items()
            for index, hidden in zip(
                members,
                self._convolutions([slots[i] for i in members], torch.cat([mels[i][0] for i in members]), first),
            )
        }
        hidden = [frames[index] for index in range(len(slots))]
        new = {h.shape[0] for h in hidden}
        self.audio_kv.check_room(slots, max(new))
        self.llm_kv.check_room(slots, LISTEN_TOKENS)
        for slot, state in zip(slots, states):
            state.unit_start = int(self.llm_kv.host_lengths[slot])
        rows = self._set_rows(slots)
        if new == {ENCODER_FRAMES_PER_UNIT}:
            self.encoder_in[: len(slots)].copy_(torch.stack(hidden))
            self.listen(len(slots))
            logits = self.llm_logits[: len(slots)].clone()
        else:  # a unit of another length (never at the released settings): the same computation, eagerly
            logits = torch.cat([self._listen_rows(h[None], rows[i : i + 1]) for i, h in enumerate(hidden)])
        for length in sorted(new):
            self._advance(self.audio_kv, [slot for slot, h in zip(slots, hidden) if h.shape[0] == length], length)
        self._advance(self.llm_kv, slots, LISTEN_TOKENS)
        return logits

    def _convolutions(self, slots: list[int], mel: torch.Tensor, first: bool) -> torch.Tensor:
        """The encoder's convolutions on ``mel`` [R, mel_bins, frames], the context frames trimmed -> the unit's
        frames [R, 50, d_model]; a row whose encoder cache would pass its positions starts over, as upstream's."""
        apm, kv = self.model.apm, self.audio_kv
        encoder_frames = (mel.shape[-1] - 1) // 2 + 1
        limit = apm.embed_positions.weight.shape[0]
        for slot in slots:
            if kv.host_lengths[slot] + encoder_frames >= limit:
                kv.clear(slot)
        hidden = F.gelu(apm.conv1(mel.to(device=self.device, dtype=apm.conv1.weight.dtype)))
        hidden = F.gelu(apm.conv2(hidden))
        prefix = 0 if first else (ENCODER_CONTEXT_FRAMES + 1) // 2
        suffix = (ENCODER_CONTEXT_FRAMES + 1) // 2
        return hidden[:, :, prefix : hidden.shape[2] - suffix].permute(0, 2, 1)

    def _listen_rows(self, frames: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The encoder's layers after each row's cached past on ``frames`` [R, n, d_model], its final norm, the
        projector and the pooling (the unit's audio embeddings), then the LLM's prefill of ``<unit>`` and them
        after each row's cache -> the logits of the last position [R, vocab]."""
        apm = self.model.apm
        positions = self.audio_kv.lengths[rows][:, None] + torch.arange(frames.shape[1], device=frames.device)
        states = apm.layer_norm(self.encoder_stack(frames + apm.embed_positions.weight[positions], rows))
        embeds = self.model.audio_pool(self.model.audio_projection(states).transpose(1, 2)).transpose(1, 2)
        prefill = torch.cat([self.unit_embed.expand(frames.shape[0], 1, -1), embeds], dim=1)
        return self.model.llm.lm_head(self.llm_stack(prefill, rows)[:, -1])

    # -- the LLM's decisions

    def _sample_text(self, slots: Sequence[int], logits: torch.Tensor) -> tuple[list[int], list[int]]:
        """``StreamDecoder.decode``'s sampling of every row -> (the first draw, on the raw distribution: a chunk
        end there ends the chunk; the draw after the forbidden tokens, the repetition and length penalties, the
        temperature, top-k and top-p)."""
        s = self.settings
        rows = self._set_rows(slots)
        raw = self.text_sampler.draw(rows, logits)
        if s.length_penalty != 1.0 or s.listen_prob_scale != 1.0:
            logits = logits.float()
            eos = logits[:, TURN_EOS_TOKEN]
            logits[:, TURN_EOS_TOKEN] = torch.where(eos > 0, eos / s.length_penalty, eos * s.length_penalty)
            logits[:, LISTEN_TOKEN] *= s.listen_prob_scale
        final = self.text_sampler.sample(rows, logits)
        both = torch.stack([raw, final]).tolist()
        return both[0], both[1]

    def _decide(
        self, slots: Sequence[int], logits: torch.Tensor, decisions: Sequence[Decision | None]
    ) -> list[TextDecisions]:
        """The LLM part of ``streaming_generate`` for every row: one-token steps over the rows still deciding."""
        results = [TextDecisions() for _ in slots]
        forced = [iter(decision_tokens(d)) if d is not None else None for d in decisions]
        active = list(range(len(slots)))
        limit = self.settings.max_new_speak_tokens_per_chunk
        for step in range(limit):
            if not active:
                break
            active_slots = [slots[i] for i in active]
            if step == limit - 1:
                self._feed(active_slots, [CHUNK_EOS_TOKEN] * len(active))
                break
            raw, final = self._sample_text(active_slots, logits)
            tokens: list[int] = []
            chosen: list[int] = []
            kept: list[bool] = []
            for row, index in enumerate(active):
                state = self.states[slots[index]]
                choices = forced[index]
                choice = (
                    next(choices)
                    if choices is not None
                    else (CHUNK_EOS_TOKEN if raw[row] == CHUNK_EOS_TOKEN else final[row])
                )
                chosen.append(choice)
                kept.append(raw[row] != CHUNK_EOS_TOKEN and choice != CHUNK_EOS_TOKEN)
                if choice == LISTEN_TOKEN and not state.turn_ended:
                    choice = TTS_BOS_TOKEN  # no listening inside a turn
                results[index].is_listen = choice == LISTEN_TOKEN
                tokens.append(choice)
            self.text_sampler.record(
                self._set_rows(active_slots),
                torch.tensor(chosen, device=self.device),
                torch.tensor(kept, device=self.device),
            )
            logits, hidden = self._feed(active_slots, tokens)
            still = []
            for row, (index, token) in enumerate(zip(active, tokens)):
                if token in CHUNK_TERMINATORS:
                    continue
                state = self.states[slots[index]]
                state.turn_ended = False
                results[index].end_of_turn = token == TURN_EOS_TOKEN  # text after a turn's end reopens it
                if results[index].end_of_turn:
                    state.turn_ended = True
                if step != 0:
                    results[index].tokens.append(token)
                    results[index].hidden.append(hidden[row])
                still.append(row)
            active = [active[row] for row in still]
            logits = logits[still]
        self._feed(list(slots), [UNIT_END_TOKEN] * len(slots))
        for slot, decided in zip(slots, results):
            self._end_unit(self.states[slot], decided.is_listen)
        return results

    def _feed(self, slots: Sequence[int], tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token of each row into the LLM -> its logits [R, vocab] and last hidden states [R, hidden]."""
        rows = len(slots)
        self.llm_kv.check_room(slots, 1)
        self.llm_step_in[:rows, 0].copy_(self._embed(tokens))
        self._set_rows(slots)
        self.llm_step(rows)
        self._advance(self.llm_kv, slots, 1)
        return self.llm_logits[:rows].clone(), self.llm_hidden[:rows].clone()

    def _end_unit(self, state: ConversationState, is_listen: bool) -> None:
        """``register_unit_end`` and the ``basic`` sliding window: above the high mark, whole units leave the
        front (after the system prompt) until at most the low mark remain, the later keys re-rotated."""
        slot = state.slot
        length = int(self.llm_kv.host_lengths[slot]) - state.unit_start
        if length > 0:
            state.units.append(UnitSpan(state.next_unit_id, length, is_listen))
        state.next_unit_id += 1
        window = self.window
        if window.mode != "basic" or self.llm_kv.host_lengths[slot] <= window.high:
            return
        theta = self.rope_theta
        while self.llm_kv.host_lengths[slot] > window.low and state.units:
            unit = state.units.pop(0)
            self.llm_kv.drop(
                slot,
                state.system_length,
                unit.length,
                lambda keys, old, new: rotate_keys(keys[None], old, new, theta)[0],
            )
            state.dropped_units += 1
            state.dropped_tokens += unit.length

    # -- the TTS

    def _speak(self, slots: Sequence[int], decisions: Sequence[TextDecisions]) -> list[tuple[tuple[int, ...], bool]]:
        """``generate_chunk`` for every speaking row -> its speech tokens (25, or fewer at a turn's start or end) and
        whether the tail flushes them (the turn's first unit)."""
        if not slots:
            return []
        tts = self.model.tts
        minimum: list[int] = []
        flushes: list[bool] = []
        groups: dict[int, list[int]] = {}
        conditions = []
        longest_unit = self._text_tokens_per_unit() + 1 + TTS_TOKENS_PER_UNIT - 1  # the plan's tts_position
        for index, (slot, decided) in enumerate(zip(slots, decisions)):
            state = self.states[slot]
            condition = self._condition(decided)
            conditions.append(condition)
            groups.setdefault(condition.shape[0], []).append(index)
            after = state.tts_position + condition.shape[0] + TTS_TOKENS_PER_UNIT - 1
            if not decided.end_of_turn and after + longest_unit > self.tts_kv.capacity:
                decided.end_of_turn = True  # the turn's cache is full after this unit: the turn ends here
                state.turn_ended = True
            flushes.append(state.tts_position == 0)
            minimum.append(0 if (decided.end_of_turn or flushes[-1]) else TTS_TOKENS_PER_UNIT)
            self.tts_kv.check_room([slot], condition.shape[0] + TTS_TOKENS_PER_UNIT - 1)
        logits = torch.empty(len(slots), TTS_AUDIO_TOKENS, dtype=torch.float32, device=self.device)
        for length, members in groups.items():
            member_slots = [slots[i] for i in members]
            rows = self._set_rows(member_slots)
            out = self.tts_stack(torch.stack([conditions[i] for i in members]), rows)[:, -1]
            self._advance(self.tts_kv, member_slots, length)
            logits[members] = self._speech_logits(out)
        tokens: list[list[int]] = [[] for _ in slots]
        active = list(range(len(slots)))
        eos = TTS_AUDIO_TOKENS - 1
        for slot, least in zip(slots, minimum):
            self.speech_sampler.restart(slot)  # the repetition window is this unit's tokens
            self.speech_sampler.ban(slot, [(eos, least)])
        for step in range(TTS_TOKENS_PER_UNIT):
            active_slots = [slots[i] for i in active]
            rows = self._set_rows(active_slots)
            sampled = self.speech_sampler.sample(rows, logits)
            self.speech_sampler.record(rows, sampled)
            picked = sampled.tolist()
            still = []
            for row, (index, token) in enumerate(zip(active, picked)):
                if token == eos:
                    continue
                tokens[index].append(token)
                still.append(row)
            active = [active[row] for row in still]
            if not active or step == TTS_TOKENS_PER_UNIT - 1:
                break
            step_slots = [slots[i] for i in active]
            self.tts_kv.check_room(step_slots, 1)
            self.tts_step_in[: len(active), 0].copy_(
                tts.emb_code[0](torch.tensor([tokens[i][-1] for i in active], device=self.device))
            )
            self._set_rows(step_slots)
            self.tts_step(len(active))
            self._advance(self.tts_kv, step_slots, 1)
            logits = self.tts_logits[: len(active)].clone()
        speech = []
        for index, (slot, decided) in enumerate(zip(slots, decisions)):
            state = self.states[slot]
            returned = tokens[index][: TTS_TOKENS_PER_UNIT - 1]
            if decided.end_of_turn:
                self.tts_kv.clear(slot)
                state.tts_position = 0
            else:
                state.tts_position = int(self.tts_kv.host_lengths[slot])
            speech.append((tuple(returned), flushes[index]))
        return speech

    def _condition(self, decided: TextDecisions) -> torch.Tensor:
        """``_convert_results_to_tts_input``: text embedding + normalised semantic projection of each text token's
        LLM hidden state, then the audio BOS -> [len + 1, tts_hidden]."""
        tts = self.model.tts
        bos = tts.emb_text(torch.tensor([TTS_AUDIO_BOS_TOKEN], device=self.device))
        if not decided.tokens:
            return bos
        embeds = tts.emb_text(torch.tensor(decided.tokens, device=self.device))
        states = tts.projector_semantic(torch.stack(decided.hidden))
        return torch.cat([embeds + F.normalize(states, p=2, dim=-1), bos])

    # -- the tail

    def _tail(
        self, slots: Sequence[int], speech: Sequence[tuple[tuple[int, ...], bool]], ends: Sequence[bool]
    ) -> list[np.ndarray]:
        """Each speaking row's speech tokens into its token2wav session -> its audio; the rows' regular chunks
        are stepped together (lanes), a turn's flush and last chunks one by one."""
        calls = [
            self.tail_sessions[slot].chunk_calls(list(tokens), flush=flush, end_of_turn=end)
            for slot, (tokens, flush), end in zip(slots, speech, ends)
        ]
        outputs: list[list[torch.Tensor]] = [[] for _ in slots]
        for wave in range(max((len(c) for c in calls), default=0)):
            planned: dict[Any, tuple[int, torch.Tensor]] = {}
            for index, row_calls in enumerate(calls):
                if wave >= len(row_calls):
                    continue
                call = row_calls[wave]
                session = self.tail_sessions[slots[index]]
                if call.planned:
                    planned[session] = (index, torch.tensor([call.tokens], dtype=torch.int32).to(self.device))
                else:
                    outputs[index].append(session.run_chunk(call))
            if planned:
                stepped = self.tail.step_new_many({session: new for session, (_, new) in planned.items()})
                for session, (index, _) in planned.items():
                    outputs[index].append(stepped[session].cpu())
        for slot, end in zip(slots, ends):
            if end:
                self.tail_sessions[slot].reset()
        return [
            torch.cat([chunk.reshape(-1) for chunk in chunks]).numpy() if chunks else np.zeros(0, dtype=np.float32)
            for chunks in outputs
        ]


def load_engine(
    device: str = "cpu",
    sizes: str | LiveSizes = "released",
    conversations: int = 4,
    headroom: float = 0.1,
    **options: Any,
) -> Engine:
    """The conversation engine of MiniCPM-o 4.5 (the ``minicpmo45`` entry point): ``conversations`` slots at
    ``sizes`` (``released`` or ``reduced``, :data:`.live_config.SIZES`) on ``device``; ``options`` go to
    :class:`MiniCPMo45Conversations`."""
    from duplexcadence.examples.minicpmo45.live_config import SIZES

    if isinstance(sizes, str):
        if sizes not in SIZES:
            raise ValueError(f"sizes must be one of {', '.join(sorted(SIZES))}, got {sizes!r}")
        sizes = SIZES[sizes]
    model = MiniCPMo45Conversations(sizes, device, slots=conversations, **options)
    return Engine(model, headroom=headroom)
