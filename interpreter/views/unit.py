"""The unit view: one cadence of the steady state (a conversation's unit), firing by firing on one timeline.

Time runs left to right in slots; each firing of the cadence takes the next slot after the firings before it
(the stages of an instant run one after another, in order). A stage on a bounded clock (`up to N per unit`)
takes N slots, its firings drawn dashed after the first: the count is decided at run time. The stages batched
over conversations (`rows N`) come first, in dataflow order, then each conversation's own stages (the tails
the runtime steps in its lanes, on what the batched stages made), as a round of a conversation engine runs
them. A cell is coloured by the graph it replays (`gN`, the key `dsl plan` prints); a firing whose shapes are
decided at run time (`up to N`) is white and says `eager`. `build_unit` computes what is drawn (tested on
its own); `render_unit` draws it.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import graphviz
import networkx as nx

from duplexcadence.dsl import depgraph
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.plan_text import seconds
from duplexcadence.interpreter.views.style import (
    GRID,
    IDLE_TEXT,
    escape,
    graph_colour,
    html_table,
    new_digraph,
    small,
    td,
    wrap,
)
from duplexcadence.interpreter.views.view import DEFAULT_OPTIONS, ViewOptions

BURST_CELLS = 25
"""A burst of more firings than this shows its first BURST_CELLS - 2, an ellipsis, and its last."""
SLOT_WIDTH = 16
HEADER_WIDTH = 90  # characters per line of the header


@attrs.frozen
class Firing:
    """One firing of the cadence: its first slot, how many it takes (up to a bound: `burst`), its graph key
    (None: eager)."""

    stage: str
    instant: int
    slot: int
    burst: int | None
    graph: int | None


@attrs.frozen
class Unit:
    """What the unit view draws: the stages in drawing order, every firing of one cadence, the slots."""

    stages: tuple[str, ...]
    batched: frozenset[str]
    firings: tuple[Firing, ...]
    slots: int
    first_instant: int
    time: Fraction


def _order(plan: Plan) -> tuple[str, ...]:
    """The stages that exchange data with a batched stage within the instant, then the others (the tails the
    runtime steps per conversation on what they made), each in the plan's dataflow order."""
    order = plan.clocks.stage_order
    graph = depgraph.instant_graph(plan.program).to_undirected(as_view=True)
    batched = [name for name in order if plan.program.stages[name].rows is not None]
    joined = set().union(*(nx.node_connected_component(graph, name) for name in batched))
    return (*(name for name in order if name in joined), *(name for name in order if name not in joined))


def build_unit(plan: Plan) -> Unit:
    """One cadence from the first instant of the steady period (from session start without one)."""
    trace = plan.trace
    first = trace.warmup_instants if trace.periodic else 0
    start = plan.clocks.instant_time(first)
    graphs = {graph.signature: graph.key for graph in plan.capture.captured}
    order = _order(plan)
    by_instant = [
        f for f in trace.firings if start <= plan.clocks.instant_time(f.instant) < start + plan.clocks.cadence
    ]
    firings: list[Firing] = []
    slot = 0
    for instant in sorted({f.instant for f in by_instant}):
        here = {f.stage: f for f in by_instant if f.instant == instant}
        for stage in order:
            if stage not in here:
                continue
            burst = plan.program.burst(stage)
            firing = here[stage]
            graph = None if firing.varies else graphs.get(firing.signature)
            firings.append(Firing(stage, instant, slot, burst, graph))
            slot += _cells(burst)
    batched = frozenset(name for name in order if plan.program.stages[name].rows is not None)
    return Unit(order, batched, tuple(firings), slot, first, start)


def _cells(burst: int | None) -> int:
    return 1 if burst is None else min(burst, BURST_CELLS)


def _firing_cells(firing: Firing) -> list[str]:
    colour = "white" if firing.graph is None else graph_colour(firing.graph)
    name = "eager" if firing.graph is None else f"g{firing.graph}"
    style = {"STYLE": "dashed", "COLOR": "#555555"} if firing.graph is None else {"COLOR": "#555555"}
    if firing.burst is None:
        width = None if firing.graph is None else SLOT_WIDTH
        return [td(small(escape(name), size=8), BGCOLOR=colour, BORDER=1, WIDTH=width, **style)]
    numbers = list(range(1, firing.burst + 1))
    if firing.burst > BURST_CELLS:
        numbers = [*numbers[: BURST_CELLS - 2], 0, firing.burst]
    cells = []
    for position, number in enumerate(numbers):
        shown = number == firing.burst or number % 5 == 0
        text = name if position == 0 else ("…" if number == 0 else str(number) if shown else "")
        cells.append(
            td(
                small(escape(text), size=8) if text else "",
                BGCOLOR=colour,
                BORDER=1,
                COLOR="#555555",
                STYLE="dashed" if position else style.get("STYLE"),
                WIDTH=SLOT_WIDTH,
            )
        )
    return cells


def _stage_label(plan: Plan, stage: str, batched: bool) -> str:
    info = plan.program.stages[stage]
    clock = plan.program.clocks[info.clock]
    fires = f"up to {clock.bound} per {clock.per}" if clock.bound is not None else f"on {info.clock}"
    rows = f", rows 1..{info.rows}" if batched else ""
    return f"<B>{escape(stage)}</B><BR/>" + small(escape(fires + rows), IDLE_TEXT)


def render_unit(plan: Plan, options: ViewOptions = DEFAULT_OPTIONS) -> graphviz.Digraph:
    """One cadence of the steady state, firing by firing (`options` has nothing for this view)."""
    unit = build_unit(plan)
    graph = new_digraph("unit", plan, "unit")
    header = td("<B>stage</B>", ALIGN="LEFT", BORDER=1, COLOR=GRID) + td(
        wrap(
            f"one cadence ({seconds(plan.clocks.cadence)}) from {seconds(unit.time)}, instant {unit.first_instant}: "
            "each firing after the ones before it; dashed: up to the bound, the count decided at run time; "
            "colour: the CUDA graph replayed",
            HEADER_WIDTH,
        ),
        ALIGN="LEFT",
        BALIGN="LEFT",
        COLSPAN=max(unit.slots, 1),
        BORDER=1,
        COLOR=GRID,
    )
    rows = [f"<TR>{header}</TR>"]
    for stage in unit.stages:
        cells = [
            td(_stage_label(plan, stage, stage in unit.batched), ALIGN="LEFT", BALIGN="LEFT", BORDER=1, COLOR=GRID)
        ]
        slot = 0
        for firing in (f for f in unit.firings if f.stage == stage):
            if firing.slot > slot:
                cells.append(td("", COLSPAN=firing.slot - slot))
            cells += _firing_cells(firing)
            slot = firing.slot + _cells(firing.burst)
        if unit.slots > slot:
            cells.append(td("", COLSPAN=unit.slots - slot))
        rows.append("<TR>" + "".join(cells) + "</TR>")
    graph.node("unit", html_table(rows, spacing=1, padding=3), shape="plain")
    return graph
