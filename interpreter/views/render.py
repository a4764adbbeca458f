"""`dsl render`: graphviz diagrams of a plan — the timeline, the dataflow graph and the arena map.

Three views, each a `graphviz.Digraph` built from a `Plan` (nothing here changes the plan):

* `timeline` (the main view): one HTML-table Gantt (one node, one column per instant or per run of
  alike instants, `COLSPAN` for phase bands) from session start through the warm-up and one steady
  period. One lane per stage, each firing coloured by the CUDA graph it replays; one lane per
  region (family members that behave alike share a lane) with its length or ring fill after the
  instant, a bar for fill / capacity, and a mark where the end-of-instant trim cuts it back.
* `graph`: the dataflow — stages, regions, read / write / update edges with their spans and
  advances, one cluster per clock domain.
* `arena`: the memory map — the per-session pinned block and the shared scratch block, every
  allocation at its offset, demand beside the stock size, scratch liveness per stage position.

The DOT text is deterministic: ids come from names; lanes, nodes and clusters follow fixed orders
(dataflow order, clock rate, name); colours are picked from fixed palettes by a stable index (the
graph key; a clock's rank by rate, then name) — never by Python's salted `hash()`. Writing `.dot` needs only the `graphviz` package; `.svg/.png/.pdf`
run Graphviz's `dot` program, and its absence is reported with how to install it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import attrs
import graphviz

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Access, Program, RegionInfo
from duplexcadence.interpreter.plans.plan import Plan, make_plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, seconds

VIEWS = ("timeline", "graph", "arena")
FORMATS = ("dot", "svg", "png", "pdf")
SUFFIX_FORMATS = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png", ".pdf": "pdf"}

INSTALL_DOT = (
    "install Graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` "
    "(macOS), or see https://graphviz.org/download/; or write DOT text with `--format dot`, "
    "which needs no extra program"
)

# Fill colours for graph keys: light enough for black text, distinct side by side (ColorBrewer Set3
# without its grey, then Paired's light hues). A key past the end wraps round; its "gN" text still tells.
GRAPH_PALETTE = (
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
    "#a6cee3",
    "#fdbf6f",
    "#cab2d6",
    "#b2df8a",
)
# Clock colours (Tableau 10): clusters, lane swatches, fill bars and arena bars. Clocks are ranked
# fastest first, ties by name, so `sample` (24 kHz) is the first colour in every stdlib model.
CLOCK_PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
FIXED_COLOUR = "#9d9d9d"
WARMUP_BAND, STEADY_BAND, REPEAT_BAND, GROWING_BAND = "#fde2c4", "#d4ecd1", "#e6e6e6", "#f6d0d0"
SEPARATOR = "#3c3c3c"
GRID = "#c8c8c8"
IDLE_TEXT = "#8a8a8a"
TRIM_BORDER = "#b35806"
FONT = "Helvetica"

HEAD_INSTANTS = 3  # the first instants of a session are drawn one by one, even when alike
MIN_RUN = 3  # runs of at least this many alike instants share one column
NON_PERIODIC_HYPERPERIODS = 3  # without a steady state the timeline shows this much unless --ticks says
EMPTY_STAGE = "#f4f4f4"
FIXED_LANE = "fixed-size state"  # the one lane all regions without a time axis share


class RenderError(Exception):
    """A render that cannot be written (no `dot`, `dot` failed, unknown format); a one-line message."""


class DotMissing(RenderError):
    """Graphviz's `dot` program is not on PATH."""


# --- small helpers ------------------------------------------------------------------------------


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _node_id(prefix: str, name: str) -> str:
    return prefix + "_" + re.sub(r"\W", "_", name)


def _lighten(colour: str, amount: float) -> str:
    """`colour` mixed with white (`amount` of white, 0..1), as #rrggbb."""
    channels = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in channels]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def _bar(colour: str, fraction: float, background: str = "white") -> str:
    """A graphviz weighted colour list: `fraction` of the cell in `colour` from the left, then background."""
    if fraction >= 1:
        return colour
    if fraction <= 0:
        return background
    return f"{colour};{max(fraction, 0.004):.3f}:{background}"


def _span_bar(colour: str, start: float, end: float, width: int = 160, height: int = 10) -> str:
    """A bar `width` points wide with [start, end) (fractions) painted: a nested table of fixed cells
    (graphviz gradients take two colours only, so a middle span needs its own cell)."""
    left = round(min(max(start, 0.0), 1.0) * width)
    middle = max(round(min(end, 1.0) * width) - left, 1)
    left = min(left, width - middle)
    right = width - left - middle
    cells = [(left, "white"), (middle, colour), (right, "white")]
    return (
        '<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="0"><TR>'
        + "".join(f'<TD WIDTH="{w}" HEIGHT="{height}" FIXEDSIZE="TRUE" BGCOLOR="{c}"></TD>' for w, c in cells if w > 0)
        + "</TR></TABLE>"
    )


def _graph_colour(key: int) -> str:
    return GRAPH_PALETTE[key % len(GRAPH_PALETTE)]


def _clock_colours(program: Program) -> dict[str, str]:
    ranked = sorted(program.clocks.values(), key=lambda clock: (-clock.rate, clock.name))
    return {clock.name: CLOCK_PALETTE[i % len(CLOCK_PALETTE)] for i, clock in enumerate(ranked)}


def _rate_text(rate: Fraction) -> str:
    if rate >= 1000 and (rate / 1000).denominator == 1:
        return f"{rate / 1000} kHz"
    value = f"{float(rate):g}" if rate.denominator != 1 else str(rate.numerator)
    return f"{value} Hz"


def _shape_text(shape: Sequence[int] | None) -> str:
    return "?" if shape is None else "×".join(str(d) for d in shape)


def _declared_shape(region: RegionInfo) -> str:
    dims = ["t" if i == region.time_axis else str(d) for i, d in enumerate(region.shape)]
    return f"{region.dtype}[{', '.join(dims)}]"


def _member_range(members: Sequence[str]) -> str:
    """`kv[0..7]` for a whole family run, else the names joined."""
    if len(members) == 1:
        return members[0]
    family, _, _ = members[0].partition("[")
    indices = [int(m[len(family) + 1 : -1]) for m in members]
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return f"{family}[{indices[0]}..{indices[-1]}]"
    return ", ".join(members)


def _title(plan: Plan, view: str) -> str:
    params = ", ".join(f"{k}={_param_text(v)}" for k, v in sorted(plan.program.params.items()) if "." not in k)
    return f"{Path(plan.path).name} — {view}" + (f"  ({params})" if params else "")


def _param_text(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_param_text(v) for v in value) + "]"
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    return str(value)


def _new_digraph(name: str, plan: Plan, view: str, **graph_attr: str) -> graphviz.Digraph:
    attributes = {
        "label": _title(plan, view),
        "labelloc": "t",
        "labeljust": "l",
        "fontname": FONT,
        "fontsize": "18",
        "bgcolor": "white",
    }
    attributes.update(graph_attr)
    return graphviz.Digraph(
        name,
        graph_attr=attributes,
        node_attr={"fontname": FONT, "fontsize": "11"},
        edge_attr={"fontname": FONT, "fontsize": "10"},
    )


def _table(rows: Sequence[str], border: int = 0, spacing: int = 0, padding: int = 4) -> str:
    return (
        f'<<TABLE BORDER="{border}" CELLBORDER="0" CELLSPACING="{spacing}" CELLPADDING="{padding}">'
        + "".join(rows)
        + "</TABLE>>"
    )


def _td(content: str = "", **attributes: object) -> str:
    attrs_text = "".join(f' {key.upper()}="{value}"' for key, value in attributes.items() if value is not None)
    return f"<TD{attrs_text}>{content}</TD>"


