"""Pass 3, allocation schedule: how much each region must hold, in units and bytes, against stock.

A region's capacity is the most units it ever holds over the traced session: every view handed to
a stage, every append before the end-of-instant trim, the start and the retained lengths (a ring is
its size; a fixed region its shape), also in a last instant (`Session.finish`) at any point of the
trace; a region whose length is decided at run time, what its declaration bounds it to
(`Program.run_time_capacity`). Not the stock implementation's constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from duplexcadence.dsl.program import Program, RegionInfo
from duplexcadence.interpreter.plans.trace import Trace, View


@attrs.frozen
class RegionPlan:
    """One region's allocation.

    `persistent`: lives for the whole session (its own bytes per session); otherwise it is scratch,
    live only within an instant and packed with other scratch by liveness. `double_buffer_units`:
    size of the staging buffer its appends/trims need when they move kept units onto overlapping or
    re-laid-out memory (0: none). `live`: for scratch, the first and last position in the instant's
    stage order that touch it.
    """

    name: str
    family: str | None
    dtype: str
    itemsize: int
    capacity: int | None
    shape: tuple[int, ...]
    bytes: int
    persistent: bool
    double_buffer_units: int
    double_buffer_bytes: int
    kept: int | None
    stock_shape: tuple[int, ...] | None
    stock_bytes: int | None
    live: tuple[int, int] | None

    @property
    def saving_bytes(self) -> int | None:
        return None if self.stock_bytes is None else self.stock_bytes - self.bytes

    @property
    def saving_fraction(self) -> float | None:
        if not self.stock_bytes:
            return None
        return 1 - self.bytes / self.stock_bytes


@attrs.frozen
class AllocationSchedule:
    regions: dict[str, RegionPlan] = attrs.field(hash=False)

    @property
    def persistent_bytes(self) -> int:
        return sum(r.bytes for r in self.regions.values() if r.persistent)

    @property
    def demand_bytes(self) -> int:
        """Bytes one session demands: persistent regions, scratch and double buffers (unpacked)."""
        return sum(r.bytes + r.double_buffer_bytes for r in self.regions.values())

    @property
    def stock_bytes(self) -> int:
        """Bytes of the regions that declare a stock allocation, at stock size."""
        return sum(r.stock_bytes for r in self.regions.values() if r.stock_bytes is not None)

    @property
    def compared_demand_bytes(self) -> int:
        """Demand of the same regions that declare a stock allocation (for a like-for-like saving)."""
        return sum(r.bytes for r in self.regions.values() if r.stock_bytes is not None)


def _capacity(program: Program, region: RegionInfo, trace: Trace, views: Sequence[View]) -> int | None:
    """`views`: every view of the region, in the traced firings and the last instants."""
    if region.fixed:
        return None
    retention = region.retention
    if retention.kind == "ring":
        return retention.last
    if program.run_time_length(region.name):
        return program.run_time_capacity(region.name)
    most = region.start_length
    for view in views:
        if view.length is not None:
            most = max(most, view.start + view.length if view.kind in ("feed", "write") else view.length)
        if view.kind in ("feed", "write"):
            most = max(most, view.transient)
        if view.kept is not None:
            most = max(most, view.kept)
    if retention.kind == "all" and retention.horizon is not None and not trace.periodic:
        most = max(most, retention.horizon)
    return most


def schedule_allocations(program: Program, trace: Trace, stage_order: tuple[str, ...]) -> AllocationSchedule:
    """Pass 3: the capacity and bytes of every region, its double buffer, and the liveness of scratch."""
    position = {name: i for i, name in enumerate(stage_order)}
    # one pass over the trace: each region's views (and the stage positions that use it)
    traced: dict[str, list[View]] = {name: [] for name in program.regions}
    users: dict[str, list[int]] = {name: [] for name in program.regions}
    for firing in trace.firings:
        for view in firing.views:
            traced[view.region].append(view)
            users[view.region].append(position[firing.stage])
    finishing: dict[str, list[View]] = {name: [] for name in program.regions}
    for firing in trace.last_instants:
        for view in firing.views:
            finishing[view.region].append(view)
    plans = {}
    for name, region in program.regions.items():
        capacity = _capacity(program, region, trace, traced[name] + finishing[name])
        # capacity None: a fixed region, whose dims are all declared
        shape = tuple(d for d in region.shape if d is not None) if capacity is None else region.shape_at(capacity)
        nbytes = math.prod(shape) * region.itemsize
        persistent = region.retention.kind != "scratch"
        overlapping = [v for v in traced[name] if v.overlap]
        staged = max((v.moved if v.kind != "update" else 0 for v in overlapping), default=0)
        if staged:
            # the staging buffer holds a whole kept or appended version
            staged = max(v.transient if v.kind in ("feed", "write") else (v.kept or 0) for v in overlapping)
        double_buffer_bytes = staged * region.unit_elements * region.itemsize if staged else 0
        live = None
        if not persistent:
            # inputs arrive when step() starts the instant; outputs are read when it ends
            # a region no stage touches (an unused input or scratch: a warning) holds nothing
            first = 0 if region.role == "input" else min(users[name], default=0)
            live = (first, len(stage_order)) if region.role == "output" else (first, max(users[name], default=first))
        kept = None if region.fixed else region.retention.keeps
        plans[name] = RegionPlan(
            name,
            region.family,
            region.dtype,
            region.itemsize,
            capacity,
            tuple(shape),
            nbytes,
            persistent,
            staged,
            double_buffer_bytes,
            kept,
            region.stock_shape,
            region.stock_bytes,
            live,
        )
    return AllocationSchedule(plans)
