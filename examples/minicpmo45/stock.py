"""Stock streaming of MiniCPM-o 4.5's token-to-audio tail: the package's own ``Token2wav.stream``, unmodified.

What MiniCPM-o 4.5 does per duplex session (OpenBMB MiniCPM-o / MiniCPM-o-Demo
``MiniCPMODuplex._init_token2wav_cache``, ``_reset_token2wav_for_new_turn``,
``_generate_waveform_from_tokens`` in ``MiniCPMO45/modeling_minicpmo.py``):

* once per voice: ``Token2wav.set_stream_cache(prompt_wav)`` runs the front end, then
  ``flow.setup_cache(prompt tokens + three silence tokens 4218, prompt mels, speaker embedding,
  n_timesteps)`` (a full encoder pass and an n-step ODE over the P prompt mel frames) and returns
  ``(stream_cache, hift_cache_dict)``; MiniCPM-o keeps clones of both as the base caches;
* at every turn start: ``stream_cache`` / ``hift_cache_dict`` = fresh clones of the base caches and
  the token buffer = ``[4218] * 3``;
* per TTS step the new speech tokens are appended to the buffer; while it holds >= 28 tokens,
  ``stream(buffer[:28])`` (25 new + 3 lookahead) and drop the first 25; on a chunk-eos or forced
  flush, while it holds >= 8: ``stream(buffer[:min(28, len)])`` and drop ``min(25, len - 3)``; at the
  end of the turn ``stream(rest, last_chunk=True)``.

:class:`StockToken2wavSession` reproduces that around a ``Token2wav`` object built without
``__init__`` (which would load the onnx front end and checkpoints and call ``.cuda()``): the
attributes ``__init__`` sets are set directly, the front-end output (``Token2wav.cache``) is a
:class:`~.model.PromptConditioning`, and :func:`setup_stream_caches` repeats the lines of
``set_stream_cache`` after the front end. Each chunk calls the package's ``Token2wav.stream``
code object unmodified. On a CUDA device it is the method itself; on any other device it runs with
a copy of its module globals whose ``torch.tensor(..., device='cuda')`` lands on the tail's device
(the only two device-specific lines of ``stream``, token2wav.py:180-181); its
``torch.amp.autocast("cuda", ...)`` then disables itself with a warning (suppressed here), which for
float32 changes nothing. float16 runs only on CUDA.

Randomness (the seeding contract). ``flow.decoder.rand_noise`` is fixed at construction
(:func:`~.model.build_tail` seeds torch). HiFT draws three tensors per ``stream`` call from the
default generator of the tail's device: ``torch.rand`` of the initial harmonic phases [1, 9] in
``SineGen2._f02sine``, ``torch.randn_like`` of the harmonic noise [1, T, 9] in ``SineGen2.forward``
and ``torch.randn_like`` of the noise branch [1, T, 1] in ``SourceModuleHnNSF2.forward``, in that
order (T = 480 x HiFT input frames). Each session keeps its own generator state: seeded with
``session_seed`` when the session starts and at every :meth:`~StockToken2wavSession.reset` (turn
start), installed in that generator around every ``stream`` call and saved back after it, so it
is carried from chunk to chunk of a turn. A session's draws therefore depend only on its seed and
its own chunks, never on other sessions, and the process's global generator is left as it was.
This is the DuplexCadence runtime's per-session RNG (``Runtime.session(seed=...)``: seeded at
session start and at ``reset``, installed around each firing of an ``rng`` stage).
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from duplexcadence.examples.minicpmo45.model import (
    PRE_LOOKAHEAD_TOKENS,
    SILENCE_TOKEN,
    PromptConditioning,
    Token2wavTail,
)
from duplexcadence.examples.minicpmo45.package import load_stepaudio2

CHUNK_TOKENS = 25
"""New tokens per 1 s chunk (``CHUNK_SIZE`` in ``_generate_waveform_from_tokens``)."""
WINDOW_TOKENS = CHUNK_TOKENS + PRE_LOOKAHEAD_TOKENS
"""Tokens per regular ``stream`` call: 25 new + 3 lookahead."""
FLUSH_MIN_TOKENS = PRE_LOOKAHEAD_TOKENS + 5
"""A forced flush keeps calling ``stream`` while the buffer holds at least this many tokens."""
MEL_CACHE_FRAMES = 8
"""``Token2wav.mel_cache_len`` (hard-coded, 160 ms)."""
SOURCE_CACHE_SAMPLES = MEL_CACHE_FRAMES * 480
"""``Token2wav.source_cache_len`` = 3840 samples, also the held-back tail and half the Hamming window."""
FIRST_CHUNK_SAMPLES = 50 * 480 - SOURCE_CACHE_SAMPLES
STEADY_CHUNK_SAMPLES = 50 * 480


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    if device.type == "cpu":
        return torch.default_generator
    raise ValueError(f"no default generator handled for device type {device.type!r}")


def seeded_generator_state(device: torch.device, seed: int) -> torch.Tensor:
    """The state of ``device``'s default generator right after ``manual_seed(seed)`` (the generator is left as it was)."""
    generator = _default_generator(device)
    saved_state = generator.get_state()
    generator.manual_seed(seed)
    state = generator.get_state()
    generator.set_state(saved_state)
    return state


