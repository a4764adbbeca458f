"""MiniCPM-o 4.5's token2wav tail under the DuplexCadence runtime: hooks, :func:`load_runtime`, a MiniCPM-o driver.

The clock is ``stdlib/models/step_audio2_token2wav.clock``. Its three stages call the package's own
modules through the hooks of :class:`Token2wavHooks`:

* ``flow``: ``flow.inference_chunk`` on the session's carried caches (the stock method, under the
  same autocast as ``Token2wav.stream``); it returns the new conformer caches and a view of the CFM
  buffer as the new DiT attention cache, which the runtime trims into the session's region
  (first P + last 100, as ``stream`` does); the DiT conv carries are updated in place in the
  session's region, bound to ``flow.decoder.cnn_cache_buffer`` like stock's carried cache is.
* ``hift_front``: ``torch.concat`` of the cached and new mel, then ``HiFTGenerator.forward`` with
  its ``_istft`` deferred: the magnitude and phase it would transform are copied to the
  ``spectrum`` working buffer instead. Graphable (with :mod:`.patches`), draws the source noise.
* ``hift_back``: the arithmetic of ``HiFTGenerator._istft`` on that spectrum, its ``torch.istft`` replaced by
  :class:`.istft.InverseStft` (the same ATen operations without the window check's read-back to the
  host; the fixed window is checked once at load), the clamp of ``HiFTGenerator.decode``,
  ``token2wav.fade_in_out`` with the held-back speech, and the output without the 3840 samples held
  back for the next cross-fade. Graphable. With ``istft="torch"`` it calls HiFT's own ``_istft``
  (``torch.istft``, whose window check reads a value back to the host), and runs eagerly after the graph.

The arithmetic is stock's, op for op; the split only moves where the tensors live.

:func:`load_runtime` takes the tail over: it installs the device constants of
:func:`.patches.apply_constant_patches`, replaces the CFM / DiT buffers and the noise table by
shape-only (``meta``) stand-ins of the demand sizes (the binding check compares shapes, then the
runtime binds the arena's views), and loads the clock with ``P`` and ``steps``. The stock buffers
(2.1 GiB fp32) are freed. Run stock on another tail built with the same seed.

:class:`CadenceToken2wavSession` is MiniCPM-o's driver over a runtime session, the same interface
as :class:`.stock.StockToken2wavSession`: a turn starts with 3 silence tokens; every 25 new tokens
are one planned instant (25 new + the 3 held as lookahead); a forced flush streams what is
buffered (8..27 tokens) as a short instant, every advance scaled to (k - 3) / 25 of a chunk; the end
of a turn is ``Session.finish``: the 3 lookahead tokens become frames too and the 3840 held-back
samples are released. Both are off the plan: :func:`turn_boundaries` declares them to the runtime
(``load_runtime(off_plan=...)``), which captures the instants they lead to ahead of time, as it does the
planned ones; an undeclared one runs eagerly. After the end of a turn,
:meth:`~CadenceToken2wavSession.reset` starts the next one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Program, RegionInfo
from duplexcadence.examples.minicpmo45.istft import InverseStft
from duplexcadence.examples.minicpmo45.model import (
    PRE_LOOKAHEAD_TOKENS,
    SILENCE_TOKEN,
    PromptConditioning,
    Token2wavTail,
)
from duplexcadence.examples.minicpmo45.package import load_stepaudio2
from duplexcadence.examples.minicpmo45.patches import (
    MAX_LAST_CHUNK_FRAMES,
    apply_constant_patches,
    estimator_cache_frames,
)
from duplexcadence.examples.minicpmo45.stock import (
    CHUNK_TOKENS,
    FLUSH_MIN_TOKENS,
    SOURCE_CACHE_SAMPLES,
    ChunkRecord,
    setup_stream_caches,
)
from duplexcadence.interpreter.plans.off_plan import OffPlanStep
from duplexcadence.interpreter.plans.trace import Firing, View
from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.interpreter.runtime.session import Session
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES, RegionStorage

ISTFT_CHOICES = ("captured", "torch")
"""How ``hift_back`` runs HiFT's iSTFT (:class:`Token2wavHooks`)."""


