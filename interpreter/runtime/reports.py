"""What a runtime reports: a session's counters and the runtime's `RuntimeReport` (bytes, graphs, runs).

Public: `Counters`, `RegionReport`, `RuntimeReport`.
"""

from __future__ import annotations

from collections import Counter

import attrs

from duplexcadence.dsl.diagnostics import Diagnostic


@attrs.define
class Counters:
    """What a session did: steps, graph replays (`replays_off_plan` of them at instants off the plan), eager
    firings (planned, e.g. over budget; or off-plan), the steps that took the short path (replay.py), and
    the steps off the plan that no declared step leads to (`undeclared_steps`: eager on any device)."""

    steps: int = 0
    replays: int = 0
    eager_planned: int = 0
    eager_off_plan: int = 0
    per_graph: Counter = attrs.field(factory=Counter)
    short_path_steps: int = 0
    replays_off_plan: int = 0
    undeclared_steps: int = 0

    def add_totals(self, other: Counters) -> None:
        """Add `other`'s replays, eager firings and short-path steps (what the runtime's report sums)."""
        self.replays += other.replays
        self.eager_planned += other.eager_planned
        self.eager_off_plan += other.eager_off_plan
        self.short_path_steps += other.short_path_steps
        self.replays_off_plan += other.replays_off_plan
        self.undeclared_steps += other.undeclared_steps


@attrs.frozen
class RegionReport:
    name: str
    bytes: int
    stock_bytes: int | None
    double_buffer_bytes: int


@attrs.frozen
class RuntimeReport:
    """The numbers a serving engineer asks for, from one runtime."""

    device: str
    sessions: int
    arena_bytes: int
    session_bytes: int
    scratch_bytes: int
    regions: tuple[RegionReport, ...]
    graphs_planned: int
    graphs_captured: int
    stage_graphs_covered: int
    capture_seconds: float
    blocked: tuple[Diagnostic, ...]
    replays: int
    eager_planned: int
    eager_off_plan: int
    lanes: int = 1
    """Scratch copies in the arena: `arena_bytes` = sessions x `session_bytes` + lanes x `scratch_bytes`."""
    short_path_steps: int = 0
    capture: str = "fused"
    """The capture strategy's name."""
    off_plan_instants: int = 0
    """The off-plan instants the declared steps lead to (`plan.off_plan`), each captured like a planned one."""
    off_plan_graphs: int = 0
    """Graphs a slot captured for them (beyond its planned instants' graphs)."""
    replays_off_plan: int = 0
    """Stage replays at instants off the plan (part of `replays`)."""
    undeclared_steps: int = 0
    """Steps off the plan that no declared step leads to: their firings run eagerly, on any device."""
    graph_pool_bytes: int = 0
    """What the lanes' graph memory pools reserve (the graphs' working memory and cuBLAS workspace), measured
    after each capture; 0 without graphs."""
    arena_reserved_bytes: int = 0
    """What the caching allocator reserves for the arena (`ArenaPlan.reserved_bytes`): the plan's number."""
    off_plan_blocked: tuple[Diagnostic, ...] = ()
    """Stages that run eagerly at off-plan instants only (captured everywhere else), with why."""

    @property
    def stock_bytes(self) -> int:
        return sum(r.stock_bytes for r in self.regions if r.stock_bytes is not None)

    @property
    def compared_bytes(self) -> int:
        return sum(r.bytes for r in self.regions if r.stock_bytes is not None)

    def __str__(self) -> str:
        from duplexcadence.interpreter.plans.plan_text import human_bytes

        if self.lanes == 1:
            lines = [
                f"DuplexCadence runtime on {self.device}: {self.sessions} session slot(s)",
                f"  arena {human_bytes(self.arena_bytes)} in one allocation ({human_bytes(self.session_bytes)} "
                f"per session + {human_bytes(self.scratch_bytes)} shared scratch)",
            ]
        else:
            lines = [
                f"DuplexCadence runtime on {self.device}: {self.sessions} session slot(s) in {self.lanes} lanes",
                f"  arena {human_bytes(self.arena_bytes)} in one allocation ({human_bytes(self.session_bytes)} "
                f"per session + {self.lanes} x {human_bytes(self.scratch_bytes)} scratch, one copy per lane)",
            ]
        if self.graph_pool_bytes:
            lines.append(
                f"  reserved: the arena {human_bytes(self.arena_reserved_bytes)}, graph pools "
                f"{human_bytes(self.graph_pool_bytes)} (the graphs' working memory)"
            )
        if self.stock_bytes:
            lines.append(
                f"  regions with a stock allocation: {human_bytes(self.compared_bytes)} vs stock "
                f"{human_bytes(self.stock_bytes)} per session"
            )
        grouped = (
            f"fused into {self.graphs_captured} instant graphs"
            if self.capture == "fused"
            else f"as {self.graphs_captured} graphs (capture '{self.capture}')"
        )
        lines.append(
            f"  graphs: {self.stage_graphs_covered} of {self.graphs_planned} planned stage graphs captured, "
            f"{grouped} in {self.capture_seconds:.2f} s; stage "
            f"replays {self.replays}; eager firings {self.eager_planned} planned + {self.eager_off_plan} "
            f"outside the plan; {self.short_path_steps} steps on the short replay path"
        )
        if self.off_plan_instants or self.undeclared_steps:
            lines.append(
                f"  off the plan: {self.off_plan_instants} declared instants ({self.off_plan_graphs} graphs a slot "
                f"captured for them); stage replays there {self.replays_off_plan}; {self.undeclared_steps} steps off "
                "the plan that no declared step leads to (eager)"
            )
        for label, diagnostics in (("blocked", self.blocked), ("blocked off the plan", self.off_plan_blocked)):
            for diagnostic in diagnostics:
                where = diagnostic.span
                located = f" ({where.path}:{where.line}:{where.column})" if where is not None else ""
                lines.append(f"  {label}: {diagnostic.message}{located}")
        return "\n".join(lines)
