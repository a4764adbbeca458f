"""Transformer stacks stepped over the rows of many conversations, each row's keys and values in its own slot.

A call steps R *rows*, each a conversation (its slot of a :class:`.kv.SlotKV`) with Q new tokens: a decode step
of R conversations is Q = 1, a prefill of a second of audio embeddings of each is Q = 11. The linear layers see
exactly the R x Q tokens given and the attention reads exactly each row's valid entries (:mod:`.attention`):
nothing is padded. Each row's new keys and values are written after its slot's length; the caller then advances
the lengths (``SlotKV.advance``). A call leaves the lengths as they were, so calling it twice on the same inputs
writes the same entries: the warm-up calls before a graph capture change nothing.

Two architectures, chosen by name (:data:`STACKS`), both over the modules of a ``transformers`` model as built
(their parameters are used in place, never copied):

* ``llama``: the decoder layers of a Llama-family model (``LlamaModel``, ``Qwen3Model``: pre-norm, rotary
  positions, grouped KV heads, ``q_norm``/``k_norm`` where the layer has them), then its final norm; causal;
* ``whisper``: the layers of a ``WhisperEncoder`` over a cached past (the new frames see every cached frame and
  each other: not causal), the query scaled before the product as ``WhisperAttention`` does; no final norm.

The rows' slots and the lengths are device tensors and no shape depends on a value, so a call at a given R and
Q can be captured in a CUDA graph and replayed for any slots and lengths (:mod:`.rowgraphs`) when the attention
backend reads the lengths on the device. The caller keeps the host mirror of the lengths
(``SlotKV.host_lengths``) and checks a row has room before the call (``SlotKV.check_room``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from duplexcadence.interpreter.engine.attention import get
from duplexcadence.interpreter.engine.kv import SlotKV


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaStack:
    """A Llama-family decoder (``model.layers``, ``model.norm``, ``model.rotary_emb``) over rows of a SlotKV."""

    def __init__(self, model: Any, kv: SlotKV, backend: str) -> None:
        self.model = model
        self.kv = kv
        self.attention = get(backend)
        first = model.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scale = first.scaling
        self.qk_norm = hasattr(first, "q_norm")

    def __call__(self, embeds: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``embeds`` [R, Q, hidden] of the conversations in slots ``rows`` (int64 [R]) -> the final norm's output
        [R, Q, hidden]; every layer's keys and values written after the rows' lengths."""
        count, steps = embeds.shape[:2]
        kv = self.kv
        positions = kv.lengths[rows][:, None] + torch.arange(steps, device=embeds.device)
        cos, sin = self.model.rotary_emb(embeds, positions)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        hidden = embeds
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            normed = layer.input_layernorm(hidden)
            query = attn.q_proj(normed).view(count, steps, -1, self.head_dim)
            key = attn.k_proj(normed).view(count, steps, -1, self.head_dim)
            value = attn.v_proj(normed).view(count, steps, -1, self.head_dim)
            if self.qk_norm:
                query, key = attn.q_norm(query), attn.k_norm(key)
            query = query * cos + rotate_half(query) * sin
            key = key * cos + rotate_half(key) * sin
            kv.write(index, rows, key, value)
            out = self.attention(
                query, kv.keys[index], kv.values[index], rows, kv.lengths, causal=True, scale=self.scale
            )
            hidden = hidden + attn.o_proj(out.reshape(count, steps, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.norm(hidden)


class WhisperStack:
    """A ``WhisperEncoder``'s layers over a cached past, on rows of a SlotKV (its positions embedded by the
    caller: they are the row's cached length onwards)."""

    def __init__(self, encoder: Any, kv: SlotKV, backend: str) -> None:
        self.encoder = encoder
        self.kv = kv
        self.attention = get(backend)
        first = encoder.layers[0].self_attn
        self.heads = first.num_heads
        self.head_dim = first.head_dim
        self.scale = first.scaling

    def __call__(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``hidden`` [R, Q, d_model] -> the layers' output [R, Q, d_model] (before the encoder's final layer
        norm); every layer's keys and values written after the rows' lengths."""
        count, steps, width = hidden.shape
        kv = self.kv
        for index, layer in enumerate(self.encoder.layers):
            attn = layer.self_attn
            normed = layer.self_attn_layer_norm(hidden)
            query = (attn.q_proj(normed) * self.scale).view(count, steps, self.heads, self.head_dim)
            key = attn.k_proj(normed).view(count, steps, self.heads, self.head_dim)
            value = attn.v_proj(normed).view(count, steps, self.heads, self.head_dim)
            kv.write(index, rows, key, value)
            out = self.attention(query, kv.keys[index], kv.values[index], rows, kv.lengths, causal=False, scale=1.0)
            hidden = hidden + attn.out_proj(out.reshape(count, steps, width))
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        return hidden


STACKS: dict[str, Callable[..., Any]] = {"llama": LlamaStack, "whisper": WhisperStack}
"""The architectures a stack steps, by name."""
