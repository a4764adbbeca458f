"""MiniCPM-o 4.5's live duplex unit loop, with the token2wav tail stock and under DuplexCadence side by side.

MiniCPM-o 4.5 serves a duplex conversation one *unit* per second of the user's audio
(OpenBMB/MiniCPM-o-Demo ``MiniCPMO45/modeling_minicpmo.py``, ``MiniCPMODuplex``):

* LISTEN, ``streaming_prefill``: ``<unit>`` is fed to the LLM, the new second of audio becomes a log-mel
  (the whole buffer recomputed on the CPU), the Whisper encoder runs on it after its KV cache, the
  projector and ``AvgPool1d(5)`` make 10 embeddings, and the LLM prefills them (its logits are kept);
* SPEAK, ``streaming_generate``: the LLM decodes ``<|listen|>`` (the unit ends there) or ``<|speak|>`` and
  a few text tokens, up to a chunk terminator, then ``</unit>`` is fed and the ``basic`` sliding window
  applied; when speaking, the TTS turns the text tokens and their LLM hidden states into 25 + 1 speech
  tokens (25 returned), and ``_generate_waveform_from_tokens`` feeds them to the token buffer (primed
  with three silence tokens at a turn start) and calls ``Token2wav.stream`` on every 28 tokens (25 new
  + 3 lookahead), flushing at a turn's first unit and streaming the rest as the last chunk when the
  turn ends, after which the tail's caches go back to the voice's set-up
  (``_reset_token2wav_for_new_turn``).

:class:`LiveDuplex` runs that loop with the stages of :mod:`.live_model` (``transformers`` modules at
released sizes, seeded random weights) once per unit, and feeds the same speech tokens to two tails
built with the same seed: the stock ``Token2wav.stream`` path (:class:`.stock.StockToken2wavSession`)
and the DuplexCadence runtime (:func:`.cadence.load_runtime`, :class:`.cadence.CadenceToken2wavSession`).
Every chunk of audio the two produce is compared with ``torch.equal``.

The conversation is scripted (:func:`conversation_script`): random weights make no conversation, so
the LLM's decisions (listen or speak, how many text tokens, where a turn ends) come from a pattern
such as ``"L4 S8 L5 S1"`` (4 listening units, a speaking turn of 8 units, ...). Each decision still
runs the LLM's full sampling (:meth:`.live_model.LlmStream.decode`); the TTS samples its speech
tokens itself. The user's audio is seeded noise.

``ar`` picks how the LLM and the TTS run: ``eager`` (:mod:`.live_model`'s ``transformers`` modules with
growing caches, op by op) or ``graphed`` (:mod:`.live_static`: static KV caches, one-token steps replayed
from CUDA graphs; close to eager, not bitwise equal). The tails are compared the same way in both.

Timing, per unit, each stage bracketed by a device synchronisation: LISTEN (all of
``streaming_prefill``), LLM generate (the text decisions and feeds, ``</unit>``, the window), TTS
generate (condition and ``generate_chunk``), and the tail of each side (the token buffer's
``stream`` calls with the host copy of the audio, and the end-of-turn reset). SPEAK of a side is LLM
+ TTS + its tail on a speaking unit; a unit of a side is LISTEN + LLM + TTS + its tail. The two tails
alternate which runs first. With several conversations, each second serves every conversation's
unit in turn; a round is their sum.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from duplexcadence.examples.minicpmo45.live_config import (
    AUDIO_POOL_STEP,
    CHUNK_EOS_TOKEN,
    CHUNK_TERMINATORS,
    LISTEN_TOKEN,
    SAMPLE_RATE_IN,
    SPEAK_TOKEN,
    TEXT_TOKENS,
    TTS_BOS_TOKEN,
    TTS_TOKENS_PER_UNIT,
    TURN_EOS_TOKEN,
    UNIT_END_TOKEN,
    UNIT_TOKEN,
    DecodeSettings,
    LiveSizes,
)
from duplexcadence.examples.minicpmo45.live_model import (
    HOP,
    DuplexModel,
    LlmStream,
    UnitAudio,
    WindowSettings,
    generate_speech_tokens,
    tts_condition,
)
from duplexcadence.examples.minicpmo45.live_static import StaticLlmStream, StaticSpeechBackbone, StepGraph
from duplexcadence.interpreter.bench.timing import percentile, sync

SIDES = ("stock", "duplexcadence")
CADENCE_MS = 1000.0
DEFAULT_PATTERN = "L4 S8 L5 S1 L3 S12 L6 S5 L4 S10 L6"
"""64 units: 28 listening, 36 speaking in five turns (8, 1, 12, 5 and 10 units)."""
WARMUP_PATTERN = "L1 S2"
TEXT_TOKENS_PER_UNIT = (3, 7)
"""Text tokens the LLM speaks per speaking unit, drawn uniformly (``streaming_text_chunk_min`` / ``_max``)."""
REFERENCE_AUDIO_SECONDS = 3.0
SYSTEM_PREFIX = (151644, 9125, 198, 2610, 525, 264, 10950, 17847, 13, 198, 151697)
"""Token ids standing for ``<|im_start|>system\\nYou are a helpful assistant.\\n<|audio_start|>``."""
SYSTEM_SUFFIX = (151699, 151645)
"""``<|audio_end|><|im_end|>``."""
AUDIO_AMPLITUDE = 0.1
AUDIO_EMBEDDINGS_PER_SECOND = SAMPLE_RATE_IN // HOP // 2 // AUDIO_POOL_STEP
"""10: mel frames a second, halved by the encoder's strided conv, pooled by ``audio_pool_step``."""
AR_VARIANTS = ("eager", "graphed")
"""How the autoregressive stages run: ``eager``, ``transformers``' modules with growing caches, op by op;
``graphed``, static KV caches and one-token steps replayed from CUDA graphs (:mod:`.live_static`)."""
AR_TITLES = {
    "eager": "autoregressive stages eager: transformers' modules, DynamicCache, launched op by op",
    "graphed": "autoregressive stages graphed: static KV caches, one-token LLM and TTS steps replayed from CUDA graphs",
}