def _small(text: str, colour: str | None = None, size: int = 9) -> str:
    colour_attr = f' COLOR="{colour}"' if colour else ""
    return f'<FONT POINT-SIZE="{size}"{colour_attr}>{text}</FONT>'


def _access_for(program: Program, stage: str, region: str, kind: str) -> Access | None:
    for access in program.stages[stage].accesses:
        if access.region == region and access.kind == kind:
            return access
    return None


# --- timeline: per-instant lanes ----------------------------------------------------------------


@attrs.frozen
class StageCell:
    """A stage's lane at one instant: whether it fires, the graph its exact shapes call for
    (`graph`), and whether that graph is captured (else the firing runs eagerly)."""

    fires: bool
    graph: int = 0
    captured: bool = True

    def shape_key(self) -> tuple:
        return (self.fires, self.captured)


@attrs.frozen
class RegionCell:
    """A region's lane at one instant.

    kind: `ring` (module-managed ring: `after` is its fill, `size` its slots), `window` (a kept
    history: `before` units at the start of the instant, `peak` after the appends, `after` once
    trimmed), `scratch` (`peak` units live within the instant), `fixed` (no time axis).
    `touched`: a stage of the instant appends to / updates it (a read alone does not count).
    """

    kind: str
    touched: bool
    before: int = 0
    peak: int = 0
    after: int = 0
    size: int = 0
    double_buffer: bool = False
    module_sized: bool = False
    read: bool = False

    @property
    def trimmed(self) -> bool:
        return self.kind == "window" and self.after < self.peak

    def shape_key(self) -> tuple:
        """What must match for two instants to share a column (numbers may progress linearly)."""
        return (
            self.kind,
            self.touched,
            self.trimmed,
            self.double_buffer,
            self.module_sized,
            self.read,
            self.size,
            self.peak - self.before,
        )

    def numbers(self) -> tuple[int, int, int]:
        return (self.before, self.peak, self.after)


@attrs.frozen
class Lane:
    """One region lane: the regions it stands for (family members that behave alike), its cells."""

    name: str
    members: tuple[str, ...]
    clock: str | None
    cells: tuple[RegionCell, ...]


@attrs.frozen
class Column:
    """One timeline column: instants `first`..`last` (inclusive) of one phase."""

    first: int
    last: int
    phase: str

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@attrs.frozen
class Timeline:
    """Everything the timeline view draws, computed from the plan (instants from session start)."""

    instants: int
    traced: int
    phases: tuple[str, ...]
    stage_cells: dict[str, tuple[StageCell, ...]] = attrs.field(hash=False)
    lanes: tuple[Lane, ...]
    columns: tuple[Column, ...]


def _phase_of(plan: Plan, instant: int) -> str:
    trace = plan.trace
    if not trace.periodic:
        return "growing"
    if instant < trace.warmup_instants:
        return "warmup"
    if instant < trace.end_instant:
        return "steady"
    return "repeat"


def _representative(plan: Plan, instant: int, traced: int) -> int:
    """The traced instant whose firings and state a (possibly later) instant repeats."""
    trace = plan.trace
    if instant < traced:
        return instant
    if not trace.periodic:
        return traced - 1
    return trace.warmup_instants + (instant - trace.warmup_instants) % trace.period_instants


def _region_cells(plan: Plan, traced: int) -> dict[str, list[RegionCell]]:
    """Every region's cell at every traced instant, re-derived from the trace's views.

    Ring views carry no fill (the module keeps the ring whole), so the fill is replayed here:
    each update advances it by the access's advance, capped at the ring's size.
    """
    program = plan.program
    by_instant: list[list] = [[] for _ in range(traced)]
    for firing in plan.trace.firings:
        by_instant[firing.instant].append(firing)
    length = {
        name: r.start_length
        for name, r in program.regions.items()
        if not r.fixed and r.retention.kind not in ("ring", "scratch")
    }
    fill = {name: 0 for name, r in program.regions.items() if not r.fixed and r.retention.kind == "ring"}
    cells: dict[str, list[RegionCell]] = {name: [] for name in program.regions}
    for firings in by_instant:
        views: dict[str, list] = {}
        for firing in firings:
            for view in firing.views:
                views.setdefault(view.region, []).append((firing.stage, view))
        for name, region in program.regions.items():
            touching = views.get(name, [])
            grows = [v for _, v in touching if v.kind in ("feed", "write", "update")]
            read = any(v.kind == "read" for _, v in touching)
            double = any(v.overlap for _, v in touching)
            if region.fixed:
                cells[name].append(RegionCell("fixed", bool(grows), read=read))
            elif region.retention.kind == "ring":
                size = region.retention.last
                for stage, view in touching:
                    if view.kind == "update":
                        access = _access_for(program, stage, name, "update")
                        advance = access.advance if access is not None and access.advance else 0
                        fill[name] = min(fill[name] + advance, size)
                cells[name].append(
                    RegionCell(
                        "ring", bool(grows), after=fill[name], peak=fill[name], before=fill[name], size=size, read=read
                    )
                )
            elif region.retention.kind == "scratch":
                sized = [v.transient for v in grows if v.length is not None]
                module_sized = any(v.length is None for v in grows)
                peak = max(sized, default=0)
                cells[name].append(
                    RegionCell(
                        "scratch",
                        bool(grows),
                        peak=peak,
                        after=0,
                        module_sized=module_sized,
                        double_buffer=double,
                        read=read,
                    )
                )
            else:
                before = length[name]
                peak = max([before] + [v.transient for v in grows])
                kept = [v.kept for v in grows if v.kept is not None]
                after = kept[-1] if kept else peak
                length[name] = after
                cells[name].append(
                    RegionCell(
                        "window", bool(grows), before=before, peak=peak, after=after, double_buffer=double, read=read
                    )
                )
    return cells


def _lanes(plan: Plan, cells: dict[str, list[RegionCell]], shown: Sequence[int]) -> tuple[Lane, ...]:
    """Region lanes in dataflow order of first use; alike family members share one; fixed state shares one."""
    program = plan.program
    order: list[str] = []
    for stage in plan.clocks.stage_order:
        for access in program.stages[stage].accesses:
            if access.region not in order:
                order.append(access.region)
    order += sorted(name for name in program.regions if name not in order)

    def seq(name: str) -> tuple[RegionCell, ...]:
        return tuple(cells[name][i] for i in shown)

    lanes: list[Lane] = []
    done: set[str] = set()
    fixed = [name for name in order if program.regions[name].fixed]
    for name in order:
        if name in done or program.regions[name].fixed:
            continue
        region = program.regions[name]
        members = [name]
        if region.family is not None:
            family = program.families[region.family]
            alike = [m for m in family if m not in done and seq(m) == seq(name)]
            if len(alike) == len(family):
                members = alike
        done.update(members)
        label = _member_range(members) + (f" ×{len(members)}" if len(members) > 1 else "")
        lanes.append(Lane(label, tuple(members), region.clock, seq(name)))
    if fixed:
        merged = []
        for i in shown:
            states = [cells[name][i] for name in fixed]
            merged.append(RegionCell("fixed", any(s.touched for s in states), read=any(s.read for s in states)))
        lanes.append(Lane(FIXED_LANE, tuple(fixed), None, tuple(merged)))
    return tuple(lanes)


