"""Pass 4, arena: byte offsets for every region inside one allocation.

Persistent regions are pinned first, one block per session, largest first (ties by name); scratch
regions and double buffers are shared by all sessions and packed by liveness within an instant
(greedy by size, lowest offset that overlaps no buffer live at the same time; as TFLite Micro's
greedy planner). An overlap self-check then proves no two live allocations share a byte. A runtime
loaded with several lanes (sessions stepped concurrently) holds one copy of the scratch block per
lane; the plan is the same.
"""

from __future__ import annotations

import attrs

from duplexcadence.dsl.diagnostics import InternalError
from duplexcadence.interpreter.plans.allocation import AllocationSchedule

ALIGNMENT = 512  # the CUDA caching allocator's block granularity: views start where stock tensors would
SEGMENT_ROUNDING = 2 * 2**20
LARGE_ALLOCATION = 10 * 2**20
"""PyTorch's CUDA caching allocator gives an allocation of at least 10 MiB (`kMinLargeAlloc`) a segment of its
own, its size rounded up to 2 MiB (`kRoundLarge`); a smaller one shares a segment with other tensors."""


def align(value: int, alignment: int = ALIGNMENT) -> int:
    return (value + alignment - 1) // alignment * alignment


@attrs.frozen
class Allocation:
    """`name` is a region, or `name~double` for a region's double buffer. `live` is None for
    persistent allocations (always live), else the inclusive range of stage positions."""

    name: str
    offset: int
    bytes: int
    persistent: bool
    live: tuple[int, int] | None

    @property
    def end(self) -> int:
        return self.offset + self.bytes


@attrs.frozen
class ArenaPlan:
    """Offsets inside a session block (persistent) and inside the shared scratch block (one copy per lane)."""

    alignment: int
    session_bytes: int
    scratch_bytes: int
    allocations: tuple[Allocation, ...]

    def total_bytes(self, sessions: int, lanes: int = 1) -> int:
        """One device allocation: `sessions` persistent blocks, then one scratch block per lane (the
        sessions of a lane share it; lanes step concurrently, so each needs its own)."""
        return sessions * self.session_bytes + lanes * self.scratch_bytes

    def reserved_bytes(self, sessions: int, lanes: int = 1) -> int:
        """What the device's caching allocator reserves for the arena's one allocation: a segment of its own,
        its bytes rounded up to `SEGMENT_ROUNDING`; under `LARGE_ALLOCATION` it shares a segment with other
        tensors, and this is its bytes in blocks of `ALIGNMENT`."""
        total = self.total_bytes(sessions, lanes)
        return align(total, SEGMENT_ROUNDING) if total >= LARGE_ALLOCATION else align(total)

    def allocation(self, name: str) -> Allocation:
        for item in self.allocations:
            if item.name == name:
                return item
        raise KeyError(name)


def _live_together(a: Allocation, b: Allocation) -> bool:
    if a.live is None or b.live is None:
        return True
    return a.live[0] <= b.live[1] and b.live[0] <= a.live[1]


def check_no_overlap(allocations: list[Allocation]) -> None:
    """Raise InternalError if two allocations that are live together share a byte."""
    for i, a in enumerate(allocations):
        for b in allocations[i + 1 :]:
            if a.persistent != b.persistent:
                continue  # different blocks of the arena
            if a.bytes and b.bytes and _live_together(a, b) and a.offset < b.end and b.offset < a.end:
                raise InternalError(
                    f"arena overlap: '{a.name}' [{a.offset}, {a.end}) and "
                    f"'{b.name}' [{b.offset}, {b.end}) are live at the same time"
                )


def plan_arena(schedule: AllocationSchedule, alignment: int = ALIGNMENT) -> ArenaPlan:
    allocations: list[Allocation] = []
    persistent = sorted((r for r in schedule.regions.values() if r.persistent), key=lambda r: (-r.bytes, r.name))
    offset = 0
    for region in persistent:
        allocations.append(Allocation(region.name, offset, region.bytes, True, None))
        offset = align(offset + region.bytes, alignment)
    session_bytes = offset

    transient: list[tuple[str, int, tuple[int, int] | None]] = []
    for region in schedule.regions.values():
        if not region.persistent:
            transient.append((region.name, region.bytes, region.live))
        if region.double_buffer_bytes:
            transient.append((f"{region.name}~double", region.double_buffer_bytes, None))
    placed: list[Allocation] = []
    for name, nbytes, live in sorted(transient, key=lambda t: (-t[1], t[0])):
        candidate = Allocation(name, 0, nbytes, False, live)
        for other in sorted(placed, key=lambda a: a.offset):
            if _live_together(candidate, other) and candidate.offset < other.end and other.offset < candidate.end:
                candidate = attrs.evolve(candidate, offset=align(other.end, alignment))
        placed.append(candidate)
    scratch_bytes = align(max((a.end for a in placed), default=0), alignment)
    allocations.extend(sorted(placed, key=lambda a: (a.offset, a.name)))
    check_no_overlap(allocations)
    return ArenaPlan(alignment, session_bytes, scratch_bytes, tuple(allocations))