def check_ar(ar: str) -> str:
    """``ar`` when it names a variant of :data:`AR_VARIANTS`, else a ValueError saying which there are."""
    if ar not in AR_VARIANTS:
        raise ValueError(f"the autoregressive stages run {' or '.join(map(repr, AR_VARIANTS))}, got {ar!r}")
    return ar


def llm_cache_capacity(window: WindowSettings, settings: DecodeSettings) -> int:
    """Slots of the graphed variant's LLM cache: the window's high mark (or the system prompt when longer)
    plus the longest unit (``<unit>``, a second's audio embeddings, every decode feed, ``</unit>``). With the
    window off the high mark still sizes it; a feed past it raises :class:`.live_static.CacheFull`."""
    system = len(SYSTEM_PREFIX) + int(REFERENCE_AUDIO_SECONDS * AUDIO_EMBEDDINGS_PER_SECOND) + len(SYSTEM_SUFFIX)
    unit = 1 + AUDIO_EMBEDDINGS_PER_SECOND + settings.max_new_speak_tokens_per_chunk + 1
    return max(window.high, system) + unit


# ---------------------------------------------------------------------------------------------- the script


@attrs.frozen
class UnitPlan:
    """What the LLM decides in one unit of the scripted conversation."""

    index: int
    kind: str
    """``listen`` or ``speak``."""
    turn: int | None
    """Index of the speaking turn (None while listening)."""
    turn_start: bool
    turn_end: bool
    text: tuple[int, ...] = ()
    """The text tokens spoken in this unit."""

    def choices(self) -> tuple[int, ...]:
        """The tokens the LLM's decode steps return, in order."""
        if self.kind == "listen":
            return (LISTEN_TOKEN,)
        return (SPEAK_TOKEN, *self.text, *((TURN_EOS_TOKEN,) if self.turn_end else ()), CHUNK_EOS_TOKEN)


class ScriptError(ValueError):
    """A conversation pattern that cannot be read."""


PATTERN_ITEM = re.compile(r"([LS])(\d+)")


def parse_pattern(pattern: str) -> list[tuple[str, int]]:
    """``"L4 S8 L5"`` -> [("listen", 4), ("speak", 8), ("listen", 5)]: L = listening units, S = one speaking
    turn of that many units."""
    items = pattern.split()
    if not items:
        raise ScriptError("the conversation pattern is empty; write items like 'L4 S8' (L: listen, S: a speaking turn)")
    segments = []
    for item in items:
        match = PATTERN_ITEM.fullmatch(item)
        if match is None or int(match.group(2)) < 1:
            raise ScriptError(
                f"pattern item {item!r} is not L<n> (n listening units) or S<n> (a speaking turn of n units), n >= 1"
            )
        segments.append(("listen" if match.group(1) == "L" else "speak", int(match.group(2))))
    return segments


def conversation_script(
    pattern: str = DEFAULT_PATTERN, seed: int = 0, text_tokens: tuple[int, int] = TEXT_TOKENS_PER_UNIT
) -> list[UnitPlan]:
    """The units of ``pattern``; each speaking unit speaks a seeded number of text tokens in
    ``text_tokens`` (inclusive), uniform text ids."""
    low, high = text_tokens
    if not 1 <= low <= high <= 16:
        raise ScriptError(f"text tokens per unit must be 1 <= low <= high <= 16, got {low}..{high}")
    generator = torch.Generator().manual_seed(seed)
    plans: list[UnitPlan] = []
    turn = 0
    for kind, count in parse_pattern(pattern):
        for position in range(count):
            index = len(plans)
            if kind == "listen":
                plans.append(UnitPlan(index, "listen", None, False, False))
                continue
            spoken = int(torch.randint(low, high + 1, (1,), generator=generator))
            text = tuple(torch.randint(0, TEXT_TOKENS, (spoken,), generator=generator).tolist())
            plans.append(UnitPlan(index, "speak", turn, position == 0, position == count - 1, text))
        if kind == "speak":
            turn += 1
    return plans