def _stage_cells(plan: Plan, instants: int, traced: int) -> dict[str, tuple[StageCell, ...]]:
    graph_of = {graph.signature: graph for graph in plan.capture.graphs}
    fired = {(f.instant, f.stage): graph_of[f.signature] for f in plan.trace.firings}
    result = {}
    for stage in plan.clocks.stage_order:
        row = []
        for instant in range(instants):
            graph = fired.get((_representative(plan, instant, traced), stage))
            row.append(StageCell(False) if graph is None else StageCell(True, graph.key, graph.captured))
        result[stage] = tuple(row)
    return result


def _columns(
    phases: Sequence[str], stage_cells: Mapping[str, Sequence[StageCell]], lanes: Sequence[Lane]
) -> tuple[Column, ...]:
    """Collapse runs of alike instants (same graphs, same kind of change, numbers moving by a constant
    step) into one column; the session's first instants and short runs stay one column each; the
    repeats of the steady period after the first one become a single column."""
    count = len(phases)

    def shape(i: int) -> tuple:
        return (
            phases[i],
            tuple(cells[i].shape_key() for cells in stage_cells.values()),
            tuple(lane.cells[i].shape_key() for lane in lanes),
        )

    def numbers(i: int) -> tuple:
        return tuple(cells[i].graph for cells in stage_cells.values()) + tuple(
            n for lane in lanes for n in lane.cells[i].numbers()
        )

    columns: list[Column] = []
    i = 0
    while i < count:
        if phases[i] == "repeat":
            columns.append(Column(i, count - 1, "repeat"))
            break
        j = i
        if i >= HEAD_INSTANTS:
            step = None
            while j + 1 < count and shape(j + 1) == shape(i):
                delta = tuple(b - a for a, b in zip(numbers(j), numbers(j + 1)))
                if step is not None and delta != step:
                    break
                step = delta
                j += 1
        if j - i + 1 >= MIN_RUN:
            columns.append(Column(i, j, phases[i]))
            i = j + 1
        else:
            columns.append(Column(i, i, phases[i]))
            i += 1
    return tuple(columns)


def build_timeline(plan: Plan, ticks: int | None = None) -> Timeline:
    """The timeline's data: `ticks` instants from session start (default: warm-up + one steady period)."""
    traced = max((f.instant for f in plan.trace.firings), default=-1) + 1
    instants = traced if ticks is None else ticks
    if not plan.trace.periodic:
        default = NON_PERIODIC_HYPERPERIODS * plan.clocks.instants_per_hyperperiod
        instants = min(instants if ticks is not None else default, traced)
    phases = tuple(_phase_of(plan, i) for i in range(instants))
    cells = _region_cells(plan, traced)
    shown = [_representative(plan, i, traced) for i in range(instants)]
    lanes = _lanes(plan, cells, shown)
    stage_cells = _stage_cells(plan, instants, traced)
    return Timeline(instants, traced, phases, stage_cells, lanes, _columns(phases, stage_cells, lanes))


# --- timeline: drawing --------------------------------------------------------------------------


def _instant_word(plan: Plan) -> str:
    clocks = {plan.program.stages[s].clock for s in plan.clocks.stage_order}
    return clocks.pop() if len(clocks) == 1 else "instant"


def _range_text(first: int, last: int, word: str) -> str:
    return f"{word} {first}" if first == last else f"{word}s {first}–{last}"


def _time_text(plan: Plan, column: Column) -> str:
    start = seconds(plan.clocks.instant_time(column.first))
    if column.count == 1:
        return start
    return f"{start} – {seconds(plan.clocks.instant_time(column.last))}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _phase_label(plan: Plan, phase: str, columns: Sequence[Column], word: str, timeline: Timeline) -> str:
    trace = plan.trace
    first, last = columns[0].first, columns[-1].last
    span = f"{seconds(plan.clocks.instant_time(first))} – {seconds(plan.clocks.instant_time(last + 1))}"
    if phase == "warmup":
        shown = last - first + 1
        text = f"WARM-UP · {_plural(trace.warmup_instants, word)}"
        if shown < trace.warmup_instants:
            text += f" (first {shown} shown)"
        if trace.shape_warmup_instants < trace.warmup_instants:
            text += f" · shapes already repeat from {word} {trace.shape_warmup_instants}: only fills change"
        return f"<B>{_esc(text)}</B><BR/>{_small(_esc(span))}"
    if phase == "steady":
        shown = last - first + 1
        text = f"STEADY PERIOD · {_plural(trace.period_instants, word)}, {seconds(plan.clocks.hyperperiod)}"
        if shown < trace.period_instants:
            text += f" (first {shown} shown)"
        return f"<B>{_esc(text)}</B><BR/>{_small(_esc('repeats forever · ' + span))}"
    if phase == "repeat":
        periods = Fraction(last - first + 1, trace.period_instants)
        return f"<B>REPEATS</B><BR/>{_small(_esc(f'{float(periods):g} more periods'))}"
    text = f"NO STEADY STATE · first {_plural(timeline.instants, word)} of {timeline.traced} traced"
    return f"<B>{_esc(text)}</B><BR/>{_small(_esc((trace.reason or '') + ' · --ticks N shows more'))}"


def _eager_td(content: str) -> str:
    return _td(content, BGCOLOR="white", BORDER=1, STYLE="dashed", COLOR="#555555")


def _stage_td(plan: Plan, column: Column, cells: Sequence[StageCell]) -> str:
    run = [cells[i] for i in range(column.first, column.last + 1)]
    firing = [c for c in run if c.fires]
    if not firing:
        return _td("", BGCOLOR=EMPTY_STAGE, BORDER=1, COLOR=GRID)
    graphs = sorted({c.graph for c in firing})
    if column.phase == "repeat":
        captured = sorted({c.graph for c in firing if c.captured})
        text = " ".join(f"g{k}" for k in captured) + (" + eager" if len(captured) < len(graphs) else "")
        if not captured:
            return _eager_td("<I>eager</I>")
        share = 1 / len(captured)
        colours = [_graph_colour(k) for k in captured]
        bg = ":".join(f"{c};{share:.3f}" if n < len(colours) - 1 else c for n, c in enumerate(colours))
        return _td(_esc(text), BGCOLOR=bg if len(colours) <= 2 else colours[0], BORDER=1, COLOR=GRID)
    times = f" ×{len(firing)}" if len(firing) > 1 else ""
    if len(graphs) == 1:
        names, note = f"g{graphs[0]}", ""
    else:
        names, note = f"g{graphs[0]}..g{graphs[-1]}", f"<BR/>{_small(_esc(_plural(len(graphs), 'graph')))}"
    if not firing[0].captured:
        return _eager_td(f"<I>eager</I>{_esc(times)}<BR/>{_small(_esc('shapes of ' + names), IDLE_TEXT)}")
    bg = _graph_colour(graphs[0]) if len(graphs) == 1 else f"{_graph_colour(graphs[0])}:{_graph_colour(graphs[-1])}"
    return _td(f"<B>{_esc(names)}</B>{_esc(times)}{note}", BGCOLOR=bg, BORDER=1, COLOR=GRID)


def _progress(values: Sequence[int]) -> str:
    return str(values[0]) if values[0] == values[-1] else f"{values[0]}..{values[-1]}"


def _region_text(cells: Sequence[RegionCell]) -> tuple[str, bool]:
    """The cell text for a run of cells (one or more alike instants) and whether it is muted."""
    cell = cells[0]
    single = len(cells) == 1
    afters = [c.after for c in cells]
    step = "" if single or afters[0] == afters[-1] else f" (+{afters[1] - afters[0]} each)"
    if cell.kind == "fixed":
        if cell.touched:
            return "updated in place", False
        return ("read", False) if cell.read else ("·", True)
    if cell.kind == "ring":
        return f"fill {_progress(afters)}/{cell.size}{step}", not cell.touched
    if cell.kind == "scratch":
        if not cell.touched:
            return "·", True
        if cell.module_sized:
            return "sized by module", False
        return _progress([c.peak for c in cells]), False
    if not cell.touched:
        return _progress(afters), True
    trim = f" ✂{_progress(afters)}" if cell.trimmed else ""
    if single or (afters[0] == afters[-1] and cells[0].before == cells[-1].before):
        return (
            f"{_progress([c.before for c in cells])} +{cell.peak - cell.before} → "
            f"{_progress([c.peak for c in cells])}{trim}",
            False,
        )
    return f"{_progress(afters)}{step}" + (" ✂" if cell.trimmed else ""), False


