"""A toy streaming audio encoder whose state lives in a cache object the stock call takes and returns.

Per 80 ms frame: 16 audio samples [B, 1, 16] -> a causal conv whose padding is replicate (its history starts
as copies of the first column it ever sees) -> a 1x1 conv and a strided conv (kernel = stride), whose cache
entries are always empty -> 2 latent steps -> a sliding-window attention whose KV cache grows by `torch.cat`
until it holds the window, with rotary positions and the warm-up mask from a host-side step counter (+2 per
call) -> 2 codes per frame.

It is written the way such stock code is written: `encode(pcm, cache)` returns the outputs and the cache,
a new `EncoderCache` each call (`convs`: one padding cache per conv, None before the first call; `keys`,
`values`; `step`, a Python int). `EncoderStockStream` is its stock streaming loop; `encoder.clock` declares
the same state (drafted with `dsl draft duplexcadence.examples.toy.encoder:stock_loop`, then reviewed).
It follows no upstream file.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn

SAMPLES = 16  # audio samples per frame
STEPS = 2  # latent steps per frame (the strided conv's stride is SAMPLES / STEPS)


@attrs.define
class EncoderCache:
    """What the stock call takes and returns: one padding cache per conv (None before the first call), the
    attention's keys and values (None before the first call), the step counter."""

    convs: list = attrs.field(factory=lambda: [None, None, None])
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    step: int = 0


class PaddedConv(nn.Module):
    """A causal conv that streams: it keeps the last `kernel - stride` input columns; before its first call its
    history is `replicate` copies of the first column it sees (or zeros)."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int, stride: int = 1, replicate: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(channels_in, channels_out, kernel, stride)
        self.context = kernel - stride
        self.replicate = replicate

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if cache is None:
            first = x[..., :1] if self.replicate else torch.zeros_like(x[..., :1])
            cache = first.expand(-1, -1, self.context)
        padded = torch.cat([cache, x], dim=-1)
        return self.conv(padded), padded[..., padded.shape[-1] - self.context :]


class RotaryWindowAttention(nn.Module):
    """New steps attend over the cached keys (at most `window`) and themselves; rotary positions from `step`."""

    inverse_frequency: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, channels: int, heads: int, window: int):
        super().__init__()
        self.qkv = nn.Linear(channels, 3 * channels)
        self.out = nn.Linear(channels, channels)
        self.heads, self.window = heads, window
        half = channels // heads // 2
        self.register_buffer("inverse_frequency", 1.0 / (100.0 ** (torch.arange(half, dtype=torch.float32) / half)))

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None].float() * self.inverse_frequency  # [T, half]
        cos, sin = angles.cos(), angles.sin()
        first, second = x.chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)

    def forward(self, x, keys, values, step: int):
        batch, channels, steps = x.shape
        qkv = self.qkv(x.transpose(1, 2)).view(batch, steps, 3, self.heads, channels // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [B, heads, T, head_dim]
        positions = step + torch.arange(steps, device=x.device)
        q, k = self.rotate(q, positions), self.rotate(k, positions)
        cached = min(step, self.window)  # the warm-up geometry, from the host counter
        if keys is not None:
            k, v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        mask = torch.ones(steps, cached + steps, dtype=torch.bool, device=x.device).tril(diagonal=cached)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.out(y.transpose(1, 2).reshape(batch, steps, channels)).transpose(1, 2)
        return x + y, k[:, :, -self.window :], v[:, :, -self.window :]


class StreamingEncoder(nn.Module):
    """pcm [B, 1, 16] per frame -> latent [B, C, 2] and codes [B, 2], through `encode(pcm, cache)`."""

    def __init__(self, channels: int = 8, heads: int = 2, window: int = 6, codebook: int = 32):
        super().__init__()
        self.convs = nn.ModuleList(
            [
                PaddedConv(1, channels, 3, replicate=True),
                PaddedConv(channels, channels, 1),
                PaddedConv(channels, channels, SAMPLES // STEPS, stride=SAMPLES // STEPS),
            ]
        )
        self.attention = RotaryWindowAttention(channels, heads, window)
        self.codebook = nn.Linear(channels, codebook)

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, cache: EncoderCache) -> tuple[torch.Tensor, torch.Tensor, EncoderCache]:
        x = pcm
        convs = []
        for conv, conv_cache in zip(self.convs, cache.convs):
            x, conv_cache = conv(x, conv_cache)
            x = F.elu(x)
            convs.append(conv_cache)
        latent, keys, values = self.attention(x, cache.keys, cache.values, cache.step)
        codes = self.codebook(latent.transpose(1, 2)).argmax(dim=-1)
        return latent, codes, EncoderCache(convs, keys, values, cache.step + STEPS)


def build_encoder(seed: int = 0, device: str | torch.device = "cpu") -> StreamingEncoder:
    """The encoder with seeded random weights."""
    torch.manual_seed(seed)
    return StreamingEncoder().to(device).eval()


def new_cache(model: StreamingEncoder) -> EncoderCache:
    """The cache a stream starts with (the factory `encoder.clock` names)."""
    return EncoderCache()


class EncoderStockStream:
    """The stock streaming loop: one frame of pcm [B, 1, 16] in, {"latent", "codes"} out; the cache is kept
    here, passed to `encode` and replaced by what it returns."""

    def __init__(self, model: StreamingEncoder):
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache(self.model)

    def step(self, pcm: torch.Tensor) -> dict[str, torch.Tensor]:
        latent, codes, self.cache = self.model.encode(pcm, self.cache)
        return {"latent": latent, "codes": codes}


def make_audio(frames: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    """Seeded audio, [batch, 1, frames * 16]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 1, frames * SAMPLES, generator=generator)


def stock_loop(frames: str = "24"):
    """The stock loop for `dsl draft duplexcadence.examples.toy.encoder:stock_loop`: the cache is
    caller-owned state, handed to the step and back."""
    from duplexcadence.interpreter.draft.loop import StockLoop

    model = build_encoder()
    audio = make_audio(int(frames))

    def step(cache: EncoderCache, pcm: torch.Tensor):
        latent, codes, cache = model.encode(pcm, cache)
        return (latent, codes), cache

    return StockLoop(
        model=model,
        step=step,
        feed=lambda t: {"pcm": audio[..., t * SAMPLES : (t + 1) * SAMPLES]},
        rate=200,
        state=new_cache(model),
        handback=True,
        outputs=("latent", "codes"),
    )
