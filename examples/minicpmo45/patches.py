"""Value-identical patches that take host->device copies of constants out of the tail's per-chunk path.

Three constants are rebuilt on the host and copied to the device inside every stock chunk (each a
pageable H2D copy that synchronises the host with the stream, and that CUDA-graph capture refuses):

* ``TimestepEmbedder.timestep_embedding`` (stepaudio2/cosyvoice2/flow/decoder_dit.py): the 128
  sinusoid frequencies ``exp(-ln(10000) * arange(128) / 128)`` are computed on the CPU in float32
  and copied ``.to(t)`` at every DiT call, i.e. once per Euler step (10 or 5 per chunk);
* ``SineGen2.forward`` (stepaudio2/flashcosyvoice/modules/hifigan_components/layers.py): the
  harmonic multiplier ``torch.FloatTensor([[range(1, 10)]]).to(f0.device)``, once per chunk;
* ``HiFTGenerator.stft_window`` (stepaudio2/flashcosyvoice/modules/hifigan.py): a plain CPU
  attribute (not a buffer, so ``.to(device)`` of the module never moves it), copied
  ``.to(x.device)`` in ``_stft`` and in ``_istft``, twice per chunk.

Each patch computes the constant exactly as stock does (same CPU arithmetic, same conversion),
once, keeps it on the device, and is installed on module *instances* only (instance attributes
shadow the class's methods; nothing in the package is modified): :func:`apply_constant_patches`
and :func:`remove_constant_patches`. The results are equal to stock bit for bit (tests compare
with ``torch.equal``), including the order of the random draws in ``SineGen2``.

Not patchable this way: ``torch.istft`` itself synchronises (its NOLA check reads a value back to
the host inside ATen, once per call); the runtime's ``hift_back`` replaces the call by
:class:`.istft.InverseStft`, the same ATen operations with the fixed window checked once at load.
``Token2wav.stream`` builds the token tensors with ``torch.tensor(list, device='cuda')`` (two
pageable H2D copies) and ends with ``.cpu().numpy()``: the runtime feeds and collects them itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from duplexcadence.examples.minicpmo45.model import Token2wavTail

if TYPE_CHECKING:
    from duplexcadence.examples.minicpmo45.stepaudio2_types import CausalMaskedDiffWithXvec, SineGen2

TIMESTEP_MAX_PERIOD = 10_000


def stock_timestep_frequencies(dim: int, max_period: int = TIMESTEP_MAX_PERIOD) -> torch.Tensor:
    """The CPU float32 frequency vector ``TimestepEmbedder.timestep_embedding`` builds per call."""
    half = dim // 2
    return torch.exp(-math.log(max_period) * torch.arange(start=0, end=half) / half)


class DeviceTimestepEmbedding:
    """Stand-in for ``TimestepEmbedder.timestep_embedding`` with the frequencies cached per (device, dtype).

    Same arithmetic as stock: ``args = t[:, None] * freqs[None]``, then ``cat(cos, sin)`` (and a zero
    column for odd ``dim``), with ``freqs`` = the stock CPU vector converted ``.to(t)``.
    """

    def __init__(self) -> None:
        self._frequencies: dict[tuple[int, int, torch.device, torch.dtype], torch.Tensor] = {}

    def prepare(
        self, dim: int, device: torch.device, dtype: torch.dtype, max_period: int = TIMESTEP_MAX_PERIOD
    ) -> None:
        """Copy the frequency vector to ``device`` / ``dtype`` now (outside any graph capture)."""
        key = (dim, max_period, torch.device(device), dtype)
        if key not in self._frequencies:
            self._frequencies[key] = stock_timestep_frequencies(dim, max_period).to(device=device, dtype=dtype)

    def __call__(self, t: torch.Tensor, dim: int, max_period: int = TIMESTEP_MAX_PERIOD) -> torch.Tensor:
        self.prepare(dim, t.device, t.dtype, max_period)
        freqs = self._frequencies[(dim, max_period, t.device, t.dtype)]
        args = t[:, None] * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
        return embedding


def _sine_gen2_forward_with_device_multiplier(
    sine_gen: SineGen2, harmonic_multiplier: torch.Tensor
) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``SineGen2.forward`` with its harmonic multiplier [1, 1, harmonics + 1] already on the device.

    The same operations in the same order as stock, so the two draws (``torch.rand`` inside
    ``_f02sine``, then ``torch.randn_like``) consume the generator identically.
    """

    def forward(f0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        harmonic_f0 = torch.multiply(f0, harmonic_multiplier)
        sine_waves = sine_gen._f02sine(harmonic_f0) * sine_gen.sine_amp
        uv = sine_gen._f02uv(f0)
        noise_amp = uv * sine_gen.noise_std + (1 - uv) * sine_gen.sine_amp / 3
        noise = noise_amp * torch.randn_like(sine_waves)
        sine_waves = sine_waves * uv + noise
        return sine_waves, uv, noise

    return forward


@dataclass
class ConstantPatches:
    """What :func:`apply_constant_patches` changed, so :func:`remove_constant_patches` can undo it."""

    timestep_embedding: DeviceTimestepEmbedding
    sine_gen: SineGen2
    original_stft_window: torch.Tensor
    harmonic_multiplier: torch.Tensor
    installed: bool = field(default=True)


def apply_constant_patches(tail: Token2wavTail) -> ConstantPatches:
    """Install the three device-cached constants on the tail's module instances (values unchanged)."""
    device = tail.device
    t_embedder = tail.flow.decoder.estimator.t_embedder
    timestep_embedding = DeviceTimestepEmbedding()
    # t has the dtype of mu: the flow's parameter dtype, or float16 under the stock float16 autocast.
    timestep_dtype = torch.float16 if tail.float16 else next(tail.flow.parameters()).dtype
    timestep_embedding.prepare(t_embedder.frequency_embedding_size, device, timestep_dtype)
    t_embedder.timestep_embedding = timestep_embedding

    sine_gen = tail.hift.m_source.l_sin_gen
    harmonic_multiplier = torch.FloatTensor([[range(1, sine_gen.harmonic_num + 2)]]).to(device)
    sine_gen.forward = _sine_gen2_forward_with_device_multiplier(sine_gen, harmonic_multiplier)

    original_stft_window = tail.hift.stft_window
    tail.hift.stft_window = original_stft_window.to(device)
    return ConstantPatches(timestep_embedding, sine_gen, original_stft_window, harmonic_multiplier)


def remove_constant_patches(tail: Token2wavTail, patches: ConstantPatches) -> None:
    """Put the stock behaviour back (the instance attributes are deleted, the CPU window restored)."""
    if not patches.installed:
        return
    del tail.flow.decoder.estimator.t_embedder.timestep_embedding
    del patches.sine_gen.forward
    tail.hift.stft_window = patches.original_stft_window
    patches.installed = False


CARRIED_ESTIMATOR_FRAMES_AFTER_PROMPT = 100
"""``Token2wav.stream`` trims the carried DiT attention cache to P + 100 frames whenever it is longer."""
MAX_REGULAR_CHUNK_FRAMES = 50
"""A non-final ``stream`` call adds at most 2 x 25 mel frames (28 tokens minus 3 lookahead)."""
MAX_LAST_CHUNK_FRAMES = 54
"""A final ``stream(rest, last_chunk=True)`` gets up to 27 tokens (MiniCPM-o's regular loop leaves < 28) -> 54 frames."""


def estimator_cache_frames(prompt_frames: int, max_chunk_frames: int = MAX_LAST_CHUNK_FRAMES) -> int:
    """Frames the estimator attention buffers must hold: the carried P + 100 plus the largest chunk.

    P + 150 covers every regular and forced-flush chunk; a last chunk of up to 27 tokens needs
    P + 154 (with less, stock's buffer write ``[..., :L + 54, :] = new`` fails on the shape).
    """
    return prompt_frames + CARRIED_ESTIMATOR_FRAMES_AFTER_PROMPT + max_chunk_frames


def resize_estimator_cache_buffers(flow: CausalMaskedDiffWithXvec, ode_slots: int, capacity_frames: int) -> None:
    """Replace the CFM / DiT cache buffers by demand-sized zero buffers (same dtype and device).

    ``flow.decoder.att_cache_buffer`` [16, 16, 2, 8, 1000, 128] -> [ode_slots, 16, 2, 8, capacity, 128],
    ``flow.decoder.cnn_cache_buffer`` [16, 16, 2, 1024, 2] -> [ode_slots, 16, 2, 1024, 2] and
    ``flow.decoder.estimator.att_cache_buffer`` [16, 2, 8, 1000, 128] -> [16, 2, 8, capacity, 128].
    The stock code only ever indexes slot ``step - 1 < n_timesteps`` and frames ``< L + chunk``, so
    with ``ode_slots >= n_timesteps`` and ``capacity >= estimator_cache_frames(P)`` every value it
    computes is unchanged; what changes is the shape of the caches it returns and carries
    (``ode_slots`` instead of 16 slots). Call before ``setup_cache`` so the base caches get that shape.
    """
    decoder = flow.decoder
    estimator = decoder.estimator
    att = decoder.att_cache_buffer
    cnn = decoder.cnn_cache_buffer
    dit_att = estimator.att_cache_buffer
    decoder.att_cache_buffer = torch.zeros(
        (ode_slots, *att.shape[1:4], capacity_frames, att.shape[5]), dtype=att.dtype, device=att.device
    )
    decoder.cnn_cache_buffer = torch.zeros((ode_slots, *cnn.shape[1:]), dtype=cnn.dtype, device=cnn.device)
    estimator.att_cache_buffer = torch.zeros(
        (*dit_att.shape[:3], capacity_frames, dit_att.shape[4]), dtype=dit_att.dtype, device=dit_att.device
    )


def trim_rand_noise(flow: CausalMaskedDiffWithXvec, frames: int) -> None:
    """Keep only ``flow.decoder.rand_noise[:, :, :frames]`` (a copy, same values).

    The CFM reads the window ``[L, L + T)`` with L the absolute length of the carried DiT cache, so
    the first P frames (read by ``setup_cache``) stay and the buffer must reach the same
    ``estimator_cache_frames(P)`` as the attention buffers.
    """
    flow.decoder.rand_noise = flow.decoder.rand_noise[:, :, :frames].clone()


@dataclass
class StockBuffers:
    """The stock CFM / DiT buffers replaced by :func:`demand_size_buffers` (to put them back)."""

    att_cache_buffer: torch.Tensor
    cnn_cache_buffer: torch.Tensor
    estimator_att_cache_buffer: torch.Tensor
    rand_noise: torch.Tensor

    def restore(self, flow: CausalMaskedDiffWithXvec) -> None:
        decoder = flow.decoder
        decoder.att_cache_buffer = self.att_cache_buffer
        decoder.cnn_cache_buffer = self.cnn_cache_buffer
        decoder.estimator.att_cache_buffer = self.estimator_att_cache_buffer
        decoder.rand_noise = self.rand_noise


def demand_size_buffers(
    flow: CausalMaskedDiffWithXvec, n_timesteps: int, prompt_frames: int, max_chunk_frames: int = MAX_LAST_CHUNK_FRAMES
) -> StockBuffers:
    """Size the CFM / DiT buffers and the noise table for ``n_timesteps`` and a P-frame prompt; returns the stock ones.

    fp32, P = 150, n = 10: attention buffers 2000 + 125 MiB -> 380.0 + 38.0 MiB, noise 9.2 -> 0.1 MiB.
    """
    decoder = flow.decoder
    stock = StockBuffers(
        decoder.att_cache_buffer, decoder.cnn_cache_buffer, decoder.estimator.att_cache_buffer, decoder.rand_noise
    )
    frames = estimator_cache_frames(prompt_frames, max_chunk_frames)
    resize_estimator_cache_buffers(flow, ode_slots=n_timesteps, capacity_frames=frames)
    trim_rand_noise(flow, frames)
    return stock