def _region_td(plan: Plan, lane: Lane, column: Column, colour: str) -> str:
    if column.phase == "repeat":
        return _td(_small("as in the steady period", IDLE_TEXT), BORDER=1, COLOR=GRID)
    cells = list(lane.cells[column.first : column.last + 1])
    text, muted = _region_text(cells)
    last = cells[-1]
    capacity = _lane_capacity(plan, lane)
    fraction = None
    if last.kind == "ring" and last.size:
        fraction = last.after / last.size
    elif last.kind == "window" and capacity:
        fraction = last.after / capacity
    elif last.kind == "scratch" and capacity and last.touched:
        fraction = last.peak / capacity
    extra = ""
    if last.double_buffer:
        extra = "<BR/>" + _small("⇆ double buffer")
    body = _esc(text) + extra
    if muted:
        body = f'<FONT COLOR="{IDLE_TEXT}">{body}</FONT>'
    bg = _bar(_lighten(colour, 0.55), fraction) if fraction is not None else "white"
    if last.trimmed:
        return _td(body, BGCOLOR=bg, BORDER=2, COLOR=TRIM_BORDER)
    return _td(body, BGCOLOR=bg, BORDER=1, COLOR=GRID)


def _lane_capacity(plan: Plan, lane: Lane) -> int | None:
    region = plan.schedule.regions.get(lane.members[0])
    return None if region is None else region.capacity


def _lane_label(plan: Plan, lane: Lane, colour: str) -> str:
    program = plan.program
    if lane.name == FIXED_LANE:
        total = sum(plan.schedule.regions[m].bytes for m in lane.members)
        names = _group_names(program, lane.members)
        return (
            f"<B>{_esc(lane.name)}</B><BR/>{_small(_esc(names))}<BR/>"
            f"{_small(_esc(f'{len(lane.members)} tensors, {human_bytes(total)}, no time axis'), IDLE_TEXT)}"
        )
    region = program.regions[lane.members[0]]
    plan_region = plan.schedule.regions[lane.members[0]]
    role = {"input": "input · ", "output": "output · "}.get(region.role, "")
    clock = f"{region.clock} ({_rate_text(program.clocks[region.clock].rate)})"
    each = " each" if len(lane.members) > 1 else ""
    detail = f"{role}{region.retention.describe()} · {clock}"
    size = f"capacity {plan_region.capacity} · {human_bytes(plan_region.bytes)}{each}"
    return (
        f'<FONT COLOR="{colour}">■</FONT> <B>{_esc(lane.name)}</B><BR/>{_small(_esc(detail))}<BR/>'
        f"{_small(_esc(size), IDLE_TEXT)}"
    )


def _group_names(program: Program, names: Sequence[str]) -> str:
    """Region names with whole families written `kv_end[0..7]`."""
    parts: list[str] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        family = program.regions[name].family
        if family is not None and all(m in names for m in program.families[family]):
            members = program.families[family]
            parts.append(_member_range(list(members)))
            seen.update(members)
        else:
            parts.append(name)
            seen.add(name)
    return ", ".join(parts)


def _stage_label(plan: Plan, stage: str) -> str:
    info = plan.program.stages[stage]
    timing = plan.clocks.stages[stage]
    target = f"{info.callable_kind} {info.target or '(root)'}"
    per = f"{info.clock} · {_param_text(timing.per_cadence)}/cadence"
    return f"<B>{_esc(stage)}</B><BR/>{_small(_esc(target))}<BR/>{_small(_esc(per), IDLE_TEXT)}"


MAX_LEGEND_ROWS = 24
FOLD_GRAPHS = 4  # this many consecutive alike graphs of one stage share one legend row


def _graph_legend_rows(plan: Plan) -> list[str]:
    """One row per graph: its colour, stage, what tells it apart from the stage's other graphs, use.

    Runs of consecutive graphs of one stage used alike (a window filling up: one graph per warm-up
    firing) fold into one row `g5..g21`; past MAX_LEGEND_ROWS rows the middle is left out.
    """
    groups: list[list] = []
    for graph in plan.capture.graphs:
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and last.stage == graph.stage
            and last.key + 1 == graph.key
            and (last.captured, last.steady, len(last.firings)) == (graph.captured, graph.steady, len(graph.firings))
        ):
            groups[-1].append(graph)
        else:
            groups.append([graph])
    rows_of: list[list] = []
    for group in groups:
        rows_of.extend([group] if len(group) >= FOLD_GRAPHS else [[g] for g in group])
    hidden = 0
    if len(rows_of) > MAX_LEGEND_ROWS:
        hidden = sum(len(r) for r in rows_of[MAX_LEGEND_ROWS - 4 : -4])
        rows_of = rows_of[: MAX_LEGEND_ROWS - 4] + [[]] + rows_of[-4:]
    descriptions = _graph_descriptions(plan, [g for row in rows_of for g in (row[:1] + row[-1:])])
    rows = []
    for row in rows_of:
        if not row:
            rows.append(
                f'<TR><TD COLSPAN="4" ALIGN="LEFT">{_esc(f"… {hidden} more graphs (dsl plan lists them all)")}</TD></TR>'
            )
            continue
        first, last = row[0], row[-1]
        each = " each" if len(row) > 1 else ""
        used = f"{_plural(len(first.firings), 'firing')}{each}, {'steady' if first.steady else 'warm-up only'}"
        name = f"g{first.key}" if len(row) == 1 else f"g{first.key}..g{last.key}"
        description = descriptions[first.key]
        if len(row) > 1:
            used = f"{len(row)} graphs, " + used
            description = f"{description} … {descriptions[last.key]}"
        if first.captured:
            colour = (
                _graph_colour(first.key) if len(row) == 1 else f"{_graph_colour(first.key)}:{_graph_colour(last.key)}"
            )
            swatch = _td(f"<B>{name}</B>", BGCOLOR=colour, BORDER=1, COLOR=GRID)
        else:
            swatch = _eager_td(f"<I>{name}</I>")
            used += " · over the graph budget: eager"
        rows.append(
            "<TR>"
            + swatch
            + _td(_esc(first.stage), ALIGN="LEFT")
            + _td(_esc(description), ALIGN="LEFT")
            + _td(_esc(used), ALIGN="LEFT")
            + "</TR>"
        )
    return rows