def user_audio(units: int, seed: int = 0) -> np.ndarray:
    """The user's audio: seeded Gaussian noise, float32 [units, 16000] (one second per unit)."""
    generator = np.random.default_rng(seed)
    return (AUDIO_AMPLITUDE * generator.standard_normal((units, SAMPLE_RATE_IN))).astype(np.float32)


# ---------------------------------------------------------------------------------------------- one conversation


@attrs.define
class TextResult:
    tokens: tuple[int, ...]
    hidden: list[torch.Tensor]
    end_of_turn: bool
    is_listen: bool


@attrs.frozen
class SpeechTokens:
    tokens: tuple[int, ...]
    force_flush: bool
    end_of_turn: bool


class Conversation:
    """One duplex session's state over the shared model and its two tail sessions."""

    def __init__(
        self,
        index: int,
        model: DuplexModel,
        tails: dict[str, Any],
        settings: DecodeSettings,
        window: WindowSettings,
        seed: int,
        ar: str = "eager",
    ) -> None:
        self.index = index
        self.model = model
        self.tails = tails
        self.settings = settings
        self.seed = seed
        self.speech_backbone: StaticSpeechBackbone | None = None
        if check_ar(ar) == "graphed":
            self.llm: LlmStream = StaticLlmStream(model.llm, settings, window, llm_cache_capacity(window, settings))
            self.speech_backbone = StaticSpeechBackbone(model.tts, model.sizes.tts_max_positions)
        else:
            self.llm = LlmStream(model.llm, settings, window)
        self.audio = UnitAudio(model.sizes.mel_bins)
        self.tts_temperature = torch.tensor([settings.tts_temperature], dtype=torch.float, device=model.device)
        reference = np.random.default_rng(seed + 1000).standard_normal(int(REFERENCE_AUDIO_SECONDS * SAMPLE_RATE_IN))
        self.reference_audio = (AUDIO_AMPLITUDE * reference).astype(np.float32)
        self._reset_state()

    def _reset_state(self) -> None:
        self.llm.reset()
        self.audio.reset()
        self.audio_cache: Any = None
        self.pending_logits: torch.Tensor | None = None
        self.current_turn_ended = True
        self.tts_past: Any = None
        self.tts_text_start_pos = 0
        if self.speech_backbone is not None:
            self.speech_backbone.clear()

    @torch.no_grad()
    def prepare(self) -> None:
        """``MiniCPMODuplex.prepare``: a fresh session, the system prompt (prefix tokens one at a time, the
        reference audio's embeddings, the suffix), its length kept out of the window; the tails start a turn."""
        self._reset_state()
        for token in SYSTEM_PREFIX:
            self.llm.feed(self.llm.embed(token))
        mel = self.audio.mel.log_mel(self.reference_audio, dynamic=True)
        self.llm.feed(self.model.audio_embeddings(torch.from_numpy(np.ascontiguousarray(mel))[None]))
        for token in SYSTEM_SUFFIX:
            self.llm.feed(self.llm.embed(token))
        self.llm.register_system_prompt()
        self.audio.reset()
        for tail in self.tails.values():
            tail.reset()

    @torch.no_grad()
    def listen(self, waveform: np.ndarray) -> None:
        """``streaming_prefill`` with one second of audio."""
        self.llm.register_unit_start()
        self.llm.feed(self.llm.embed(UNIT_TOKEN))
        mel, first = self.audio.next_unit(waveform)
        embeds, self.audio_cache = self.model.audio_embeddings_streaming(
            mel, self.audio_cache, prefix_frames=0 if first else 2, suffix_frames=2
        )
        self.pending_logits, _ = self.llm.feed(embeds)

    @torch.no_grad()
    def generate_text(self, plan: UnitPlan) -> TextResult:
        """The LLM part of ``streaming_generate`` (explicit listen/speak mode), its decisions from ``plan``."""
        if self.pending_logits is None:
            raise RuntimeError("generate_text before listen: a unit starts with its prefill")
        logits, self.pending_logits = self.pending_logits, None
        choices = iter(plan.choices())
        tokens: list[int] = []
        hidden: list[torch.Tensor] = []
        end_of_turn = is_listen = False
        limit = self.settings.max_new_speak_tokens_per_chunk
        for step in range(limit):
            if step == limit - 1:
                self.llm.feed(self.llm.embed(CHUNK_EOS_TOKEN))
                break
            token = self.llm.decode(logits, next(choices))
            if token == LISTEN_TOKEN and not self.current_turn_ended:
                token = TTS_BOS_TOKEN  # no listening inside a turn
            is_listen = token == LISTEN_TOKEN
            if token in CHUNK_TERMINATORS:
                logits, _ = self.llm.feed(self.llm.embed(token))
                break
            self.current_turn_ended = False
            logits, state = self.llm.feed(self.llm.embed(token))
            end_of_turn = token == TURN_EOS_TOKEN
            if end_of_turn:
                self.current_turn_ended = True
            if step != 0:
                tokens.append(token)
                hidden.append(state)
        self.llm.feed(self.llm.embed(UNIT_END_TOKEN))
        self.llm.register_unit_end(is_listen)
        self.llm.enforce_window()
        return TextResult(tuple(tokens), hidden, end_of_turn, is_listen)

    @torch.no_grad()
    def generate_speech(self, text: TextResult) -> SpeechTokens:
        """The TTS part of ``streaming_generate``: 25 + 1 speech tokens (none forced at a turn's start or end)."""
        condition = tts_condition(self.model.tts, text.tokens, text.hidden)
        force_flush = self.tts_text_start_pos == 0
        minimum = 0 if (text.end_of_turn or force_flush) else TTS_TOKENS_PER_UNIT
        new, past = generate_speech_tokens(
            self.model.tts,
            condition,
            self.tts_past,
            self.tts_text_start_pos,
            minimum,
            TTS_TOKENS_PER_UNIT,
            self.tts_temperature,
            self.settings,
            self.speech_backbone,
        )
        if text.end_of_turn:
            self.tts_past, self.tts_text_start_pos = None, 0
            if self.speech_backbone is not None:
                self.speech_backbone.clear()
        else:
            self.tts_past = past
            self.tts_text_start_pos += condition.shape[1] + new.shape[1]
        return SpeechTokens(tuple(new.reshape(-1).tolist()), force_flush, text.end_of_turn)

    @torch.no_grad()
    def speak(self, side: str, speech: SpeechTokens) -> list[torch.Tensor]:
        """``_generate_waveform_from_tokens`` on one side's tail, then its reset when the turn ends; the audio
        of each ``stream`` call, float32 [1, samples] on the CPU."""
        tail = self.tails[side]
        chunks = tail.push_tokens(list(speech.tokens), flush=speech.force_flush, end_of_turn=speech.end_of_turn)
        if speech.end_of_turn:
            tail.reset()
        return chunks


