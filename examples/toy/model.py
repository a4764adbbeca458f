"""A toy streaming token-to-audio tail written the way stock streaming code is written.

Per 80 ms frame: codes [B, 1] -> embedding -> causal conv (its carry rebuilt with `torch.cat`
every tick, PersonaPlex style) -> attention over a KV cache that keeps a pinned prompt plus a
window of recent frames, grown with `torch.cat` and trimmed (Step-Audio2 style) -> a transposed
conv whose overlap tail is updated in place (moshi style) -> plus a random draw (HiFT style).
`ToyStockStream` is its stock eager streaming loop; `toy.clock` declares the same state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from duplexcadence.interpreter.runtime.rng import RNG_LOCK


class CausalConv(nn.Module):
    """A causal conv whose carry `self.carry` is None at start and rebuilt by torch.cat every call."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel)
        self.kernel = kernel
        self.carry: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.carry is None or self.carry.shape[-1] == 0:
            padded = torch.cat([torch.zeros(*x.shape[:-1], self.kernel - 1, dtype=x.dtype, device=x.device), x], -1)
        else:
            padded = torch.cat([self.carry, x], dim=-1)
        self.carry = padded[..., -(self.kernel - 1) :]
        return torch.tanh(self.conv(padded))


class Encoder(nn.Module):
    def __init__(self, vocab: int, channels: int, kernel: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, channels)
        self.conv = CausalConv(channels, kernel)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.embed(codes).transpose(1, 2)  # [B, C, T]
        return self.conv(x)


class WindowAttention(nn.Module):
    """Attention of the new frames over `cache` = keys/values of a pinned prompt + recent frames."""

    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(channels, 3 * channels)
        self.out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, C, T]; cache [2, B, H, L, D] -> (y [B, C, T], new cache [2, B, H, L+T, D], untrimmed)."""
        batch, channels, steps = x.shape
        q, k, v = self.qkv(x.transpose(1, 2)).chunk(3, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, steps, self.heads, channels // self.heads).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        keys = torch.cat([cache[0], k], dim=2)
        values = torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, keys, values)
        y = self.out(y.transpose(1, 2).reshape(batch, steps, channels)).transpose(1, 2)
        return y, torch.stack([keys, values])


class OverlapUpsample(nn.Module):
    """ConvTranspose1d(k=4, s=2) streamed with an overlap tail `partial` updated in place, plus noise."""

    def __init__(self, channels: int, out_channels: int, noise: float = 0.01):
        super().__init__()
        self.convtr = nn.ConvTranspose1d(channels, out_channels, 4, 2)
        self.partial = torch.zeros(1, out_channels, 2)
        self.noise = noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.convtr(x)  # [B, out, 2T + 2]
        assert self.convtr.bias is not None  # built with nn.ConvTranspose1d's default bias=True
        bias = self.convtr.bias[:, None]
        head = y[..., :2] + self.partial
        out = torch.cat([head, y[..., 2:-2]], dim=-1)
        self.partial.copy_(y[..., -2:] - bias)
        return out + self.noise * torch.randn_like(out)


class ToyTail(nn.Module):
    """The whole tail: encoder -> window attention -> overlap upsample."""

    def __init__(self, vocab: int = 64, channels: int = 32, heads: int = 4, kernel: int = 3, out_channels: int = 4):
        super().__init__()
        self.encoder = Encoder(vocab, channels, kernel)
        self.attention = WindowAttention(channels, heads)
        self.upsample = OverlapUpsample(channels, out_channels)
        self.heads = heads
        self.head_dim = channels // heads


def build_toy(seed: int = 0, device: str | torch.device = "cpu", batch: int = 1, **sizes) -> ToyTail:
    """The toy tail with weights drawn under `torch.manual_seed(seed)`; the caller's global RNG state is
    left as it was (the tail's random draw at each step reads it). The runtime's `RNG_LOCK` is held meanwhile,
    so that a runtime stepped by another thread does not draw from the generator while it is reseeded."""
    with RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ToyTail(**sizes)
    model = model.to(device).eval()
    model.upsample.partial = torch.zeros(batch, model.upsample.convtr.out_channels, 2, device=device)
    return model


def make_prompt(model: ToyTail, prompt: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    """A prompt's keys and values [2, B, H, prompt, D], as a voice-prompt set-up would produce."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    return torch.randn(2, batch, model.heads, prompt, model.head_dim, generator=generator).to(device)


class ToyStockStream:
    """The stock eager streaming loop: state in Python attributes, grown and trimmed with torch.cat."""

    def __init__(self, model: ToyTail, prompt_cache: torch.Tensor, window: int):
        self.model = model
        self.prompt_cache = prompt_cache
        self.prompt = prompt_cache.shape[3]
        self.window = window
        self.reset()

    def reset(self) -> None:
        self.model.encoder.conv.carry = None
        self.model.upsample.partial.zero_()
        self.cache = self.prompt_cache.clone()

    @torch.no_grad()
    def step(self, codes: torch.Tensor) -> torch.Tensor:
        hidden = self.model.encoder(codes)
        attended, cache = self.model.attention(hidden, self.cache)
        if cache.shape[3] > self.prompt + self.window:  # keep the prompt and the newest `window` frames
            cache = torch.cat([cache[:, :, :, : self.prompt], cache[:, :, :, -self.window :]], dim=3)
        self.cache = cache
        return self.model.upsample(attended)