def _graph_descriptions(plan: Plan, shown: Sequence) -> dict[int, str]:
    """Per shown graph, the views that differ among the stage's graphs (the exact shapes it is for)."""
    program = plan.program
    by_stage: dict[str, list] = {}
    for graph in plan.capture.graphs:
        by_stage.setdefault(graph.stage, []).append(graph)
    first_firing = {}
    for firing in plan.trace.firings:
        first_firing.setdefault(firing.signature, firing)
    descriptions: dict[int, str] = {}
    for stage, graphs in by_stage.items():
        wanted = [g for g in shown if g.stage == stage]
        if not wanted:
            continue
        if len(graphs) == 1:
            descriptions[graphs[0].key] = "the only graph of this stage: every firing replays it"
            continue
        views = {g.key: first_firing[g.signature].views for g in graphs}
        if len({len(v) for v in views.values()}) != 1:
            for graph in wanted:
                descriptions[graph.key] = ", ".join(f"{v.region} {_shape_text(v.shape)}" for v in views[graph.key])
            continue
        width = len(views[graphs[0].key])
        varying_key = [len({views[g.key][p].key() for g in graphs}) > 1 for p in range(width)]
        varying_shape = [len({views[g.key][p].shape for g in graphs}) > 1 for p in range(width)]
        for graph in wanted:
            parts: list[tuple[str, str]] = []
            for position, view in enumerate(views[graph.key]):
                if not varying_key[position]:
                    continue
                if varying_shape[position]:
                    parts.append((view.region, f"{view.kind} {_shape_text(view.shape)}"))
                else:
                    parts.append((view.region, f"{view.kind} at {view.offset}, kept {view.kept}"))
            descriptions[graph.key] = _fold_families(program, parts)
    return descriptions


def _fold_families(program: Program, parts: Sequence[tuple[str, str]]) -> str:
    """`region detail` pairs joined, whole families with one detail written once as `kv[0..7]`."""
    texts: list[str] = []
    done: set[tuple[str, str]] = set()
    present = set(parts)
    for region, detail in parts:
        if (region, detail) in done:
            continue
        family = program.regions[region].family
        if family is not None:
            members = program.families[family]
            if all((m, detail) in present for m in members):
                texts.append(f"{_member_range(list(members))} {detail}")
                done.update((m, detail) for m in members)
                continue
        texts.append(f"{region} {detail}")
        done.add((region, detail))
    return ", ".join(texts) if texts else "same shapes"


def render_timeline(plan: Plan, ticks: int | None = None) -> graphviz.Digraph:
    timeline = build_timeline(plan, ticks)
    colours = _clock_colours(plan.program)
    word = _instant_word(plan)

    groups: list[list[Column]] = []
    for column in timeline.columns:
        if groups and groups[-1][0].phase == column.phase:
            groups[-1].append(column)
        else:
            groups.append([column])
    band = {"warmup": WARMUP_BAND, "steady": STEADY_BAND, "repeat": REPEAT_BAND, "growing": GROWING_BAND}

    def row(label: str, cells_of, label_bg: str = "white") -> str:
        parts = [_td(label, ALIGN="LEFT", BALIGN="LEFT", BGCOLOR=label_bg, BORDER=1, COLOR=GRID)]
        for n, group in enumerate(groups):
            if n:
                parts.append(_td("", BGCOLOR=SEPARATOR, WIDTH=3))
            parts.extend(cells_of(group))
        return "<TR>" + "".join(parts) + "</TR>"

    rows = [
        row(
            "<B>phase</B>",
            lambda g: [
                _td(
                    _phase_label(plan, g[0].phase, g, word, timeline),
                    COLSPAN=len(g),
                    BGCOLOR=band[g[0].phase],
                    BORDER=1,
                    COLOR=GRID,
                )
            ],
        ),
        row(
            "<B>time</B>",
            lambda g: [
                _td(_esc(_time_text(plan, c)), BGCOLOR=_lighten(band[c.phase], 0.5), BORDER=1, COLOR=GRID) for c in g
            ],
        ),
        row(
            f"<B>{_esc(word)}</B>",
            lambda g: [
                _td(
                    _esc(_range_text(c.first, c.last, word)) + (_small(_esc(f" ×{c.count}")) if c.count > 1 else ""),
                    BGCOLOR=_lighten(band[c.phase], 0.5),
                    BORDER=1,
                    COLOR=GRID,
                )
                for c in g
            ],
        ),
        row(
            f"<B>STAGES</B> {_small('colour = the CUDA graph replayed')}",
            lambda g: [_td("", BGCOLOR="#efefef", BORDER=1, COLOR=GRID, COLSPAN=len(g))],
            "#efefef",
        ),
    ]
    for stage in plan.clocks.stage_order:
        cells = timeline.stage_cells[stage]
        rows.append(row(_stage_label(plan, stage), lambda g, cells=cells: [_stage_td(plan, c, cells) for c in g]))
    rows.append(
        row(
            f"<B>REGIONS</B> {_small('length or fill after the ' + _esc(word) + '; bar = share of capacity')}",
            lambda g: [_td("", BGCOLOR="#efefef", BORDER=1, COLOR=GRID, COLSPAN=len(g))],
            "#efefef",
        )
    )
    for lane in timeline.lanes:
        colour = colours.get(lane.clock, FIXED_COLOUR) if lane.clock else FIXED_COLOUR
        rows.append(
            row(
                _lane_label(plan, lane, colour),
                lambda g, lane=lane, colour=colour: [_region_td(plan, lane, c, colour) for c in g],
            )
        )

    graph = _new_digraph("timeline", plan, "timeline", rankdir="TB", nodesep="0.3", ranksep="0.3")
    graph.node("lanes", _table(rows, spacing=0, padding=5), shape="plaintext")
    graph.node("legend", _timeline_legend(plan, timeline, word), shape="plaintext")
    graph.edge("lanes", "legend", style="invis")
    return graph


def _timeline_legend(plan: Plan, timeline: Timeline, word: str) -> str:
    trace, capture = plan.trace, plan.capture
    summary = []
    if trace.periodic:
        warm = seconds(plan.clocks.instant_time(trace.warmup_instants)) if trace.warmup_instants else "0 s"
        summary.append(
            f"warm-up {_plural(trace.warmup_instants, word)} ({warm}), then a steady period of "
            f"{_plural(trace.period_instants, word)} ({seconds(plan.clocks.hyperperiod)}) repeated forever"
        )
    else:
        summary.append(f"no steady state ({trace.reason}); {_plural(timeline.instants, word)} shown")
    summary.append(
        f"{len(capture.captured)} of {_plural(len(capture.graphs), 'graph')} captured; "
        f"{capture.eager_firings} eager firings in the warm-up and one period"
    )
    rows = [f'<TR><TD COLSPAN="4" ALIGN="LEFT"><B>Legend</B> — {_esc("; ".join(summary))}</TD></TR>']
    rows += _graph_legend_rows(plan)
    samples = [
        (_eager_td("<I>eager</I>"), "a firing that runs eagerly (no graph: over the budget or outside the plan)"),
        (_td("", BGCOLOR=EMPTY_STAGE, BORDER=1, COLOR=GRID), f"the stage does not fire at this {word}"),
        (
            _td(_esc("8 +2 → 10"), BGCOLOR=_bar(_lighten(CLOCK_PALETTE[0], 0.55), 0.4), BORDER=1, COLOR=GRID),
            "a kept history: units before, appended, after; the bar is the share of the region's capacity",
        ),
        (
            _td(
                _esc("250 +50 → 300 ✂250"),
                BGCOLOR=_bar(_lighten(CLOCK_PALETTE[0], 0.55), 1.0),
                BORDER=2,
                COLOR=TRIM_BORDER,
            ),
            "✂ trimmed back to its retention at the end of the instant (dark orange border)",
        ),
        (
            _td(_esc("fill 8..250/250 (+2 each)"), BORDER=1, COLOR=GRID),
            "a ring the module keeps whole: only its fill grows; a column over a run shows the first..last value",
        ),
        (_td(f'<FONT COLOR="{IDLE_TEXT}">25</FONT>', BORDER=1, COLOR=GRID), "grey text: held, not touched"),
        (
            _td(f'<FONT COLOR="{CLOCK_PALETTE[0]}">■</FONT> {_esc("region")}', BORDER=1, COLOR=GRID),
            "a region's square and fill bar take the colour of its clock (grey: fixed size)",
        ),
        (
            _td(_small("⇆ double buffer"), BORDER=1, COLOR=GRID),
            "the append or trim moves kept units onto overlapping memory: staged through a double buffer",
        ),
        (_td("", BGCOLOR=SEPARATOR, WIDTH=3), "phase boundary: warm-up | steady period | repeats"),
    ]
    for swatch, text in samples:
        rows.append("<TR>" + swatch + _td(_esc(text), ALIGN="LEFT", COLSPAN=3) + "</TR>")
    return _table(rows, spacing=2, padding=3)


