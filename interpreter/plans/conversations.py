"""Pass 7, conversations: what one conversation costs, and the graphs of the stages batched over conversations.

A conversation engine holds many conversations on one device (interpreter/engine/). From the plan it reads:

* the bytes each conversation holds, region by region: every region of its own state (the session block
  of the arena: a `slide` window at its high mark plus a cadence's units, a turn's cache at its horizon,
  the tail's carried state), and the scratch of the stages that run batched (`rows N`), which every row
  holds for itself; the rest of the scratch is shared, one block per lane;
* the graphs the engine captures: each graph of a batched stage once per row count 1..N (a stage on a
  bounded clock fires up to its bound at one instant, each firing replaying the same graph); the graphs
  of the other stages are captured for each conversation's own slot, as the runtime's are;
* how many conversations fit in a given number of bytes (`ConversationPlan.fits`).

`conversation_plan` in interpreter/plans/plan.py plans a file and returns this record; no torch.
"""

from __future__ import annotations

import attrs

from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.allocation import AllocationSchedule
from duplexcadence.interpreter.plans.arena import ArenaPlan, align
from duplexcadence.interpreter.plans.capture import CapturePlan


@attrs.frozen
class ConversationRegion:
    """One region of a conversation's own state: its retention, capacity (units of its clock; None for a
    fixed region) and bytes."""

    name: str
    family: str | None
    retention: str
    capacity: int | None
    bytes: int
    batched: bool
    """Scratch of a batched stage (each row holds its own), not state kept between instants."""


@attrs.frozen
class BatchedGraphs:
    """One graph of a stage with `rows N`: captured once per row count 1..`rows`. `burst`: up to how many
    times it replays at each of its instants (a stage on a bounded clock), else None."""

    stage: str
    key: int
    rows: int
    burst: int | None


@attrs.frozen
class ConversationPlan:
    regions: tuple[ConversationRegion, ...]
    """Each conversation's own regions, the largest first (ties by name)."""
    bytes_per_conversation: int
    """The session block of the arena and the batched stages' scratch, each allocation aligned."""
    shared_bytes: int
    """The scratch block the conversations share (one per lane)."""
    batched: tuple[BatchedGraphs, ...]
    per_conversation_graphs: tuple[int, ...]
    """Keys of the captured graphs of the stages without `rows`: captured for each conversation's slot."""

    @property
    def rows(self) -> int:
        """The most rows a batched stage runs on (0 without one)."""
        return max((graph.rows for graph in self.batched), default=0)

    @property
    def batched_graph_count(self) -> int:
        """Graphs the engine captures for its batched stages: every batched graph at every row count."""
        return sum(graph.rows for graph in self.batched)

    def region(self, name: str) -> ConversationRegion:
        for region in self.regions:
            if region.name == name:
                return region
        raise KeyError(name)

    def fits(self, memory_bytes: int, lanes: int = 1) -> int | None:
        """How many conversations' state fits in `memory_bytes`: the shared scratch once per lane, then each
        conversation's bytes (what else the device holds, the weights first, is the caller's to subtract).
        None: memory sets no limit (a conversation holds no bytes, and the shared scratch fits)."""
        free = memory_bytes - lanes * self.shared_bytes
        if free < 0:
            return 0
        return free // self.bytes_per_conversation if self.bytes_per_conversation else None


def plan_conversations(
    program: Program, schedule: AllocationSchedule, arena: ArenaPlan, capture: CapturePlan
) -> ConversationPlan:
    """Pass 7: each conversation's bytes by region, the batched graphs per row count, the others per slot."""
    batched_scratch = {
        access.region
        for stage in program.stages.values()
        if stage.rows is not None
        for access in stage.accesses
        if not schedule.regions[access.region].persistent
    }
    regions = [
        ConversationRegion(
            name,
            plan.family,
            "fixed" if program.regions[name].fixed else program.regions[name].retention.describe(),
            plan.capacity,
            plan.bytes,
            not plan.persistent,
        )
        for name, plan in schedule.regions.items()
        if plan.persistent or name in batched_scratch
    ]
    regions.sort(key=lambda region: (-region.bytes, region.name))
    scratch = sum(align(schedule.regions[name].bytes, arena.alignment) for name in sorted(batched_scratch))
    batched, per_slot = [], []
    for graph in capture.captured:
        stage = program.stages[graph.stage]
        if stage.rows is None:
            per_slot.append(graph.key)
        else:
            batched.append(BatchedGraphs(graph.stage, graph.key, stage.rows, program.burst(graph.stage)))
    return ConversationPlan(
        tuple(regions), arena.session_bytes + scratch, arena.scratch_bytes, tuple(batched), tuple(per_slot)
    )