# ---------------------------------------------------------------------------------------------- the loop


@attrs.define
class UnitRecord:
    """One unit of one conversation: its plan, stage wall times (ms) and what the tails made."""

    conversation: int
    plan: UnitPlan
    listen_ms: float
    llm_ms: float
    cache_length: int
    tts_ms: float = 0.0
    text_tokens: int = 0
    speech: tuple[int, ...] = ()
    """The speech tokens the TTS made in this unit."""
    windows: list[tuple[int, ...]] = attrs.field(factory=list)
    """The tokens of each stock ``stream`` call (3 lookahead tokens included)."""
    last_chunk: list[bool] = attrs.field(factory=list)
    samples: list[int] = attrs.field(factory=list)
    tail_ms: dict[str, float] = attrs.field(factory=dict)
    tail_peak_bytes: dict[str, int] = attrs.field(factory=dict)
    equal: bool | None = None

    @property
    def speaking(self) -> bool:
        return self.plan.kind == "speak"

    def speak_ms(self, side: str) -> float:
        return self.llm_ms + self.tts_ms + self.tail_ms.get(side, 0.0)

    def unit_ms(self, side: str) -> float:
        return self.listen_ms + self.speak_ms(side)


@attrs.define
class LiveRun:
    records: list[UnitRecord]
    ticks: int
    conversations: int
    runtime_counters: dict[str, int]
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None

    def mismatches(self) -> list[tuple[int, int]]:
        return [(r.conversation, r.plan.index) for r in self.records if r.equal is False]