# --- graph: the dataflow ------------------------------------------------------------------------


def _region_groups(program: Program) -> list[tuple[str, tuple[str, ...]]]:
    """(node name, members): one node per family, one per plain region, sorted by name."""
    groups: dict[str, tuple[str, ...]] = {}
    for name, region in program.regions.items():
        if region.family is not None:
            groups.setdefault(region.family, program.families[region.family])
        else:
            groups[name] = (name,)
    return sorted(groups.items())


def _read_label(access: Access) -> str:
    if access.window == "last":
        text = f"last {access.count}"
    elif access.window == "new":
        text = "new" + (f" + {access.context} older" if access.context else "")
    else:
        text = "all"
    if access.lookahead:
        text += f" ({access.lookahead} lookahead)"
    if access.prev:
        text = "prev " + text
    if access.alias:
        text += f" as {access.alias}"
    return "read " + text


def _write_label(access: Access) -> str:
    verb = access.kind
    if access.advance is None:
        return f"{verb} (in place)" if verb == "update" else f"{verb} (length set by the module)"
    text = f"{verb} +{access.advance}"
    if access.latency:
        text += f" (first firing −{access.latency}{', never released' if access.latency_dropped else ''})"
    return text


def _region_node_label(plan: Plan, name: str, members: Sequence[str]) -> str:
    program = plan.program
    region = program.regions[members[0]]
    allocation = plan.schedule.regions[members[0]]
    count = len(members)
    title = f"{_member_range(members)} ×{count}" if count > 1 else name
    retention = "fixed (no time axis)" if region.fixed else region.retention.describe()
    each = " each" if count > 1 else ""
    lines = [f"<B>{_esc(title)}</B>", _esc(f"{_declared_shape(region)} · {retention}")]
    if allocation.capacity is not None:
        lines.append(_esc(f"capacity {allocation.capacity} → {_shape_text(allocation.shape)}"))
    size = f"{human_bytes(allocation.bytes)}{each}"
    if count > 1:
        size += f" = {human_bytes(allocation.bytes * count)}"
    if allocation.stock_bytes is not None:
        size += f" · stock {human_bytes(allocation.stock_bytes)}{each}"
    lines.append(_esc(size))
    if allocation.double_buffer_bytes:
        lines.append(_esc(f"double buffer {human_bytes(allocation.double_buffer_bytes)}"))
    if region.bind:
        lines.append(_small(_esc("bind " + region.bind), IDLE_TEXT, 8))
    return "<" + "<BR/>".join(lines) + ">"


def _stage_node_label(plan: Plan, stage: str) -> str:
    info = plan.program.stages[stage]
    timing = plan.clocks.stages[stage]
    graphs = [g for g in plan.capture.graphs if g.stage == stage]
    calls = f"{info.callable_kind} {info.target or '(root)'}"
    fires = (
        f"on {info.clock} · {_param_text(timing.per_cadence)} per cadence · {timing.per_hyperperiod} per hyperperiod"
    )
    replays = (
        _plural(len(graphs), "graph") + ": " + " ".join(f"g{g.key}" for g in graphs) + (" · rng" if info.rng else "")
    )
    rows = [f'<TR><TD BGCOLOR="#f0f0f0"><B>{_esc(stage)}</B></TD></TR>'] + [
        f"<TR><TD>{_esc(text)}</TD></TR>" for text in (calls, fires, replays)
    ]
    return '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) + "</TABLE>>"


def render_graph(plan: Plan) -> graphviz.Digraph:
    program = plan.program
    colours = _clock_colours(program)
    graph = _new_digraph(
        "dataflow", plan, "dataflow", rankdir="LR", newrank="true", compound="true", nodesep="0.25", ranksep="0.6"
    )
    groups = _region_groups(program)
    members_of = dict(groups)
    node_of_region = {m: _node_id("region", name) for name, members in groups for m in members}

    domains: dict[str | None, list[tuple[str, str]]] = {}
    for stage in sorted(program.stages):
        domains.setdefault(program.stages[stage].clock, []).append(("stage", stage))
    for name, members in groups:
        domains.setdefault(program.regions[members[0]].clock, []).append(("region", name))

    def add_nodes(target: graphviz.Digraph, items: Sequence[tuple[str, str]]) -> None:
        for kind, name in items:
            if kind == "stage":
                target.node(_node_id("stage", name), _stage_node_label(plan, name), shape="plaintext")
                continue
            region = program.regions[members_of[name][0]]
            style = {"shape": "cylinder", "style": "filled", "fillcolor": "white", "margin": "0.12,0.16"}
            if region.role == "input":
                style = {"shape": "invhouse", "style": "filled", "fillcolor": "#f4f4f4"}
            elif region.role == "output":
                style = {"shape": "house", "style": "filled", "fillcolor": "#f4f4f4"}
            elif not region.fixed and region.retention.kind == "scratch":
                style = {"shape": "box", "style": "dashed,filled", "fillcolor": "white"}
            elif region.fixed:
                style = {"shape": "box", "style": "rounded,filled", "fillcolor": "white"}
            target.node(_node_id("region", name), _region_node_label(plan, name, members_of[name]), **style)

    ranked = sorted(program.clocks.values(), key=lambda c: (-c.rate, c.name))
    for clock in ranked:
        if clock.name not in domains:
            continue
        colour = colours[clock.name]
        with graph.subgraph(name=_node_id("cluster", clock.name)) as cluster:
            label = f"clock {clock.name} · {_rate_text(clock.rate)} · period {seconds(clock.period)}"
            parents = [name for name in clock.uses if name in program.clocks]
            if parents:
                label += f" · from {', '.join(parents)}"
            cluster.attr(
                label=label,
                style="filled,rounded",
                color=colour,
                fillcolor=_lighten(colour, 0.85),
                fontname=FONT,
                fontsize="12",
                labeljust="l",
            )
            add_nodes(cluster, domains[clock.name])
    if None in domains:
        with graph.subgraph(name="cluster_fixed") as cluster:
            cluster.attr(
                label="fixed-size state (no time axis)",
                style="filled,rounded",
                color=FIXED_COLOUR,
                fillcolor=_lighten(FIXED_COLOUR, 0.85),
                fontname=FONT,
                fontsize="12",
                labeljust="l",
            )
            add_nodes(cluster, domains[None])

    for stage in plan.clocks.stage_order:
        info = program.stages[stage]
        seen: dict[tuple[str, str, str], int] = {}
        order: list[tuple[str, str, str, Access]] = []
        for access in info.accesses:
            node = node_of_region[access.region]
            label = _read_label(access) if access.kind == "read" else _write_label(access)
            key = (access.kind, node, label)
            if key not in seen:
                order.append((access.kind, node, label, access))
            seen[key] = seen.get(key, 0) + 1
        stage_node = _node_id("stage", stage)
        for kind, node, label, access in order:
            count = seen[(kind, node, label)]
            text = label + (f" ×{count}" if count > 1 else "")
            if kind == "read":
                style = "dashed" if access.prev else "solid"
                graph.edge(
                    node,
                    stage_node,
                    label=text,
                    style=style,
                    color="#555555",
                    constraint="false" if access.prev else "true",
                )
            elif kind == "update":
                # head labels sit beside the state, not in the fan of edges leaving the stage
                graph.edge(
                    stage_node,
                    node,
                    headlabel=text,
                    labelfontsize="9",
                    labelfontcolor="#1f5f9f",
                    labeldistance="3",
                    labelangle="30",
                    dir="both",
                    color="#1f5f9f",
                    penwidth="1.6",
                )
            else:
                graph.edge(stage_node, node, label=text, color="#222222", penwidth="1.6")
    # state a single stage updates sits in that stage's column (newrank lets rank=same cross clusters)
    owners: dict[str, set[str]] = {}
    for stage, info in program.stages.items():
        for access in info.accesses:
            if access.kind == "update":
                owners.setdefault(node_of_region[access.region], set()).add(stage)
    for stage in plan.clocks.stage_order:
        column = sorted(node for node, stages in owners.items() if stages == {stage})
        if column:
            with graph.subgraph() as same:
                same.attr(rank="same")
                same.node(_node_id("stage", stage))
                for node in column:
                    same.node(node)
    graph.node("legend", _graph_legend(), shape="plaintext")
    return graph


