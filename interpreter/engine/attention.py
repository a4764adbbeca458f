"""Attention of a step's new tokens over each row's exact cache length, by backend name.

    attend = get(default_backend(device))
    out = attend(q, kv.keys[layer], kv.values[layer], rows, kv.lengths, causal=True, scale=head_dim**-0.5)

`q` is [R, Q, heads, head_dim]: Q new tokens of each of R rows (conversations). `keys` and `values` are a
`SlotKV` layer, [slots, kv_heads, capacity, head_dim]; row r reads slot `rows[r]` (`rows`: int64 [R]), which
holds `lengths[rows[r]]` entries from before the step (`lengths`: int64 [slots]) followed by the step's Q
entries, already written (`SlotKV.write`). Query head h reads KV head `h // (heads // kv_heads)`: the grouped
heads are read as stored, never repeated. Causal: query j of a row, at position `lengths[slot] + j`, sees the
keys up to its own position; not causal: every one of the row's `lengths[slot] + Q` keys (an encoder over its
cached past and a new chunk). Nothing past a row's length is read. The result is [R, Q, heads, head_dim] in
`q`'s dtype.

Backends, by name (`BACKENDS`; `get(name)` imports only the one asked for):

* `torch`: the reference, on any device: `scaled_dot_product_attention(..., enable_gqa=True)` row by row
  over each row's exact length, read on the host (on CUDA a sync: not capturable).
* `triton`: CUDA (attention_triton.py): a flash-decoding kernel that reads each row's length from the device,
  so a graph captured at R rows is valid for any lengths; it splits each row's keys over several programs
  where R rows alone would leave the GPU idle.

`default_backend(device)` is the engine's choice: `triton` on CUDA, `torch` elsewhere.

Public: `AttentionBackend`, `BACKENDS`, `available`, `get`, `default_backend`, `check_inputs`, `TORCH`.
"""

from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

BACKENDS: dict[str, str] = {
    "torch": "duplexcadence.interpreter.engine.attention:TORCH",
    "triton": "duplexcadence.interpreter.engine.attention_triton:TRITON",
}
"""Built-in backends: name -> "module:attribute" of its `AttentionBackend`."""


@runtime_checkable
class AttentionBackend(Protocol):
    name: str
    capturable: bool
    """Whether a CUDA graph of a call is valid for any lengths (the backend reads them on the device)."""

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        lengths: torch.Tensor,
        *,
        causal: bool,
        scale: float,
    ) -> torch.Tensor: ...


def available() -> list[str]:
    return sorted(BACKENDS)


def get(name: str) -> AttentionBackend:
    """The backend registered as `name`; ValueError naming the backends if there is none or it does not load."""
    if name not in BACKENDS:
        raise ValueError(f"no attention backend named {name!r}; the backends are {', '.join(available())}")
    module, _, attribute = BACKENDS[name].partition(":")
    try:
        backend = getattr(importlib.import_module(module), attribute)
    except ImportError as error:
        raise ValueError(f"attention backend {name!r} does not load here: {error}") from error
    if not isinstance(backend, AttentionBackend) or backend.name != name:
        raise ValueError(f"attention backend {name!r} is registered as {BACKENDS[name]!r}, not a backend named so")
    return backend


def default_backend(device: str | torch.device) -> str:
    """The backend the engine uses on `device`: `triton` on CUDA, `torch` elsewhere."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


def check_inputs(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor
) -> None:
    """ValueError saying which argument is wrong and what it must be (shapes, dtypes, devices only: no
    device value is read)."""
    if q.dim() != 4 or q.shape[1] < 1:
        raise ValueError(f"attention: q must be [rows, Q>=1, heads, head_dim], got {list(q.shape)}")
    rows_count, _, heads, head_dim = q.shape
    if keys.dim() != 4 or keys.shape[-1] != head_dim or values.shape != keys.shape:
        raise ValueError(
            f"attention: keys and values must both be [slots, kv_heads, capacity, head_dim={head_dim}], "
            f"got {list(keys.shape)} and {list(values.shape)}"
        )
    slots, kv_heads = keys.shape[0], keys.shape[1]
    if heads % kv_heads:
        raise ValueError(f"attention: {heads} query heads are not a multiple of {kv_heads} KV heads")
    if rows.dim() != 1 or rows.shape[0] != rows_count or rows.dtype != torch.int64:
        raise ValueError(f"attention: rows must be int64 [{rows_count}], got {rows.dtype} {list(rows.shape)}")
    if lengths.dim() != 1 or lengths.shape[0] != slots or lengths.dtype != torch.int64:
        raise ValueError(f"attention: lengths must be int64 [{slots}], got {lengths.dtype} {list(lengths.shape)}")
    if not (q.dtype == keys.dtype == values.dtype):
        raise ValueError(
            f"attention: q, keys and values must share a dtype, got {q.dtype}, {keys.dtype}, {values.dtype}"
        )
    devices = {t.device for t in (q, keys, values, rows, lengths)}
    if len(devices) != 1:
        raise ValueError(f"attention: every tensor must be on one device, got {sorted(map(str, devices))}")


class TorchAttention:
    """The `torch` backend (see the module docstring)."""

    name = "torch"
    capturable = False

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        lengths: torch.Tensor,
        *,
        causal: bool,
        scale: float,
    ) -> torch.Tensor:
        check_inputs(q, keys, values, rows, lengths)
        steps, capacity = q.shape[1], keys.shape[2]
        out = torch.empty_like(q)
        host_lengths = lengths.tolist()
        for row, slot in enumerate(rows.tolist()):
            if not 0 <= slot < keys.shape[0]:
                raise ValueError(f"attention: row {row} reads slot {slot}, not one of 0..{keys.shape[0] - 1}")
            total = host_lengths[slot] + steps
            if total > capacity:
                raise ValueError(
                    f"attention: row {row} (slot {slot}) needs {total} entries ({host_lengths[slot]} + {steps} new), "
                    f"over the capacity {capacity}"
                )
            mask = None
            if causal and steps > 1:  # query j sees the keys up to position past + j
                past = host_lengths[slot]
                mask = torch.arange(total, device=q.device) <= torch.arange(past, total, device=q.device)[:, None]
            out[row] = F.scaled_dot_product_attention(
                q[row].transpose(0, 1)[None],
                keys[slot, :, :total][None],
                values[slot, :, :total][None],
                attn_mask=mask,
                scale=scale,
                enable_gqa=True,
            )[0].transpose(0, 1)
        return out


TORCH = TorchAttention()