class _PeakTracker:
    """The process's peak allocated bytes across per-span resets (a span's own peak is measured from its start)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0

    def begin(self) -> int:
        if self.device.type != "cuda":
            return 0
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)

    def end(self, before: int) -> int:
        if self.device.type != "cuda":
            return 0
        span = torch.cuda.max_memory_allocated(self.device)
        self.peak = max(self.peak, span)
        return span - before


def _allocated(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    sync(device)
    return torch.cuda.memory_allocated(device)


class LiveDuplex:
    """The model, both tails and ``conversations`` sessions (see the module docstring)."""

    def __init__(
        self,
        sizes: LiveSizes,
        device: str | torch.device = "cpu",
        n_timesteps: int = 10,
        tail_float16: bool = False,
        conversations: int = 1,
        seed: int = 0,
        model_seed: int = 4242,
        tail_seed: int = 1234,
        settings: DecodeSettings | None = None,
        window: WindowSettings | None = None,
        progress: Callable[[str], None] | None = None,
        ar: str = "eager",
    ) -> None:
        from duplexcadence.examples.minicpmo45.cadence import load_runtime
        from duplexcadence.examples.minicpmo45.model import build_tail, random_prompt
        from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

        say = progress or (lambda message: None)
        if conversations < 1:
            raise ValueError(f"conversations must be at least 1, got {conversations}")
        self.ar = check_ar(ar)
        self.sizes = sizes
        self.device = torch.device(device)
        self.n_timesteps = n_timesteps
        self.tail_float16 = tail_float16
        self.conversation_count = conversations
        self.seed = seed
        self.settings = settings or DecodeSettings()
        self.window = window or WindowSettings()
        self.setup_s: dict[str, float] = {}
        self.resident_bytes: dict[str, int] = {}

        started = time.perf_counter()
        say(f"building the duplex model ({sizes.name} sizes, bfloat16, seeded random weights) on {self.device}")
        self.model = DuplexModel(sizes, self.device, seed=model_seed)
        sync(self.device)
        self.setup_s["model_build"] = time.perf_counter() - started
        self.resident_bytes["model"] = _allocated(self.device)
        counts = self.model.parameter_counts()
        say(
            f"model: {counts['total'] / 1e9:.3f} B parameters (LLM {counts['llm'] / 1e9:.3f} B, audio encoder "
            f"{counts['audio_encoder'] / 1e6:.1f} M, TTS {counts['tts'] / 1e6:.1f} M), built in "
            f"{self.setup_s['model_build']:.1f} s"
        )
        self.prompt = random_prompt(sizes.prompt_frames, seed=4321, device=self.device)

        started = time.perf_counter()
        before = _allocated(self.device)
        say(f"building the stock token2wav tail and {conversations} session(s)")
        self.stock_tail = build_tail(sizes.tail, seed=tail_seed, device=self.device, float16=tail_float16)
        stock_sessions = [
            StockToken2wavSession(
                self.stock_tail,
                self.prompt,
                n_timesteps=n_timesteps,
                session_seed=seed + index,
                own_caches=conversations > 1,
            )
            for index in range(conversations)
        ]
        self.resident_bytes["stock_tail"] = _allocated(self.device) - before
        self.setup_s["stock_tail"] = time.perf_counter() - started

        started = time.perf_counter()
        before = _allocated(self.device)
        say("building the DuplexCadence tail (same seed), loading the runtime (graph capture on CUDA)")
        self.bound = load_runtime(
            build_tail(sizes.tail, seed=tail_seed, device=self.device, float16=tail_float16),
            prompt_frames=sizes.prompt_frames,
            n_timesteps=n_timesteps,
            sessions=conversations,
        )
        cadence_sessions = [self.bound.session(self.prompt, seed=seed + index) for index in range(conversations)]
        self.resident_bytes["duplexcadence_tail"] = _allocated(self.device) - before
        self.setup_s["duplexcadence_tail"] = time.perf_counter() - started

        self.conversations = [
            Conversation(
                index,
                self.model,
                {"stock": stock_sessions[index], "duplexcadence": cadence_sessions[index]},
                self.settings,
                self.window,
                seed + index,
                ar,
            )
            for index in range(conversations)
        ]
        started = time.perf_counter()
        for conversation in self.conversations:
            conversation.prepare()
        sync(self.device)
        self.setup_s["prepare"] = time.perf_counter() - started

    def scripts(self, pattern: str, text_tokens: tuple[int, int] = TEXT_TOKENS_PER_UNIT) -> list[list[UnitPlan]]:
        """Each conversation's script of ``pattern`` (its own seed: its own text tokens)."""
        return [conversation_script(pattern, self.seed + c.index, text_tokens) for c in self.conversations]

    def step_graphs(self) -> dict[str, dict[str, int]]:
        """The graphed variant's one-token steps, summed over the conversations: cache capacity, calls,
        captures and replays (CUDA) per stage; empty for ``eager``."""
        found: dict[str, list[tuple[int, StepGraph]]] = {"llm": [], "tts": []}
        for conversation in self.conversations:
            if isinstance(conversation.llm, StaticLlmStream):
                found["llm"].append((conversation.llm.kv.capacity, conversation.llm.graph))
            if conversation.speech_backbone is not None:
                found["tts"].append((conversation.speech_backbone.kv.capacity, conversation.speech_backbone.graph))
        return {
            stage: {
                "cache_capacity": max(capacity for capacity, _ in graphs),
                "calls": sum(graph.calls for _, graph in graphs),
                "captures": sum(graph.captures for _, graph in graphs),
                "replays": sum(graph.replays for _, graph in graphs),
            }
            for stage, graphs in found.items()
            if graphs
        }

    def warmup(self, pattern: str = WARMUP_PATTERN, progress: Callable[[str], None] | None = None) -> None:
        """A short conversation through every stage and both tails, then every session prepared afresh."""
        say = progress or (lambda message: None)
        started = time.perf_counter()
        self.run(self.scripts(pattern), measure=False)
        for conversation in self.conversations:
            conversation.prepare()
        sync(self.device)
        self.setup_s["warmup"] = time.perf_counter() - started
        say(f"warm-up ({pattern}) done in {self.setup_s['warmup']:.1f} s")

    def run(
        self,
        scripts: Sequence[Sequence[UnitPlan]],
        audio: Sequence[np.ndarray] | None = None,
        measure: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> LiveRun:
        """Serve ``scripts`` (one per conversation, same length), one unit of every conversation per second."""
        say = progress or (lambda message: None)
        device = self.device
        if len(scripts) != len(self.conversations) or len({len(script) for script in scripts}) != 1:
            raise ValueError("one script per conversation, all of the same length")
        ticks = len(scripts[0])
        if audio is None:
            audio = [user_audio(ticks, seed=self.seed + 100 + c.index) for c in self.conversations]
        counters = ("replays", "eager_planned", "eager_off_plan")
        before_counters = self._counters(counters)
        tracker = _PeakTracker(device)
        if measure and device.type == "cuda":
            sync(device)
            torch.cuda.reset_peak_memory_stats(device)
        records: list[UnitRecord] = []
        for tick in range(ticks):
            for conversation in self.conversations:
                plan = scripts[conversation.index][tick]
                records.append(self._unit(conversation, plan, audio[conversation.index][tick], tick, tracker))
            if measure and ((tick + 1) % 10 == 0 or tick + 1 == ticks):
                recent = [r for r in records[-10 * len(self.conversations) :] if r.speaking]
                if recent:
                    say(
                        f"unit {tick + 1}/{ticks}: last speaking units, mean unit stock "
                        f"{statistics.fmean(r.unit_ms('stock') for r in recent):.0f} ms, duplexcadence "
                        f"{statistics.fmean(r.unit_ms('duplexcadence') for r in recent):.0f} ms"
                    )
                else:
                    say(f"unit {tick + 1}/{ticks}")
        after_counters = self._counters(counters)
        peak = reserved = None
        if device.type == "cuda":
            tracker.begin()
            peak, reserved = tracker.peak, torch.cuda.max_memory_reserved(device)
        delta = {name: after_counters[name] - before_counters[name] for name in counters}
        return LiveRun(records, ticks, len(self.conversations), delta, peak, reserved)

    def _counters(self, names: Sequence[str]) -> dict[str, int]:
        totals = dict.fromkeys(names, 0)
        for conversation in self.conversations:
            counters = conversation.tails["duplexcadence"].session.counters
            for name in names:
                totals[name] += getattr(counters, name)
        return totals

    def _unit(
        self, conversation: Conversation, plan: UnitPlan, waveform: np.ndarray, tick: int, tracker: _PeakTracker
    ) -> UnitRecord:
        device = self.device
        sync(device)
        start = time.perf_counter()
        conversation.listen(waveform)
        sync(device)
        listened = time.perf_counter()
        text = conversation.generate_text(plan)
        sync(device)
        generated = time.perf_counter()
        if text.is_listen != (plan.kind == "listen"):
            raise RuntimeError(
                f"unit {plan.index}: the LLM's unit ended {'listening' if text.is_listen else 'speaking'}"
            )
        record = UnitRecord(
            conversation.index,
            plan,
            (listened - start) * 1000,
            (generated - listened) * 1000,
            conversation.llm.cache_length(),
            text_tokens=len(text.tokens),
        )
        if text.is_listen:
            return record
        speech = conversation.generate_speech(text)
        sync(device)
        record.tts_ms = (time.perf_counter() - generated) * 1000
        record.speech = speech.tokens
        stock_history = conversation.tails["stock"].history
        seen = len(stock_history)
        order = SIDES if (tick + conversation.index) % 2 == 0 else SIDES[::-1]
        outputs: dict[str, list[torch.Tensor]] = {}
        for side in order:
            base = tracker.begin()
            sync(device)
            began = time.perf_counter()
            outputs[side] = conversation.speak(side, speech)
            sync(device)
            record.tail_ms[side] = (time.perf_counter() - began) * 1000
            record.tail_peak_bytes[side] = tracker.end(base)
        record.windows = [chunk.tokens for chunk in stock_history[seen:]]
        record.last_chunk = [chunk.last_chunk for chunk in stock_history[seen:]]
        stock, cadence = outputs["stock"], outputs["duplexcadence"]
        record.samples = [int(chunk.shape[-1]) for chunk in stock]
        record.equal = len(stock) == len(cadence) and all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(stock, cadence)
        )
        return record


