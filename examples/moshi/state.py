"""Every streaming-state tensor on Mimi's decode path, named by attribute path from the Mimi root.

moshi 0.2.13 keeps streaming state in ``module._streaming_state`` (a dataclass derived from
``modules/streaming.py`` ``State``), created by ``mimi.streaming(B)`` (``_init_streaming_state``,
zeros, fixed shapes) and dropped on exit. The decode path is ``upsample``, ``decoder_transformer``
and ``decoder``; the quantizer has no streaming state. A path looks like
``decoder_transformer.transformer.layers.0.self_attn._streaming_state.kv_cache.cache``.

Every tensor is updated in place (``x[:] = torch.where(exec_mask, new, x)``, ``scatter_``), so its
address and shape never change during a session, and ``reset_streaming()`` also works in place.
Fields are plain dataclass attributes, so a tensor can be replaced by any tensor of the same shape
and dtype (e.g. a view into one flat arena): :func:`install_state_tensor`,
:func:`rebind_decode_state_to_flat_buffers`. Replacement must happen before a CUDA graph that
reads the state is captured (moshi's own graphs capture on the second ``decode`` call).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from moshi.modules.streaming import StreamingModule

DECODE_PATH_ROOTS = ("upsample", "decoder_transformer", "decoder")
"""Sub-modules of ``MimiModel`` that ``decode`` runs with streaming state."""

_STATE_MARK = "._streaming_state."

_UPDATE_RULES = {
    "exec_mask": "in place (`exec_mask[:] = ...` in set_exec_mask/reset); read by every update, never written by decode",
    "previous": "in place: `previous[:] = where(exec_mask, cat([previous, x])[..., -TP:], previous)`",
    "first": "in place, by reset only; read only with pad_mode='replicate' (encoder), unused here",
    "partial": "in place: `y[..., :PT] += partial`, then `partial[:] = where(exec_mask, y[..., -PT:] - bias, partial)`",
    "kv_cache.cache": "in place: `cache[0|1].scatter_(2, (end_offset + t) % capacity, k|v)`",
    "kv_cache.end_offset": "in place: `end_offset[:] = where(exec_mask, end_offset + T, end_offset)`",
    "offset": "in place: `offset[:] = where(exec_mask, offset + T, offset)` (rope position)",
    "offsets": "in place: `offsets[:] = where(exec_mask, offsets + T, offsets)`",
}

_COUNTER_RULES = {
    "offset_cpu": "host int, `+= T` each call; reset to 0 by reset_streaming (only picks per-step weights, unused by Mimi)",
}


@dataclasses.dataclass(frozen=True)
class StateTensor:
    """One streaming-state tensor of the decode path."""

    path: str
    tensor: torch.Tensor
    update: str

    @property
    def module_path(self) -> str:
        return self.path.split(_STATE_MARK)[0]

    @property
    def field(self) -> str:
        return self.path.split(_STATE_MARK)[1]


@dataclasses.dataclass(frozen=True)
class StateCounter:
    """One host-side (Python int) counter of the decode path."""

    path: str
    value: int
    update: str


def _streaming_modules(mimi) -> Iterator[tuple[str, StreamingModule[Any]]]:
    from moshi.modules.streaming import StreamingModule

    for root in DECODE_PATH_ROOTS:
        for name, module in mimi.get_submodule(root).named_modules(prefix=root):
            if isinstance(module, StreamingModule):
                yield name, module


def _fields_of(state) -> Iterator[tuple[str, object]]:
    from moshi.modules.transformer import RingKVCache

    yield "exec_mask", state.exec_mask
    for field in dataclasses.fields(state):
        if field.name in ("batch_size", "device"):
            continue
        value = getattr(state, field.name)
        if isinstance(value, RingKVCache):
            yield f"{field.name}.cache", value.cache
            yield f"{field.name}.end_offset", value.end_offset
        else:
            yield field.name, value


def decode_state_tensors(mimi) -> list[StateTensor]:
    """All state tensors of the decode path, in module order. Mimi must be streaming."""
    from moshi.modules.conv import StreamingConvTranspose1d

    entries: list[StateTensor] = []
    for name, module in _streaming_modules(mimi):
        state = module._streaming_state
        if state is None:
            raise RuntimeError(f"{name} is not streaming; enter mimi.streaming(batch_size) first")
        for field, value in _fields_of(state):
            if isinstance(value, torch.Tensor):
                update = _UPDATE_RULES[field]
                if value.numel() == 0:
                    update = "none: zero-size carry of a kernel-1 conv (cat with an empty tensor, nothing kept)"
                elif (
                    field == "partial"
                    and isinstance(module, StreamingConvTranspose1d)
                    and module.convtr.convtr.bias is None
                ):
                    update = update.replace(" - bias", "") + " (no bias)"
                entries.append(StateTensor(f"{name}{_STATE_MARK}{field}", value, update))
    return entries


def decode_state_counters(mimi) -> list[StateCounter]:
    """All host-side integer counters of the decode path. Mimi must be streaming."""
    counters: list[StateCounter] = []
    for name, module in _streaming_modules(mimi):
        for field, value in _fields_of(module._streaming_state):
            if isinstance(value, int) and not isinstance(value, bool):
                counters.append(StateCounter(f"{name}{_STATE_MARK}{field}", value, _COUNTER_RULES[field]))
    return counters


def snapshot_addresses(mimi) -> dict[str, tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]]:
    """``path -> (data_ptr, shape, stride, dtype)`` of every decode-path state tensor."""
    return {
        entry.path: (entry.tensor.data_ptr(), tuple(entry.tensor.shape), entry.tensor.stride(), entry.tensor.dtype)
        for entry in decode_state_tensors(mimi)
    }


def install_state_tensor(mimi, path: str, tensor: torch.Tensor) -> None:
    """Replace the state tensor at ``path`` by ``tensor`` (same shape and dtype, caller-owned)."""
    module_path, field_path = path.split(_STATE_MARK)
    owner = mimi.get_submodule(module_path)._streaming_state
    *parents, leaf = field_path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    current = getattr(owner, leaf)
    if current.shape != tensor.shape or current.dtype != tensor.dtype or current.device != tensor.device:
        raise ValueError(
            f"{path}: expected {tuple(current.shape)} {current.dtype} on {current.device}, "
            f"got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
        )
    setattr(owner, leaf, tensor)


def rebind_decode_state_to_flat_buffers(mimi, alignment_bytes: int = 512) -> dict[torch.dtype, torch.Tensor]:
    """Move every decode-path state tensor into one flat buffer per dtype, at stable views.

    Each tensor's current value is copied into a contiguous view of the buffer (offsets rounded up
    to ``alignment_bytes``, the CUDA caching allocator's granularity, so kernels that check
    alignment choose the same path), then installed in place of the original. Returns the buffers.
    """
    entries = decode_state_tensors(mimi)
    layout: dict[torch.dtype, int] = {}
    placed: list[tuple[StateTensor, int]] = []
    for entry in entries:
        dtype = entry.tensor.dtype
        step = max(1, alignment_bytes // entry.tensor.element_size())
        offset = math.ceil(layout.get(dtype, 0) / step) * step
        placed.append((entry, offset))
        layout[dtype] = offset + entry.tensor.numel()
    device = entries[0].tensor.device
    buffers = {dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in layout.items()}
    for entry, offset in placed:
        view = buffers[entry.tensor.dtype][offset : offset + entry.tensor.numel()].view(entry.tensor.shape)
        view.copy_(entry.tensor)
        install_state_tensor(mimi, entry.path, view)
    return buffers


def state_bytes(mimi) -> int:
    """Bytes of all decode-path state tensors (the session's streaming memory, decode side)."""
    return sum(entry.tensor.numel() * entry.tensor.element_size() for entry in decode_state_tensors(mimi))
