"""Slot KV: the keys and values of many conversations, one slot each, allocated once.

    kv = SlotKV(layers=36, slots=16, kv_heads=8, capacity=4032, head_dim=128, dtype=torch.bfloat16, device="cuda")
    kv.write(layer, rows, k, v)        # a step's [R, Q, kv_heads, head_dim] after each row's length
    out = attend(q, kv.keys[layer], kv.values[layer], rows, kv.lengths, causal=True, scale=head_dim**-0.5)
    kv.advance(rows, Q)                # after the last layer; the engine adds Q to `host_lengths` likewise

Each layer has one key and one value tensor of [slots, kv_heads, capacity, head_dim], allocated at
construction and never reallocated: their `data_ptr()` holds for the object's life, so graphs captured over
them stay valid. A slot is one conversation; its valid length is `lengths[slot]` (a device int64 tensor, so a
captured step reads it at replay), mirrored on the host in `host_lengths`, which the engine keeps: every
call here that changes the lengths eagerly changes both, and after a replay of a graph that advanced them
the engine adds the same counts to the mirror.

`write` and `advance` take the rows as a device int64 tensor of slot indices and read no host value, so they
can be captured; nothing checks there that a row has room (that would read the device), so the engine
checks its host mirror first with `check_room`. `clear` and `drop` are eager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

RotateKeys = Callable[[torch.Tensor, int, int], torch.Tensor]
"""`rotate(keys, old_start, new_start)`: keys [kv_heads, n, head_dim] rotated for positions `old_start + i`,
returned rotated for `new_start + i` (a RoPE model's re-rotation after a drop)."""


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"SlotKV needs a positive integer {name}, got {value!r}")


class SlotKV:
    """Keys and values of `slots` conversations at a fixed `capacity` per slot (see the module docstring)."""

    def __init__(
        self,
        *,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        _positive(layers=layers, slots=slots, kv_heads=kv_heads, capacity=capacity, head_dim=head_dim)
        self.slots = slots
        self.capacity = capacity
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        shape = (slots, kv_heads, capacity, head_dim)
        self.keys = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers))
        self.values = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers))
        self.lengths = torch.zeros(slots, dtype=torch.int64, device=device)
        """The valid entries of each slot, on the device."""
        self.host_lengths = np.zeros(slots, dtype=np.int64)
        """The host mirror of `lengths` (see the module docstring)."""
        self._heads = torch.arange(kv_heads, device=device)

    @property
    def device(self) -> torch.device:
        return self.lengths.device

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @property
    def layers(self) -> int:
        return len(self.keys)

    @property
    def bytes(self) -> int:
        """The bytes of every layer's keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    # -- capturable: device rows, no host values

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a step's keys and values `k`, `v` [R, Q, kv_heads, head_dim] of layer `layer`: row r's
        entries j at positions `lengths[rows[r]] + j` of slot `rows[r]` (rows: device int64 [R], distinct
        slots). The lengths do not move (`advance` does, once every layer is written)."""
        self._check_rows(rows)
        steps = k.shape[1] if k.dim() == 4 else 0
        for name, tensor in (("keys", k), ("values", v)):
            if steps < 1 or tuple(tensor.shape) != (rows.shape[0], steps, self.kv_heads, self.head_dim):
                raise ValueError(
                    f"SlotKV.write: {name} must be [rows={rows.shape[0]}, Q>=1, kv_heads={self.kv_heads}, "
                    f"head_dim={self.head_dim}], got {list(tensor.shape)}"
                )
            if tensor.dtype != self.dtype or tensor.device != self.device:
                raise ValueError(
                    f"SlotKV.write: {name} must be {self.dtype} on {self.device}, got {tensor.dtype} on {tensor.device}"
                )
        if not 0 <= layer < self.layers:
            raise ValueError(f"SlotKV.write: layer {layer} is not one of 0..{self.layers - 1}")
        positions = (self.lengths[rows][:, None] + torch.arange(steps, device=self.device))[:, :, None]  # [R, Q, 1]
        index = (rows[:, None, None], self._heads, positions)  # broadcast to [R, Q, kv_heads]
        self.keys[layer].index_put_(index, k)
        self.values[layer].index_put_(index, v)

    def advance(self, rows: torch.Tensor, count: int) -> None:
        """Add `count` to the device length of each slot in `rows` (device int64 [R], distinct slots)."""
        self._check_rows(rows)
        self.lengths.index_add_(0, rows, torch.full_like(rows, count))

    # -- eager: host values

    def check_room(self, slots: Sequence[int], count: int) -> None:
        """ValueError unless each of `slots` has room for `count` more entries (read from `host_lengths`)."""
        for slot in slots:
            self._check_slot(slot)
            if self.host_lengths[slot] + count > self.capacity:
                raise ValueError(
                    f"slot {slot} holds {int(self.host_lengths[slot])} of {self.capacity} entries: "
                    f"no room for {count} more (at most {self.capacity - int(self.host_lengths[slot])})"
                )

    def clear(self, slot: int) -> None:
        """Empty `slot` (its length 0; the stale entries are never read)."""
        self._set_length(slot, 0)

    def drop(self, slot: int, start: int, count: int, rotate: RotateKeys | None = None) -> None:
        """Remove entries `start .. start + count - 1` of `slot` in every layer, moving the entries after them
        down by `count`; with `rotate`, their keys are re-rotated from their old positions to the new ones."""
        self._check_slot(slot)
        length = int(self.host_lengths[slot])
        if start < 0 or count < 0 or start + count > length:
            raise ValueError(
                f"SlotKV.drop: entries {start}..{start + count - 1} are not within slot {slot}'s "
                f"{length} entries (0 <= start, 0 <= count, start + count <= {length})"
            )
        kept = length - start - count
        if count and kept:
            for keys, values in zip(self.keys, self.values):
                moved = keys[slot, :, start + count : length]
                keys[slot, :, start : start + kept] = (
                    rotate(moved, start + count, start) if rotate is not None else moved.clone()
                )
                values[slot, :, start : start + kept] = values[slot, :, start + count : length].clone()
        self._set_length(slot, length - count)

    def _set_length(self, slot: int, length: int) -> None:
        self._check_slot(slot)
        self.lengths[slot] = length
        self.host_lengths[slot] = length

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not one of this SlotKV's slots 0..{self.slots - 1}")

    def _check_rows(self, rows: torch.Tensor) -> None:
        if rows.dim() != 1 or rows.dtype != torch.int64 or rows.device != self.device:
            raise ValueError(
                f"rows must be a 1-d int64 tensor of slot indices on {self.device}, "
                f"got {rows.dtype} {list(rows.shape)} on {rows.device}"
            )