# ---------------------------------------------------------------------------------------------- results


def stats(values: Sequence[float], budget_ms: float = CADENCE_MS) -> dict[str, Any]:
    """n, mean, p50, p99 (nearest rank), max and their share of the budget, and how many exceed it."""
    if not values:
        return {"n": 0}
    mean, p99 = statistics.fmean(values), percentile(list(values), 0.99)
    return {
        "n": len(values),
        "mean_ms": mean,
        "p50_ms": percentile(list(values), 0.5),
        "p99_ms": p99,
        "max_ms": max(values),
        "budget_ms": budget_ms,
        "mean_of_budget": mean / budget_ms,
        "p99_of_budget": p99 / budget_ms,
        "over_budget": sum(value > budget_ms for value in values),
    }


def summarize(run: LiveRun) -> dict[str, Any]:
    """Per-stage, SPEAK, unit and (several conversations) round statistics, stage shares, overruns."""
    records = run.records
    speaking = [r for r in records if r.speaking]
    summary: dict[str, Any] = {
        "stages": {
            "listen": stats([r.listen_ms for r in records]),
            "llm_generate": stats([r.llm_ms for r in records]),
            "llm_generate_speaking": stats([r.llm_ms for r in speaking]),
            "tts_generate": stats([r.tts_ms for r in speaking]),
            **{f"tail_{side}": stats([r.tail_ms[side] for r in speaking]) for side in SIDES},
        },
        "speak": {side: stats([r.speak_ms(side) for r in speaking]) for side in SIDES},
        "unit": {side: stats([r.unit_ms(side) for r in records]) for side in SIDES},
        "unit_speaking": {side: stats([r.unit_ms(side) for r in speaking]) for side in SIDES},
    }
    shares: dict[str, dict[str, float]] = {}
    for side in SIDES:
        total = sum(r.unit_ms(side) for r in speaking)
        if total > 0:
            shares[side] = {
                "listen": sum(r.listen_ms for r in speaking) / total,
                "llm_generate": sum(r.llm_ms for r in speaking) / total,
                "tts_generate": sum(r.tts_ms for r in speaking) / total,
                "tail": sum(r.tail_ms[side] for r in speaking) / total,
            }
    summary["stage_share_of_speaking_units"] = shares
    summary["overran"] = {
        side: [[r.conversation, r.plan.index] for r in records if r.unit_ms(side) > CADENCE_MS] for side in SIDES
    }
    if run.conversations > 1:
        rounds: dict[str, list[float]] = {side: [0.0] * run.ticks for side in SIDES}
        for r in records:
            for side in SIDES:
                rounds[side][r.plan.index] += r.unit_ms(side)
        summary["round"] = {side: stats(rounds[side]) for side in SIDES}
    return summary


