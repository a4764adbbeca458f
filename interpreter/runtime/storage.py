"""The device arena: one allocation per runtime, and the region storage views carved from it.

Every view handed to a module is *contiguous at the tick's exact shape*, at the region's fixed
base address (the stock code's tensors are contiguous too, and kernels may pick algorithms by
stride and alignment). A region that grows or is trimmed along a time axis that is not the
outermost one is therefore re-laid out; moves onto overlapping memory go through the region's
double buffer, planned in the shared scratch block.
"""

from __future__ import annotations

import math

import torch

from duplexcadence.dsl.diagnostics import InternalError
from duplexcadence.dsl.program import RegionInfo, Retention
from duplexcadence.interpreter.plans.arena import ArenaPlan

TORCH_DTYPES = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
}


class DeviceArena:
    """One `torch.zeros` of bytes: `sessions` persistent blocks followed by `lanes` scratch blocks
    (lane i's scratch is shared by the sessions of lane i)."""

    def __init__(self, plan: ArenaPlan, sessions: int, device: torch.device, lanes: int = 1):
        self.plan = plan
        self.sessions = sessions
        self.lanes = lanes
        self.device = device
        self.nbytes = plan.total_bytes(sessions, lanes)
        self.buffer = torch.zeros(max(self.nbytes, 1), dtype=torch.uint8, device=device)

    def block(self, name: str, session: int | None, lane: int = 0) -> torch.Tensor:
        """The raw bytes of allocation `name` (a region, or `region~double`): a persistent one in
        session slot `session`, a scratch one in lane `lane`'s scratch block."""
        allocation = self.plan.allocation(name)
        if allocation.persistent:
            if session is None:
                raise InternalError(f"persistent allocation '{name}' needs a session slot")
            base = session * self.plan.session_bytes
        else:
            if not 0 <= lane < self.lanes:
                raise InternalError(f"lane {lane} of an arena with {self.lanes} lane(s)")
            base = self.sessions * self.plan.session_bytes + lane * self.plan.scratch_bytes
        start = base + allocation.offset
        return self.buffer[start : start + allocation.bytes]


def keep_positions(retention: Retention, length: int) -> list[tuple[int, int]]:
    """The (start, count) runs of a version of `length` units that the retention keeps, in order."""
    kept = retention.trim(length)
    if kept == length:
        return [(0, length)] if length else []
    if retention.kind == "first_last":
        first = min(retention.first, length)
        return [(0, first), (length - retention.last, retention.last)]
    if kept == 0:
        return []
    return [(length - kept, kept)]


class RegionStorage:
    """A region's storage in one session: typed flat memory, exact-shape views, append and trim.

    Lengths are not stored here: the session's simulator owns them and passes them in.
    """

    def __init__(self, info: RegionInfo, flat: torch.Tensor, double: torch.Tensor | None):
        self.info = info
        self.dtype = TORCH_DTYPES[info.dtype]
        self.flat = flat.view(self.dtype)
        self.double = double.view(self.dtype) if double is not None else None
        # a fixed region's shape: every dim declared (None for a region with a time axis)
        self._whole_shape = tuple(d for d in info.shape if d is not None) if info.fixed else None
        self.unit = info.unit_elements if self._whole_shape is None else math.prod(self._whole_shape)

    @property
    def time_axis(self) -> int | None:
        return self.info.time_axis

    def view(self, length: int | None = None) -> torch.Tensor:
        """The contiguous view of `length` units (the whole shape for a fixed region)."""
        if self._whole_shape is not None:
            return self.flat[: self.unit].view(self._whole_shape)
        if length is None:
            raise InternalError(f"region '{self.info.name}' has a time axis: its view needs a length")
        shape = self.info.shape_at(length)
        return self.flat[: self.unit * length].view(shape)

    def _staging(self, length: int) -> torch.Tensor:
        shape = self.info.shape_at(length)
        if self.double is not None and self.double.numel() >= self.unit * length:
            return self.double[: self.unit * length].view(shape)
        return torch.empty(shape, dtype=self.dtype, device=self.flat.device)  # off-plan: a temporary

    def append_target(self, current: int, units: int) -> torch.Tensor | None:
        """The view that `append(current, 0, new)` copies `units` new units into, when it is one copy (the
        units already held stay where they are); None when that append goes through a staging copy."""
        if current and not self._time_outermost():
            return None
        return self.view(current + units).narrow(self._axis(), current, units)

    def append(self, current: int, keep_from: int, new: torch.Tensor) -> int:
        """Keep units [keep_from, current) and append `new` after them; returns the new length."""
        axis = self._axis()
        old = current - keep_from
        units = new.shape[axis]
        length = old + units
        if old and (keep_from or not self._time_outermost()):
            staging = self._staging(length)
            staging.narrow(axis, 0, old).copy_(self.view(current).narrow(axis, keep_from, old))
            staging.narrow(axis, old, units).copy_(new)
            self.view(length).copy_(staging)
        else:
            self.view(length).narrow(axis, old, units).copy_(new)
        return length

    def trim(self, length: int, retention: Retention) -> int:
        """Trim the region's own `length` units to what the retention keeps; returns the kept length."""
        runs = keep_positions(retention, length)
        kept = sum(count for _, count in runs)
        if kept == length or kept == 0:
            return kept
        axis = self._axis()
        staging = self._staging(kept)
        position = 0
        source = self.view(length)
        for start, count in runs:
            staging.narrow(axis, position, count).copy_(source.narrow(axis, start, count))
            position += count
        self.view(kept).copy_(staging)
        return kept

    def store_version(self, version: torch.Tensor, retention: Retention) -> int:
        """Copy the kept part of a stage's new version (its own memory) into the region."""
        if self.info.fixed:
            self.view().copy_(version)
            return 0
        axis = self._axis()
        if self._aliases(version):
            version = version.clone()
        runs = keep_positions(retention, version.shape[axis])
        kept = sum(count for _, count in runs)
        target = self.view(kept)
        position = 0
        for start, count in runs:
            target.narrow(axis, position, count).copy_(version.narrow(axis, start, count))
            position += count
        return kept

    def fill_zero(self) -> None:
        self.flat.zero_()

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` is (a view of) this region's own memory."""
        return self._aliases(tensor)

    def _aliases(self, tensor: torch.Tensor) -> bool:
        """Whether the bytes `tensor` can reach overlap this region's memory (its own extent, not its
        storage's: a view of another region of the same arena does not alias this one)."""
        if tensor.device != self.flat.device or tensor.numel() == 0:
            return False
        start = self.flat.data_ptr()
        end = start + self.flat.numel() * self.flat.element_size()
        reach = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))  # strides are >= 0
        other = tensor.data_ptr()
        other_end = other + (reach + 1) * tensor.element_size()
        return other < end and start < other_end

    def _axis(self) -> int:
        """The time axis (appending, trimming and storing versions by units need one)."""
        axis = self.info.time_axis
        if axis is None:
            raise InternalError(f"region '{self.info.name}' has no time axis")
        return axis

    def _time_outermost(self) -> bool:
        return all(d == 1 for d in self.info.shape[: self.time_axis])