def check_istft(istft: str) -> None:
    """ValueError for an ``istft`` choice that is not one of :data:`ISTFT_CHOICES`."""
    if istft not in ISTFT_CHOICES:
        raise ValueError(f"istft must be one of {', '.join(ISTFT_CHOICES)}, not {istft!r}")


if TYPE_CHECKING:
    from duplexcadence.examples.minicpmo45.stepaudio2_types import HiFTGenerator

CLOCK = Path(__file__).resolve().parents[2] / "stdlib" / "models" / "step_audio2_token2wav.clock"

FLOAT16_REGIONS = (
    "conformer_att",
    "estimator_att",
    "estimator_cnn",
    "noise",
    "chunk_mel",
    "cfm_att",
    "dit_att",
    "dit_cnn",
)
"""Regions that are float16 in the float16 tail (``flow.half()`` buffers, autocast K/V, the CFM's mel).
The rest stay float32: HiFT, the speaker embedding, and ``conformer_cnn`` (a ``cat`` of the fp16
pre-lookahead carry with the fp32 upsample carry, which promotes)."""

BUFFER_REGIONS = {
    "cfm_att": ("decoder", "att_cache_buffer"),
    "estimator_cnn": ("decoder", "cnn_cache_buffer"),
    "dit_att": ("estimator", "att_cache_buffer"),
    "dit_cnn": ("estimator", "cnn_cache_buffer"),
    "noise": ("decoder", "rand_noise"),
}
"""Regions bound to registered buffers of ``flow.decoder`` / ``flow.decoder.estimator``."""


def float16_program(program: Program) -> Program:
    """The program for the float16 tail: the same shapes, :data:`FLOAT16_REGIONS` retyped to f16.

    ``.clock`` dtypes are literal, so the float16 variant is derived from the checked program.
    """
    regions = dict(program.regions)
    for name in FLOAT16_REGIONS:
        regions[name] = attrs.evolve(regions[name], dtype="f16", itemsize=2)
    return attrs.evolve(program, regions=regions)