def environment(device: torch.device) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": version("transformers"),
        "stepaudio2_minicpmo": version("stepaudio2-minicpmo"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
    }
    if device.type == "cuda":
        env["device_total_bytes"] = torch.cuda.get_device_properties(device).total_memory
    return env


def result_json(live: LiveDuplex, run: LiveRun, pattern: str, text_tokens: tuple[int, int]) -> dict[str, Any]:
    mismatches = run.mismatches()
    speaking = [r for r in run.records if r.speaking]
    chunks = sum(len(r.samples) for r in speaking)
    report = live.bound.runtime.report()
    sizes = attrs.asdict(live.sizes, recurse=False)
    sizes["tail"] = dataclasses.asdict(live.sizes.tail)
    payload: dict[str, Any] = {
        "what": "MiniCPM-o 4.5 live duplex unit loop: LISTEN (mel, Whisper encoder, LLM prefill) -> SPEAK (LLM "
        "text, TTS speech tokens, token2wav tail), the tail stock and DuplexCadence on the same tokens",
        "autoregressive": live.ar,
        "title": f"MiniCPM-o 4.5 live duplex, {AR_TITLES[live.ar]}",
        "environment": environment(live.device),
        "config": {
            "sizes": sizes,
            "parameters": live.model.parameter_counts(),
            "parameter_bytes": live.model.parameter_bytes(),
            "model_dtype": "bfloat16",
            "tail_dtype": "float16" if live.tail_float16 else "float32",
            "n_timesteps": live.n_timesteps,
            "prompt_frames": live.sizes.prompt_frames,
            "conversations": run.conversations,
            "units": run.ticks,
            "pattern": pattern,
            "text_tokens_per_unit": list(text_tokens),
            "seed": live.seed,
            "decode": attrs.asdict(live.settings),
            "sliding_window": attrs.asdict(live.window),
        },
        "setup_s": dict(live.setup_s),
        "cadence_ms": CADENCE_MS,
        **summarize(run),
        "bit_identical": not mismatches and chunks > 0,
        "chunks_compared": chunks,
        "units_differing": len(mismatches),
        "first_differing_units": mismatches[:10],
        "llm_window": [
            {
                "conversation": c.index,
                "cache_length": c.llm.cache_length(),
                "dropped_units": c.llm.dropped_units,
                "dropped_tokens": c.llm.dropped_tokens,
            }
            for c in live.conversations
        ],
        "runtime": {
            "arena_bytes": report.arena_bytes,
            "graphs_captured": report.graphs_captured,
            "capture_seconds": report.capture_seconds,
            **run.runtime_counters,
        },
        "units": [
            {
                "conversation": r.conversation,
                "unit": r.plan.index,
                "kind": r.plan.kind,
                "turn": r.plan.turn,
                "turn_start": r.plan.turn_start,
                "turn_end": r.plan.turn_end,
                "text_tokens": r.text_tokens,
                "speech": list(r.speech),
                "windows": [list(window) for window in r.windows],
                "last_chunk": r.last_chunk,
                "samples": r.samples,
                "llm_cache_length": r.cache_length,
                "listen_ms": r.listen_ms,
                "llm_ms": r.llm_ms,
                "tts_ms": r.tts_ms,
                "tail_ms": dict(r.tail_ms),
                "tail_peak_bytes": dict(r.tail_peak_bytes),
                "equal": r.equal,
            }
            for r in run.records
        ],
    }
    if live.ar == "graphed":
        payload["autoregressive_graphs"] = live.step_graphs()
    if live.device.type == "cuda":
        payload["memory"] = {
            "peak_allocated_bytes": run.peak_allocated_bytes,
            "peak_reserved_bytes": run.peak_reserved_bytes,
            "resident_bytes": dict(live.resident_bytes),
            "tail_step_peak_bytes": {
                side: max((r.tail_peak_bytes.get(side, 0) for r in speaking), default=0) for side in SIDES
            },
        }
    return payload