def _graph_legend() -> str:
    rows = [
        '<TR><TD ALIGN="LEFT" COLSPAN="2"><B>Legend</B></TD></TR>',
        '<TR><TD>box table</TD><TD ALIGN="LEFT">stage: what it calls, its clock, firings, the graphs captured</TD></TR>',
        '<TR><TD>cylinder</TD><TD ALIGN="LEFT">kept state (window or ring); inputs and outputs are house shapes; '
        "dashed boxes are per-instant scratch; rounded boxes fixed-size state</TD></TR>",
        '<TR><TD>cluster</TD><TD ALIGN="LEFT">a clock domain: the regions whose time axis advances on it, '
        "the stages that fire on it</TD></TR>",
        '<TR><TD>grey arrow</TD><TD ALIGN="LEFT">read, labelled with the span (dashed: the previous instant\'s value)</TD></TR>',
        '<TR><TD>black arrow</TD><TD ALIGN="LEFT">write, +units appended per firing</TD></TR>',
        '<TR><TD>blue two-way arrow</TD><TD ALIGN="LEFT">update (read-modify-write), +units per firing</TD></TR>',
    ]
    return _table(rows, border=1, spacing=0, padding=3)


# --- arena: the memory map ----------------------------------------------------------------------


@attrs.frozen
class _ArenaRow:
    """One row of a memory map: an allocation, or a run of family members of one size side by side."""

    names: tuple[str, ...]
    offset: int
    end: int
    bytes_each: int
    live: tuple[int, int] | None


def _arena_rows(plan: Plan, persistent: bool) -> list[_ArenaRow]:
    """Allocations in offset order; consecutive members of one family of equal size fold into one row."""
    program = plan.program
    rows: list[_ArenaRow] = []
    for allocation in plan.arena.allocations:
        if allocation.persistent != persistent:
            continue
        base = allocation.name.removesuffix("~double")
        family = program.regions[base].family if base in program.regions else None
        previous = rows[-1] if rows else None
        if (
            previous is not None
            and family is not None
            and not allocation.name.endswith("~double")
            and previous.bytes_each == allocation.bytes
            and previous.live == allocation.live
            and all(program.regions.get(n) is not None and program.regions[n].family == family for n in previous.names)
        ):
            rows[-1] = attrs.evolve(previous, names=previous.names + (allocation.name,), end=allocation.end)
            continue
        rows.append(_ArenaRow((allocation.name,), allocation.offset, allocation.end, allocation.bytes, allocation.live))
    return rows


def _row_title(program: Program, row: _ArenaRow) -> str:
    name = row.names[0]
    if name.endswith("~double"):
        return f"{name.removesuffix('~double')} (double buffer)"
    if len(row.names) > 1:
        return f"{_member_range(list(row.names))} ×{len(row.names)}"
    return name


def _row_colour(plan: Plan, colours: Mapping[str, str], row: _ArenaRow) -> str:
    region = plan.program.regions[row.names[0].removesuffix("~double")]
    return colours.get(region.clock, FIXED_COLOUR) if region.clock else FIXED_COLOUR