@contextmanager
def installed_generator_state(device: torch.device, state: torch.Tensor) -> Iterator[list[torch.Tensor]]:
    """Install ``state`` in the default generator of ``device`` for the block; yields a one-item list that
    holds the generator's state at the end of the block; the previous state is put back."""
    generator = _default_generator(device)
    saved_state = generator.get_state()
    generator.set_state(state)
    carried = [state]
    try:
        yield carried
    finally:
        carried[0] = generator.get_state()
        generator.set_state(saved_state)


@contextmanager
def seeded_device_generator(device: torch.device, seed: int) -> Iterator[None]:
    """Seed the default generator of ``device`` for the block, then put its previous state back."""
    with installed_generator_state(device, seeded_generator_state(device, seed)):
        yield


def expected_chunk_samples(window_tokens: int, first_in_turn: bool, last_chunk: bool) -> int:
    """Samples one ``stream`` call returns for ``window_tokens`` tokens (the shape rule of ``Token2wav.stream``).

    A non-last call turns ``window_tokens - 3`` tokens into twice as many mel frames; HiFT runs on
    them plus the 8 cached mel frames (none at turn start) at 480 samples per frame; the last 3840
    samples are held back for the next cross-fade. A last call pads 3 zero lookahead frames, so all
    its tokens become frames, and holds nothing back.
    """
    new_frames = 2 * (window_tokens if last_chunk else window_tokens - PRE_LOOKAHEAD_TOKENS)
    cached_frames = 0 if first_in_turn else MEL_CACHE_FRAMES
    samples = (new_frames + cached_frames) * 480
    return samples if last_chunk else samples - SOURCE_CACHE_SAMPLES