class _DeferredIstft:
    """Stands in for ``HiFTGenerator._istft`` on the instance: keeps the magnitude and phase, returns nothing."""

    def __init__(self) -> None:
        self.magnitude: torch.Tensor | None = None
        self.phase: torch.Tensor | None = None

    def __call__(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        self.magnitude, self.phase = magnitude, phase
        return magnitude.new_empty(0)  # decode's clamp of it launches nothing


@contextmanager
def deferred_istft(hift: HiFTGenerator) -> Iterator[_DeferredIstft]:
    """Run ``hift.forward`` up to its ``_istft`` call: the block gets the magnitude and phase instead."""
    deferred = _DeferredIstft()
    hift._istft = deferred
    try:
        yield deferred
    finally:
        del hift._istft


def turn_boundaries(flush_tokens: Iterable[int] = (), end_tokens: Iterable[int] = (0,)) -> tuple[OffPlanStep, ...]:
    """The steps off the plan a MiniCPM-o turn takes, declared for :func:`load_runtime`: a forced flush of the
    turn's first chunk with ``flush_tokens`` new tokens (5 to 24: an 8- to 27-token window; 25 is the
    planned chunk), and the end of the turn (``finish``) with ``end_tokens`` new tokens, after any chunk.

    The default is the end of a turn whose TTS units each brought a whole chunk (25 tokens): ``finish`` with
    only the 3 lookahead tokens, 3 instants (after the first, second or a steady chunk). Each flush size adds
    the flush chunk and the two chunks after it until the turn is back on the plan, and each end size one
    instant per state a turn can end in; ``dsl plan models.step_audio2_token2wav --off-plan ...`` counts
    them (docs/runtime.md, "Steps off the plan"): ``turn_boundaries(range(5, 25))`` is 103 instants a
    session slot captures. Raises ValueError for a count outside those ranges."""
    flushes, ends = sorted(set(flush_tokens)), sorted(set(end_tokens))
    if any(not FLUSH_MIN_TOKENS - PRE_LOOKAHEAD_TOKENS <= count < CHUNK_TOKENS for count in flushes):
        raise ValueError(
            f"a forced flush streams {FLUSH_MIN_TOKENS - PRE_LOOKAHEAD_TOKENS} to {CHUNK_TOKENS - 1} new tokens "
            f"short of the planned {CHUNK_TOKENS}, not {flushes}"
        )
    if any(not 0 <= count < CHUNK_TOKENS for count in ends):
        raise ValueError(f"the end of a turn streams 0 to {CHUNK_TOKENS - 1} new tokens, not {ends}")
    steps = [OffPlanStep.of({"tokens": flushes}, at="start")] if flushes else []
    return tuple(steps + ([OffPlanStep.of({"tokens": ends}, last=True)] if ends else []))


def _fixed_shape(region: RegionInfo) -> tuple[int, ...]:
    """The shape of a region without a time axis (every region bound to a module buffer here)."""
    shape = tuple(dim for dim in region.shape if dim is not None)
    if len(shape) != len(region.shape):
        raise ValueError(f"region {region.name} has a time axis; a module buffer needs a fixed shape")
    return shape


def _view(firing: Firing, region: str) -> View:
    return next(view for view in firing.views if view.region == region)


class Token2wavHooks:
    """The stage hooks of ``step_audio2_token2wav.clock`` for one tail (see the module docstring)."""

    def __init__(self, tail: Token2wavTail, istft: str = "captured"):
        """`istft`: "captured" runs HiFT's iSTFT as :class:`.istft.InverseStft` (``hift_back`` is captured
        with the flow); "torch" calls HiFT's own ``_istft`` (``torch.istft``, whose window check reads a
        value back to the host, so ``hift_back`` runs eagerly after the graph). Both give the same samples."""
        check_istft(istft)
        self.istft = istft
        self.device = tail.device
        self.float16 = tail.float16
        self.speech_window = torch.from_numpy(np.hamming(2 * SOURCE_CACHE_SAMPLES)).to(tail.device)
        hift = tail.hift
        # HiFT's fixed window, checked once here for torch.istft's NOLA condition (ValueError if it fails)
        self.inverse_stft = InverseStft(
            hift.istft_params["n_fft"], hift.istft_params["hop_len"], hift.stft_window.to(tail.device)
        )
        self.fade_in_out = load_stepaudio2().token2wav.fade_in_out

    def as_dict(self) -> dict[str, Any]:
        return {"flow_chunk": self.flow_chunk, "hift_front": self.hift_front, "hift_back": self.hift_back}

    def flow_chunk(
        self,
        tail: Token2wavTail,
        tokens: torch.Tensor,
        speaker: torch.Tensor,
        conformer_att: torch.Tensor,
        conformer_cnn: torch.Tensor,
        estimator_att: torch.Tensor,
        *,
        firing: Firing,
    ) -> tuple[torch.Tensor, ...]:
        """``flow.inference_chunk`` under ``Token2wav.stream``'s autocast -> (conformer_att, conformer_cnn,
        estimator_att, chunk_mel), the new versions untrimmed (the runtime keeps first P + last 100)."""
        cache = {
            "conformer_cnn_cache": conformer_cnn,
            "conformer_att_cache": conformer_att,
            "estimator_cnn_cache": tail.flow.decoder.cnn_cache_buffer,  # the session's region, updated in place
            "estimator_att_cache": estimator_att,
        }
        autocast_dtype = torch.float16 if self.float16 else torch.float32
        # stock's autocast("cuda") turns itself off without CUDA: off the GPU it is simply not entered
        # (no autocast weight cache inside a graph capture; it changes no value: the casts are the same)
        with torch.amp.autocast("cuda", dtype=autocast_dtype, enabled=self.device.type == "cuda", cache_enabled=False):
            chunk_mel, new_cache = tail.flow.inference_chunk(
                token=tokens, spk=speaker, cache=cache, last_chunk=firing.last, n_timesteps=estimator_att.shape[0]
            )
        return (
            new_cache["conformer_att_cache"],
            new_cache["conformer_cnn_cache"],
            new_cache["estimator_att_cache"],
            chunk_mel,
        )

    def hift_front(
        self,
        tail: Token2wavTail,
        chunk_mel: torch.Tensor,
        hift_mel: torch.Tensor,
        hift_source: torch.Tensor,
        spectrum: torch.Tensor,
        *,
        firing: Firing,
    ) -> tuple[torch.Tensor, ...]:
        """HiFT up to the iSTFT -> (hift_mel, hift_source, spectrum): the mel HiFT ran on, its source
        excitation (cache head overwritten, as stock does), and [magnitude; phase] in the spectrum buffer."""
        mel = torch.concat([hift_mel, chunk_mel], dim=2)
        with deferred_istft(tail.hift) as deferred:
            _, source = tail.hift(mel, hift_source)
        magnitude, phase = deferred.magnitude, deferred.phase
        assert magnitude is not None and phase is not None  # HiFTGenerator.decode ends in its _istft call
        parts = spectrum[: 2 * magnitude.numel()].view(2, *magnitude.shape)
        parts[0].copy_(magnitude)
        parts[1].copy_(phase)
        return mel, source, spectrum

    def hift_istft(self, magnitude: torch.Tensor, phase: torch.Tensor, hift: Any) -> torch.Tensor:
        """``HiFTGenerator._istft``, op for op, with :class:`.istft.InverseStft` for its ``torch.istft``: the
        same values, without the host read-back of the window check (so ``hift_back`` is captured); with
        ``istft="torch"``, HiFT's own ``_istft``."""
        if self.istft == "torch":
            return hift._istft(magnitude, phase)
        magnitude = torch.clip(magnitude, max=1e2)
        real = magnitude * torch.cos(phase)
        imaginary = magnitude * torch.sin(phase)
        return self.inverse_stft(torch.complex(real, imaginary))

    def hift_back(
        self, tail: Token2wavTail, spectrum: torch.Tensor, hift_speech: torch.Tensor, *, firing: Firing
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """iSTFT, clamp, cross-fade -> (hift_speech, pcm): the whole faded speech (the runtime keeps its
        last 3840 samples) and the samples this chunk emits (all but those 3840, unless the turn ends)."""
        hift = tail.hift
        samples = _view(firing, "hift_speech").transient  # 480 per mel frame HiFT ran on
        bins = hift.istft_params["n_fft"] // 2 + 1
        frames = samples // hift.istft_params["hop_len"] + 1
        parts = spectrum[: 2 * bins * frames].view(2, 1, bins, frames)
        with torch.inference_mode():
            speech = self.hift_istft(parts[0], parts[1], hift)
            speech = torch.clamp(speech, -hift.audio_limit, hift.audio_limit)  # as HiFTGenerator.decode
            if hift_speech.shape[-1] > 0:
                speech = self.fade_in_out(speech, hift_speech, self.speech_window)
        return speech, speech[:, : _view(firing, "pcm").length]


@dataclass
class Token2wavRuntime:
    """A runtime bound to one tail for one prompt length and number of Euler steps (:func:`load_runtime`)."""

    runtime: Runtime
    tail: Token2wavTail = field(repr=False)
    hooks: Token2wavHooks = field(repr=False)
    prompt_frames: int
    n_timesteps: int
    noise: torch.Tensor = field(repr=False)
    """The CFM noise table's first P + 154 frames (every session's ``noise`` region starts as it)."""

    def voice_initial(self, prompt: PromptConditioning) -> dict[str, torch.Tensor]:
        """The regions a session of this voice starts with: stock's ``set_stream_cache`` set-up.

        ``flow.setup_cache`` runs on the shared working buffers of the arena (their content is dead
        between instants; the runtime lock is held) and a fresh conv-carry buffer, which is the
        set-up's carried ``estimator_cnn_cache`` (as in stock).
        """
        if prompt.prompt_frames != self.prompt_frames:
            raise ValueError(
                f"the runtime was loaded for P = {self.prompt_frames} prompt frames, the prompt has "
                f"{prompt.prompt_frames}"
            )
        runtime = self.runtime
        decoder = self.tail.flow.decoder
        owners = {"decoder": decoder, "estimator": decoder.estimator}
        with runtime.lock, torch.no_grad():
            saved = {name: getattr(owners[owner], attribute) for name, (owner, attribute) in BUFFER_REGIONS.items()}
            working = {name: self.scratch_view(name) for name in ("cfm_att", "dit_att", "dit_cnn")}
            cnn_shape = _fixed_shape(runtime.program.regions["estimator_cnn"])
            working["estimator_cnn"] = torch.zeros(cnn_shape, dtype=self.noise.dtype, device=self.tail.device)
            working["noise"] = self.noise
            try:
                for name, (owner, attribute) in BUFFER_REGIONS.items():
                    owners[owner]._buffers[attribute] = working[name]
                flow_cache, _ = setup_stream_caches(self.tail, prompt, self.n_timesteps)
            finally:
                for name, (owner, attribute) in BUFFER_REGIONS.items():
                    owners[owner]._buffers[attribute] = saved[name]
            tokens = torch.full((1, PRE_LOOKAHEAD_TOKENS), SILENCE_TOKEN, dtype=torch.int32, device=self.tail.device)
            return {
                "tokens": tokens,
                "speaker": prompt.speaker_embedding.to(torch.float32).clone(),
                "conformer_att": flow_cache["conformer_att_cache"].clone(),
                "conformer_cnn": flow_cache["conformer_cnn_cache"].clone(),
                "estimator_att": flow_cache["estimator_att_cache"].contiguous().clone(),
                "estimator_cnn": working["estimator_cnn"],
                "noise": self.noise,
            }

    def scratch_view(self, name: str) -> torch.Tensor:
        """The arena's working buffer (lane 0's) of a fixed ``retain scratch`` region, at its declared shape."""
        region = self.runtime.program.regions[name]
        return RegionStorage(region, self.runtime.arena.block(name, None), None).view()

    def session(
        self,
        prompt: PromptConditioning,
        seed: int = 0,
        base_on_host: bool = False,
        initial: Mapping[str, torch.Tensor] | None = None,
    ) -> CadenceToken2wavSession:
        """A session of ``prompt``'s voice; ``initial``: that voice's :meth:`voice_initial`, computed once and
        shared by the sessions of one voice (a turn's start only reads it)."""
        return CadenceToken2wavSession(self, prompt, seed, base_on_host, initial)

    def step_new_many(
        self, chunks: Mapping[CadenceToken2wavSession, torch.Tensor]
    ) -> dict[CadenceToken2wavSession, torch.Tensor]:
        """One planned chunk of each session (``new_tokens`` int32 [1, 25] on the device, as
        :meth:`CadenceToken2wavSession.step_new`), stepped together by ``Runtime.step_many``: sessions of
        different lanes run concurrently. Returns each session's pcm [1, samples] on the device."""
        outputs = self.runtime.step_many(
            {chunk_session.session: {"tokens": tokens} for chunk_session, tokens in chunks.items()}
        )
        for chunk_session in chunks:
            chunk_session._record(outputs[chunk_session.session], last=False)
        return {chunk_session: outputs[chunk_session.session] for chunk_session in chunks}


def load_runtime(
    tail: Token2wavTail,
    prompt_frames: int = 150,
    n_timesteps: int = 10,
    sessions: int = 1,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
    lanes: int = 1,
    istft: str = "captured",
    off_plan: Sequence[OffPlanStep] | None = None,
) -> Token2wavRuntime:
    """Bind ``step_audio2_token2wav.clock`` to ``tail`` (see the module docstring); the tail is the runtime's now.

    ``lanes``: sessions that :meth:`Token2wavRuntime.step_new_many` can run concurrently (see ``Runtime.load``).
    ``istft``: how ``hift_back`` runs HiFT's iSTFT (:class:`Token2wavHooks`).
    ``off_plan``: the turn boundaries captured ahead of time (default :func:`turn_boundaries`: a turn's end
    after chunks of 25 tokens)."""
    check_istft(istft)
    if "timestep_embedding" not in vars(tail.flow.decoder.estimator.t_embedder):  # not patched yet
        apply_constant_patches(tail)
    decoder = tail.flow.decoder
    capacity = estimator_cache_frames(prompt_frames, MAX_LAST_CHUNK_FRAMES)
    noise = decoder.rand_noise[:, :, :capacity].clone()
    layers = tail.config.encoder_blocks + tail.config.encoder_up_blocks
    program = load_program(CLOCK, {"P": str(prompt_frames), "steps": str(n_timesteps), "layers": str(layers)})
    if tail.float16:
        program = float16_program(program)
    owners = {"decoder": decoder, "estimator": decoder.estimator}
    stock_buffers = {name: owners[owner]._buffers[attribute] for name, (owner, attribute) in BUFFER_REGIONS.items()}
    for name, (owner, attribute) in BUFFER_REGIONS.items():
        region = program.regions[name]
        # shape and dtype only: the binding check compares them, then every firing binds the arena's views
        owners[owner]._buffers[attribute] = torch.empty(
            _fixed_shape(region), dtype=TORCH_DTYPES[region.dtype], device="meta"
        )
    hooks = Token2wavHooks(tail, istft)
    try:
        runtime = Runtime.load(
            program,
            tail,
            device=tail.device,
            hooks=hooks.as_dict(),
            sessions=sessions,
            graphs=graphs,
            max_graphs=max_graphs,
            lanes=lanes,
            off_plan=turn_boundaries() if off_plan is None else off_plan,
        )
    except Exception:
        for name, (owner, attribute) in BUFFER_REGIONS.items():
            owners[owner]._buffers[attribute] = stock_buffers[name]
        raise
    del stock_buffers
    return Token2wavRuntime(runtime, tail, hooks, prompt_frames, n_timesteps, noise)


@attrs.frozen
class ChunkCall:
    """One ``stream`` call of a session's buffer: the new tokens it takes (the 3 held as lookahead come from the
    session), and whether it is the turn's last (``Session.finish``)."""

    tokens: tuple[int, ...]
    last: bool

    @property
    def planned(self) -> bool:
        """A regular chunk (25 new tokens, not the last): an instant of the plan, steppable with others
        (:meth:`Token2wavRuntime.step_new_many`)."""
        return not self.last and len(self.tokens) == CHUNK_TOKENS


class CadenceToken2wavSession:
    """One MiniCPM-o duplex session on a runtime session; the interface of :class:`.stock.StockToken2wavSession`.

    ``push_tokens`` returns the waveform of each chunk as float32 [1, samples] on the CPU (stock's
    ``speech.cpu()``); :meth:`step_new` runs one planned chunk and returns it on the device.
    ``base_on_host`` keeps the voice's set-up state (what every turn starts from: 197 MiB at fp32,
    P = 150, n = 10) in pinned host memory instead of on the GPU (where MiniCPM-o keeps it); a
    turn's reset then copies it to the device. ``history`` records
    the new tokens of each chunk (stock's records hold the whole window).
    """

    def __init__(
        self,
        bound: Token2wavRuntime,
        prompt: PromptConditioning,
        seed: int = 0,
        base_on_host: bool = False,
        initial: Mapping[str, torch.Tensor] | None = None,
    ):
        self.bound = bound
        self.prompt = prompt
        self.session_seed = seed
        self.initial = dict(initial) if initial is not None else bound.voice_initial(prompt)
        if base_on_host and self.device.type == "cuda":
            self.initial = {name: value.cpu().pin_memory() for name, value in self.initial.items()}
        self.session: Session = bound.runtime.session(initial=self.initial, seed=seed)
        self.pending: list[int] = []
        """New tokens buffered beyond the 3 lookahead tokens the session holds."""
        self.chunk_count = 0
        self.turn_chunk_count = 0
        self.turn_finished = False
        self.history: list[ChunkRecord] = []

    @property
    def device(self) -> torch.device:
        return self.bound.tail.device

    def reset(self) -> None:
        """Start a new turn: the voice's set-up state, 3 silence tokens, the session's seed (addresses unchanged)."""
        self.session.reset()
        self.pending = []
        self.turn_chunk_count = 0
        self.turn_finished = False

    def close(self) -> None:
        self.session.close()

    def step_new(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """One planned chunk: ``new_tokens`` int32 [1, 25] on the device -> pcm [1, samples] on the device."""
        return self._run(new_tokens, last=False)

    def push_tokens(
        self, new_tokens: Sequence[int], flush: bool = False, end_of_turn: bool = False
    ) -> list[torch.Tensor]:
        """MiniCPM-o's buffer logic (:meth:`.stock.StockToken2wavSession.push_tokens`), one instant per ``stream`` call."""
        return [self.run_chunk(call) for call in self.chunk_calls(new_tokens, flush, end_of_turn)]

    def chunk_calls(self, new_tokens: Sequence[int], flush: bool = False, end_of_turn: bool = False) -> list[ChunkCall]:
        """The ``stream`` calls that MiniCPM-o's buffer logic makes of ``new_tokens``, in order (each to run with
        :meth:`run_chunk`); the tokens they take leave the buffer now."""
        if self.turn_finished:
            raise RuntimeError("the turn ended (end_of_turn); call reset() to start the next one")
        self.pending.extend(int(token) for token in new_tokens)
        calls: list[ChunkCall] = []
        if flush:
            while PRE_LOOKAHEAD_TOKENS + len(self.pending) >= FLUSH_MIN_TOKENS:
                count = min(CHUNK_TOKENS, len(self.pending))
                calls.append(ChunkCall(tuple(self.pending[:count]), last=False))
                self.pending = self.pending[count:]
        else:
            while len(self.pending) >= CHUNK_TOKENS:
                calls.append(ChunkCall(tuple(self.pending[:CHUNK_TOKENS]), last=False))
                self.pending = self.pending[CHUNK_TOKENS:]
        if end_of_turn:
            calls.append(ChunkCall(tuple(self.pending), last=True))
            self.pending = []
            self.turn_finished = True
        return calls

    def run_chunk(self, call: ChunkCall) -> torch.Tensor:
        """One ``stream`` call of :meth:`chunk_calls`: its audio, float32 [1, samples] on the CPU."""
        return self._run_host(list(call.tokens), call.last)

    def _run_host(self, tokens: list[int], last: bool) -> torch.Tensor:
        device_tokens = torch.tensor([tokens], dtype=torch.int32).reshape(1, len(tokens)).to(self.device)
        return self._run(device_tokens, last, tuple(tokens)).cpu()

    def _run(self, tokens: torch.Tensor, last: bool, new_tokens: tuple[int, ...] = ()) -> torch.Tensor:
        pcm = self.session.finish(tokens=tokens) if last else self.session.step(tokens=tokens)
        return self._record(pcm, last, new_tokens)

    def _record(self, pcm: torch.Tensor, last: bool, new_tokens: tuple[int, ...] = ()) -> torch.Tensor:
        self.history.append(ChunkRecord(self.chunk_count, self.turn_chunk_count, new_tokens, last, int(pcm.shape[-1])))
        self.chunk_count += 1
        self.turn_chunk_count += 1
        return pcm