def render_arena(plan: Plan) -> graphviz.Digraph:
    program = plan.program
    arena = plan.arena
    colours = _clock_colours(program)
    graph = _new_digraph("arena", plan, "arena", rankdir="TB", nodesep="0.4", ranksep="0.4")

    # the pinned block, one per session: offsets, and demand beside stock on one scale
    session_rows = _arena_rows(plan, persistent=True)
    scale = max(
        [plan.schedule.regions[n].stock_bytes or 0 for r in session_rows for n in r.names if n in plan.schedule.regions]
        + [r.bytes_each for r in session_rows]
        + [1]
    )
    block = max(arena.session_bytes, 1)
    header = (
        "<TR>"
        + "".join(
            _td(f"<B>{h}</B>", BGCOLOR="#efefef", BORDER=1, COLOR=GRID)
            for h in (
                "offset",
                "region",
                "shape",
                "position in the session block",
                "demand (colour) vs stock (grey), one scale",
                "demand",
                "stock",
                "saving",
            )
        )
        + "</TR>"
    )
    allocations = _plural(sum(len(r.names) for r in session_rows), "allocation")
    title = _esc(f"Session block: pinned, one per session · {human_bytes(arena.session_bytes)}")
    subtitle = _esc(f" · {allocations}, offsets aligned to {arena.alignment} B")
    rows = [f'<TR><TD COLSPAN="8" ALIGN="LEFT"><B>{title}</B>{_small(subtitle)}</TD></TR>', header]
    for row in session_rows:
        region = plan.schedule.regions[row.names[0]]
        colour = _row_colour(plan, colours, row)
        count = len(row.names)
        offset = f"{row.offset:,}" + (f" … {row.end - row.bytes_each:,}" if count > 1 else "")
        stock = region.stock_bytes
        demand_text = human_bytes(row.bytes_each) + (" each" if count > 1 else "")
        saving = "-" if region.saving_fraction is None else f"{region.saving_fraction:.1%}"
        bars = (
            '<TABLE BORDER="0" CELLSPACING="1" CELLPADDING="0">'
            f'<TR><TD WIDTH="220" HEIGHT="7" FIXEDSIZE="TRUE" BGCOLOR="{_bar(colour, row.bytes_each / scale, "#f7f7f7")}"></TD></TR>'
            + (
                f'<TR><TD WIDTH="220" HEIGHT="7" FIXEDSIZE="TRUE" BGCOLOR="{_bar("#9a9a9a", stock / scale, "#f7f7f7")}"></TD></TR>'
                if stock is not None
                else ""
            )
            + "</TABLE>"
        )
        position = _span_bar(colour, row.offset / block, row.end / block)
        note = (
            f"<BR/>{_small(_esc('+ double buffer ' + human_bytes(region.double_buffer_bytes) + ' in scratch'))}"
            if region.double_buffer_bytes
            else ""
        )
        rows.append(
            "<TR>"
            + "".join(
                [
                    _td(_esc(offset), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    _td(
                        f'<FONT COLOR="{colour}">■</FONT> {_esc(_row_title(program, row))}{note}',
                        ALIGN="LEFT",
                        BORDER=1,
                        COLOR=GRID,
                    ),
                    _td(_esc(_shape_text(region.shape)), BORDER=1, COLOR=GRID),
                    _td(position, BORDER=1, COLOR=GRID),
                    _td(bars, BORDER=1, COLOR=GRID),
                    _td(_esc(demand_text), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    _td(_esc(human_bytes(stock) if stock is not None else "-"), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    _td(_esc(saving), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                ]
            )
            + "</TR>"
        )
    schedule = plan.schedule
    if schedule.stock_bytes:
        saved = schedule.stock_bytes - schedule.compared_demand_bytes
        total = (
            f"regions with a stock size: stock {human_bytes(schedule.stock_bytes)}, demand "
            f"{human_bytes(schedule.compared_demand_bytes)}, saving {human_bytes(saved)} "
            f"({saved / schedule.stock_bytes:.1%})"
        )
    else:
        total = "no region declares a stock size"
    rows.append(f'<TR><TD COLSPAN="8" ALIGN="LEFT">{_esc(total)}</TD></TR>')
    graph.node("session", _table(rows, spacing=0, padding=3), shape="plaintext")

    # the shared scratch block: offsets and which stage positions of an instant each allocation is live in
    scratch_rows = _arena_rows(plan, persistent=False)
    order = plan.clocks.stage_order
    positions = list(order) + ["(output out)"]
    scratch = max(arena.scratch_bytes, 1)
    head = (
        "<TR>"
        + "".join(
            _td(f"<B>{h}</B>", BGCOLOR="#efefef", BORDER=1, COLOR=GRID)
            for h in ("offset", "allocation", "bytes", "position in the scratch block")
        )
        + "".join(_td(_small(f"<B>{_esc(p)}</B>"), BGCOLOR="#efefef", BORDER=1, COLOR=GRID) for p in positions)
        + "</TR>"
    )
    width = 4 + len(positions)
    rows = [
        f'<TR><TD COLSPAN="{width}" ALIGN="LEFT"><B>{_esc("Scratch block: shared by all sessions, packed by liveness · " + human_bytes(arena.scratch_bytes))}</B>'
        f"{_small(_esc(' · columns: the stages of an instant in dataflow order; filled = live'))}</TD></TR>",
        head,
    ]
    if not scratch_rows:
        rows.append(f'<TR><TD COLSPAN="{width}">{_esc("(empty: every region is pinned)")}</TD></TR>')
    for row in scratch_rows:
        colour = _row_colour(plan, colours, row)
        live = row.live if row.live is not None else (0, len(positions) - 1)
        cells = [
            _td("", BGCOLOR=_lighten(colour, 0.3) if live[0] <= p <= live[1] else "white", BORDER=1, COLOR=GRID)
            for p in range(len(positions))
        ]
        region = plan.schedule.regions.get(row.names[0])
        size = human_bytes(row.bytes_each)
        if region is not None and region.stock_bytes:
            # a working buffer the stock code keeps at a fixed size: its saving belongs beside it
            size += f" (stock {human_bytes(region.stock_bytes)}, {region.saving_fraction:.1%} less)"
        rows.append(
            "<TR>"
            + "".join(
                [
                    _td(_esc(f"{row.offset:,}"), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    _td(
                        f'<FONT COLOR="{colour}">■</FONT> {_esc(_row_title(program, row))}',
                        ALIGN="LEFT",
                        BORDER=1,
                        COLOR=GRID,
                    ),
                    _td(_esc(size), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    _td(_span_bar(colour, row.offset / scratch, row.end / scratch), BORDER=1, COLOR=GRID),
                ]
                + cells
            )
            + "</TR>"
        )
    graph.node("scratch", _table(rows, spacing=0, padding=3), shape="plaintext")
    sessions_note = (
        f"one device allocation: sessions × {human_bytes(arena.session_bytes)} + "
        f"{human_bytes(arena.scratch_bytes)} shared scratch; 1 session = "
        f"{human_bytes(arena.total_bytes(1))}, 8 sessions = {human_bytes(arena.total_bytes(8))}"
    )
    legend = [
        f'<TR><TD ALIGN="LEFT"><B>Legend</B> — {_esc(sessions_note)}</TD></TR>',
        '<TR><TD ALIGN="LEFT">colour = the clock the region\'s time axis advances on (grey: fixed size); '
        "bars are to scale within their table</TD></TR>",
    ]
    used = {r.clock for r in program.regions.values()}
    for clock in sorted(program.clocks.values(), key=lambda c: (-c.rate, c.name)):
        if clock.name not in used:
            continue
        legend.append(
            f'<TR><TD ALIGN="LEFT"><FONT COLOR="{colours[clock.name]}">■</FONT> '
            f"{_esc(f'{clock.name} · {_rate_text(clock.rate)}')}</TD></TR>"
        )
    graph.node("legend", _table(legend, border=1, spacing=0, padding=3), shape="plaintext")
    graph.edge("session", "scratch", style="invis")
    graph.edge("scratch", "legend", style="invis")
    return graph


# --- entry points -------------------------------------------------------------------------------


def render_plan(plan: Plan, view: str = "timeline", ticks: int | None = None) -> graphviz.Digraph:
    """The `view` of `plan` as a graphviz Digraph (its `.source` is the deterministic DOT text)."""
    if view == "timeline":
        if ticks is not None and ticks < 1:
            raise ValueError(f"ticks must be at least 1, not {ticks}")
        return render_timeline(plan, ticks)
    if view == "graph":
        return render_graph(plan)
    if view == "arena":
        return render_arena(plan)
    raise ValueError(f"unknown view {view!r}; choose one of {', '.join(VIEWS)}")


def output_format(output: str | Path | None, fmt: str | None) -> str:
    """The format to write: `fmt` if given (it must agree with the output's suffix), else the suffix's."""
    suffix = Path(output).suffix.lower() if output is not None else ""
    implied = SUFFIX_FORMATS.get(suffix)
    if fmt is not None:
        if fmt not in FORMATS:
            raise RenderError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if implied is not None and implied != fmt:
            raise RenderError(
                f"the output {output} ends in {suffix} but --format is {fmt}; drop one or make them agree"
            )
        return fmt
    if output is None:
        return "dot"
    if implied is None:
        raise RenderError(
            f"cannot tell the format from {output!r}: end it in .dot, .svg, .png or .pdf, or give --format"
        )
    return implied


def to_bytes(graph: graphviz.Digraph, fmt: str) -> bytes:
    """DOT text (no extra program needed) or the output of Graphviz's `dot` for svg/png/pdf."""
    if fmt == "dot":
        return graph.source.encode("utf-8")
    try:
        return graph.pipe(format=fmt, quiet=True)
    except graphviz.ExecutableNotFound:
        raise DotMissing(
            f"writing {fmt} needs Graphviz's `dot` program, which is not on PATH; " + INSTALL_DOT
        ) from None
    except graphviz.CalledProcessError as error:
        detail = (error.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise RenderError(f"`dot` failed to write {fmt}: " + (detail[-1] if detail else str(error))) from None


def render_file(
    path: str | Path,
    params: Mapping[str, str] | None = None,
    view: str = "timeline",
    output: str | Path | None = None,
    ticks: int | None = None,
    fmt: str | None = None,
    max_graphs: int | None = None,
) -> bytes:
    """Plan `path` with `params`, render `view`, write it to `output` (if given) and return the bytes.

    Raises ClockError for a bad program and RenderError when the file cannot be written.
    """
    chosen = output_format(output, fmt)
    plan = make_plan(load_program(path, params), max_graphs=max_graphs)
    data = to_bytes(render_plan(plan, view, ticks), chosen)
    if output is not None:
        write_output(data, output)
    return data


def write_output(data: bytes, output: str | Path) -> None:
    try:
        Path(output).write_bytes(data)
    except OSError as error:
        raise RenderError(f"cannot write {output}: {error.strerror or error}") from None