class _TorchOnDevice(types.ModuleType):
    """``torch`` as seen by ``Token2wav.stream`` off CUDA: ``torch.tensor(..., device='cuda')`` lands on ``device``."""

    def __init__(self, device: torch.device) -> None:
        super().__init__("torch")
        self._target_device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def tensor(self, data: Any, *, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if device is not None and torch.device(device).type == "cuda":
            device = self._target_device
        return torch.tensor(data, device=device, **kwargs)


def stock_stream_function(device: torch.device) -> types.FunctionType:
    """The package's ``Token2wav.stream`` for a tail on ``device`` (the method itself on CUDA)."""
    token2wav = load_stepaudio2().token2wav
    stream = token2wav.Token2wav.stream
    if device.type == "cuda":
        return stream
    stream_globals = dict(vars(token2wav))
    stream_globals["torch"] = _TorchOnDevice(device)
    return types.FunctionType(stream.__code__, stream_globals, stream.__name__, stream.__defaults__, stream.__closure__)


def make_token2wav(tail: Token2wavTail, prompt: PromptConditioning, n_timesteps: int) -> Any:
    """A ``stepaudio2.token2wav.Token2wav`` built without ``__init__``, with the attributes ``__init__`` sets.

    ``audio_tokenizer`` and ``spk_model`` (front end) are absent; ``cache`` holds the prompt
    conditioning that ``_prepare_prompt`` would return; ``stream_cache`` starts as None.
    """
    token2wav_class = load_stepaudio2().token2wav.Token2wav
    token2wav = token2wav_class.__new__(token2wav_class)
    token2wav.float16 = tail.float16
    token2wav.n_timesteps = n_timesteps
    token2wav.flow = tail.flow
    token2wav.hift = tail.hift
    token2wav.cache = prompt.as_token2wav_cache()
    token2wav.stream_cache = None
    token2wav.mel_cache_len = MEL_CACHE_FRAMES
    token2wav.source_cache_len = SOURCE_CACHE_SAMPLES
    token2wav.speech_window = torch.from_numpy(np.hamming(2 * SOURCE_CACHE_SAMPLES)).to(tail.device)
    token2wav.hift_cache_dict = {}
    return token2wav


def setup_stream_caches(
    tail: Token2wavTail, prompt: PromptConditioning, n_timesteps: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What ``Token2wav.set_stream_cache`` returns after its front end: ``(stream_cache, hift_cache_dict)``.

    The flow caches alias module buffers (``estimator_cnn_cache`` is ``flow.decoder.cnn_cache_buffer``,
    ``estimator_att_cache`` a view of ``flow.decoder.att_cache_buffer``): clone before keeping them.
    With ``float16`` the call runs under the same autocast ``stream`` uses (stock ``set_stream_cache``
    calls ``setup_cache`` without it and fails on float16 weights).
    """
    silence = (
        torch.ones(1, PRE_LOOKAHEAD_TOKENS, device=prompt.tokens.device, dtype=prompt.tokens.dtype) * SILENCE_TOKEN
    )
    tokens = torch.cat([prompt.tokens, silence], dim=1)
    with torch.amp.autocast("cuda", dtype=torch.float16, enabled=tail.float16):
        flow_cache = tail.flow.setup_cache(tokens, prompt.mels, prompt.speaker_embedding, n_timesteps=n_timesteps)
    hift_cache = dict(
        mel=torch.zeros(1, prompt.mels.shape[2], 0, device=tail.device),
        source=torch.zeros(1, 1, 0, device=tail.device),
        speech=torch.zeros(1, 0, device=tail.device),
    )
    return flow_cache, hift_cache


def clone_recursive(value: Any) -> Any:
    """Clone every tensor in nested dicts / lists / tuples (MiniCPM-o's ``torch_clone_recursive``)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: clone_recursive(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_recursive(item) for item in value)
    return value


def _shares_storage(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    return tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


@dataclass
class ChunkRecord:
    """One ``stream`` call made by a session."""

    chunk_index: int
    """Index since the session was created."""
    turn_chunk_index: int
    """Index within the current turn (0 = first chunk after ``reset``)."""
    tokens: tuple[int, ...]
    last_chunk: bool
    samples: int


@dataclass
class StockToken2wavSession:
    """One MiniCPM-o duplex session over the stock tail: base caches, per-turn reset, the token buffer.

    The stock ``Token2wav`` is single-session: after chunks 0 and 1 of a turn its carried
    ``estimator_att_cache`` is a view of ``flow.decoder.att_cache_buffer`` and
    ``estimator_cnn_cache`` is always ``flow.decoder.cnn_cache_buffer``. With ``own_caches`` the
    session clones those two after every chunk (values unchanged), so several sessions may share
    one tail and be served in turn.
    """

    tail: Token2wavTail = field(repr=False)
    prompt: PromptConditioning = field(repr=False)
    n_timesteps: int = 10
    session_seed: int = 0
    own_caches: bool = False
    token2wav: Any = field(init=False, repr=False)
    base_flow_cache: dict[str, torch.Tensor] = field(init=False, repr=False)
    base_hift_cache: dict[str, torch.Tensor] = field(init=False, repr=False)
    token_buffer: list[int] = field(init=False)
    chunk_count: int = field(init=False, default=0)
    turn_chunk_count: int = field(init=False, default=0)
    rng_state: torch.Tensor = field(init=False, repr=False)
    """The session's generator state, carried from chunk to chunk (see the module docstring)."""
    history: list[ChunkRecord] = field(init=False, default_factory=list, repr=False)
    _stream: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.tail.float16 and self.tail.device.type != "cuda":
            raise ValueError("the float16 tail runs under CUDA autocast: use a CUDA device")
        self.token2wav = make_token2wav(self.tail, self.prompt, self.n_timesteps)
        self._stream = types.MethodType(stock_stream_function(self.tail.device), self.token2wav)
        with torch.no_grad():
            flow_cache, hift_cache = setup_stream_caches(self.tail, self.prompt, self.n_timesteps)
        self.base_flow_cache = clone_recursive(flow_cache)
        self.base_hift_cache = clone_recursive(hift_cache)
        self.reset()

    @property
    def prompt_frames(self) -> int:
        return self.prompt.prompt_frames

    @property
    def stream_cache(self) -> dict[str, torch.Tensor]:
        """The carried flow caches (``Token2wav.stream_cache``)."""
        return self.token2wav.stream_cache

    @property
    def hift_cache(self) -> dict[str, torch.Tensor]:
        """The carried HiFT caches (``Token2wav.hift_cache_dict``)."""
        return self.token2wav.hift_cache_dict

    def reset(self) -> None:
        """Start a new turn: fresh clones of the base caches, the buffer primed with three silence tokens,
        the generator state seeded again with ``session_seed``."""
        self.token2wav.stream_cache = clone_recursive(self.base_flow_cache)
        self.token2wav.hift_cache_dict = clone_recursive(self.base_hift_cache)
        self.token_buffer = [SILENCE_TOKEN] * PRE_LOOKAHEAD_TOKENS
        self.turn_chunk_count = 0
        self.rng_state = seeded_generator_state(self.tail.device, self.session_seed)

    def stream_chunk(self, tokens: Sequence[int], last_chunk: bool = False) -> torch.Tensor:
        """One stock ``Token2wav.stream(tokens, None, last_chunk, return_waveform=True)`` call -> float32 [1, samples] (CPU)."""
        token_list = [int(token) for token in tokens]
        with (
            torch.no_grad(),
            installed_generator_state(self.tail.device, self.rng_state) as carried,
            warnings.catch_warnings(),
        ):
            warnings.filterwarnings("ignore", message=".*CUDA is not available.*Disabling autocast.*")
            waveform = self._stream(token_list, None, last_chunk=last_chunk, return_waveform=True)
        self.rng_state = carried[0]
        if self.own_caches:
            self._detach_from_module_buffers()
        audio = torch.from_numpy(waveform)
        self.history.append(
            ChunkRecord(self.chunk_count, self.turn_chunk_count, tuple(token_list), last_chunk, int(audio.shape[-1]))
        )
        self.chunk_count += 1
        self.turn_chunk_count += 1
        return audio

    def step(self, window: Sequence[int]) -> torch.Tensor:
        """One regular 1 s chunk: exactly 28 tokens (25 new + 3 lookahead) -> 20 160 samples first, then 24 000."""
        if len(window) != WINDOW_TOKENS:
            raise ValueError(f"a regular chunk is {WINDOW_TOKENS} tokens, got {len(window)}")
        return self.stream_chunk(window)

    def push_tokens(
        self, new_tokens: Sequence[int], flush: bool = False, end_of_turn: bool = False
    ) -> list[torch.Tensor]:
        """MiniCPM-o's ``_generate_waveform_from_tokens`` buffer logic; returns the waveform of each ``stream`` call.

        ``flush`` stands for "the new tokens hold a chunk-eos, or force_flush"; ``end_of_turn`` for
        ``is_last_chunk``. MiniCPM-o then joins the chunks as int16 PCM and left-pads a non-final
        result shorter than 1 s with zeros; that host-side packaging is not reproduced here.
        Call :meth:`reset` to start the next turn (MiniCPM-o does it at the turn boundary).
        """
        self.token_buffer.extend(int(token) for token in new_tokens)
        chunks: list[torch.Tensor] = []
        if flush:
            while len(self.token_buffer) >= FLUSH_MIN_TOKENS:
                window_length = min(WINDOW_TOKENS, len(self.token_buffer))
                chunks.append(self.stream_chunk(self.token_buffer[:window_length]))
                self.token_buffer = self.token_buffer[min(CHUNK_TOKENS, window_length - PRE_LOOKAHEAD_TOKENS) :]
        else:
            while len(self.token_buffer) >= WINDOW_TOKENS:
                chunks.append(self.stream_chunk(self.token_buffer[:WINDOW_TOKENS]))
                self.token_buffer = self.token_buffer[CHUNK_TOKENS:]
        if end_of_turn and self.token_buffer:
            chunks.append(self.stream_chunk(self.token_buffer, last_chunk=True))
            self.token_buffer = []
        return chunks

    def _detach_from_module_buffers(self) -> None:
        decoder = self.tail.flow.decoder
        cache = self.token2wav.stream_cache
        for key, buffer in (
            ("estimator_cnn_cache", decoder.cnn_cache_buffer),
            ("estimator_att_cache", decoder.att_cache_buffer),
        ):
            if _shares_storage(cache[key], buffer):
                cache[key] = cache[key].clone()


class StockTurnStream:
    """One turn of a :class:`StockToken2wavSession` stepped a second at a time, for a comparison with
    one offline call: ``step(tokens)`` pushes a second's new tokens (int ``[1, n]``), ``finish(tokens)``
    pushes the last ones and ends the turn; each returns the waveform of the ``stream`` calls it made,
    joined (float32 ``[1, samples]``, CPU)."""

    def __init__(self, session: StockToken2wavSession) -> None:
        self.session = session

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._joined(self.session.push_tokens(tokens.flatten().tolist()))

    def finish(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._joined(self.session.push_tokens(tokens.flatten().tolist(), end_of_turn=True))

    @staticmethod
    def _joined(chunks: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(chunks, dim=-1) if chunks else torch.zeros(1, 0)


@torch.no_grad()
def offline_token2wav(
    tail: Token2wavTail, prompt: PromptConditioning, tokens: torch.Tensor, n_timesteps: int = 10, seed: int = 0
) -> torch.Tensor:
    """One whole-turn decode, the offline call a stream is compared with: what ``Token2wav.__call__``
    computes (``flow.inference`` over the prompt and every token, then HiFT on all the mel frames), on
    the tail's device, without its wav packaging. ``tokens`` int ``[1, N]`` are the turn's tokens, the
    three silence tokens it is primed with first (as the stream decodes them); returns float32
    ``[1, N * 960]`` on the CPU. HiFT's random draws come from the device's default generator seeded
    with ``seed`` (they cannot be the stream's: it draws per chunk). ``tail`` must be a tail no runtime
    has bound (a runtime trims its noise table to the chunks it plans)."""
    prompt_tokens, prompt_lens, speaker, prompt_mels, prompt_mels_lens = prompt.as_token2wav_cache()
    token = tokens.to(device=tail.device, dtype=torch.int32)
    token_lens = torch.tensor([token.shape[1]], dtype=torch.int32, device=tail.device)
    with torch.amp.autocast("cuda", dtype=torch.float16, enabled=tail.float16):
        mel = tail.flow.inference(
            token, token_lens, prompt_tokens, prompt_lens, prompt_mels, prompt_mels_lens, speaker, n_timesteps
        )
    with seeded_device_generator(tail.device, seed):
        wav, _ = tail.hift(speech_feat=mel.float())
    return wav.float().cpu()