def _row(label: str, values: dict[str, Any]) -> str:
    if not values.get("n"):
        return f"{label:<26} {'-':>4}"
    return (
        f"{label:<26} {values['n']:>4} {values['mean_ms']:>9.1f} {values['p50_ms']:>8.1f} {values['p99_ms']:>8.1f} "
        f"{values['max_ms']:>8.1f} {values['mean_of_budget']:>7.1%} {values['p99_of_budget']:>7.1%} "
        f"{values['over_budget']:>4}"
    )


def table(payload: dict[str, Any]) -> str:
    """The short table of :func:`result_json`'s payload: stages, SPEAK and whole units against the 1 s cadence."""
    head = (
        f"{'ms per unit':<26} {'n':>4} {'mean':>9} {'p50':>8} {'p99':>8} {'max':>8} {'mean%':>7} {'p99%':>7} {'>1s':>4}"
    )
    stages = payload["stages"]
    lines = [payload.get("title", f"MiniCPM-o 4.5 live duplex, {AR_TITLES['eager']}"), head, "-" * len(head)]
    lines.append(_row("LISTEN (prefill)", stages["listen"]))
    lines.append(_row("LLM generate, speaking", stages["llm_generate_speaking"]))
    lines.append(_row("TTS generate", stages["tts_generate"]))
    for side, label in (("stock", "stock"), ("duplexcadence", "DuplexCadence")):
        lines.append(_row(f"tail, {label}", stages[f"tail_{side}"]))
    for side, label in (("stock", "stock"), ("duplexcadence", "DuplexCadence")):
        lines.append(_row(f"SPEAK, {label}", payload["speak"][side]))
    for side, label in (("stock", "stock"), ("duplexcadence", "DuplexCadence")):
        lines.append(_row(f"unit, {label}", payload["unit"][side]))
    if "round" in payload:
        for side, label in (("stock", "stock"), ("duplexcadence", "DuplexCadence")):
            lines.append(_row(f"round of {payload['config']['conversations']}, {label}", payload["round"][side]))
    shares = payload["stage_share_of_speaking_units"]
    for side, label in (("stock", "stock"), ("duplexcadence", "DuplexCadence")):
        if side in shares:
            share = shares[side]
            lines.append(
                f"share of a speaking unit, {label}: LISTEN {share['listen']:.0%}, LLM {share['llm_generate']:.0%}, "
                f"TTS {share['tts_generate']:.0%}, tail {share['tail']:.0%}"
            )
    lines.append(
        "mean% / p99% of the 1 s cadence, >1s: how many over it; SPEAK = LLM + TTS + tail of a speaking unit; "
        "unit = LISTEN + SPEAK (every unit); p99 nearest-rank"
    )
    return "\n".join(lines)


def text_tokens_range(text: str) -> tuple[int, int]:
    """``"3-7"`` -> (3, 7); ``"5"`` -> (5, 5)."""
    parts = text.split("-")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ScriptError(f"text tokens per unit must be N or LOW-HIGH, got {text!r}") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2:
        raise ScriptError(f"text tokens per unit must be N or LOW-HIGH, got {text!r}")
    return values[0], values[1]
