"""The timeline view (the main one): one HTML-table Gantt from session start through the warm-up and one
steady period.

One column per instant, or per run of alike instants (`COLSPAN` for the phase bands); one lane per
stage, each firing coloured by the CUDA graph it replays; one lane per region (family members that
behave alike share a lane) with its length or ring fill after the instant, a bar for fill / capacity,
a mark where the end-of-instant trim cuts it back, and on an output the units it loses at the boundary
before a firing (`loses L`, from the plan's sample accounting). `build_timeline` computes what is drawn
(tested on its own); `render_timeline` draws it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

import attrs
import graphviz

from duplexcadence.dsl.program import Access, Program
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, member_range, plural, seconds
from duplexcadence.interpreter.plans.trace import Firing
from duplexcadence.interpreter.views.style import (
    CLOCK_PALETTE,
    FIXED_COLOUR,
    GRID,
    IDLE_TEXT,
    LOSS_TEXT,
    SEPARATOR,
    TRIM_BORDER,
    bar,
    clock_colours,
    escape,
    graph_colour,
    html_table,
    lighten,
    new_digraph,
    param_text,
    rate_text,
    shape_text,
    small,
    td,
    wrap,
)
from duplexcadence.interpreter.views.view import DEFAULT_OPTIONS, ViewOptions

HEAD_INSTANTS = 3  # the first instants of a session are drawn one by one, even when alike
MIN_RUN = 3  # runs of at least this many alike instants share one column
NON_PERIODIC_HYPERPERIODS = 3  # without a steady state the timeline shows this much unless --ticks says
FIXED_LANE = "fixed-size state"  # the one lane all regions without a time axis share
WARMUP_BAND, STEADY_BAND, REPEAT_BAND, GROWING_BAND = "#fde2c4", "#d4ecd1", "#e6e6e6", "#f6d0d0"
EMPTY_STAGE = "#f4f4f4"
PRUNED_STAGE = "#fafafa"
PRUNED_WIDTH = 40  # characters per line of a pruned stage's reason in its lane's label


# --- what the timeline shows: per-instant lanes ---------------------------------------------------


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
    `dropped`: on an output, the units lost at the boundary before this instant's firing.
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
    dropped: int = 0

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
            self.dropped,
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


def _access_for(program: Program, stage: str, region: str, kind: str) -> Access | None:
    for access in program.stages[stage].accesses:
        if access.region == region and access.kind == kind:
            return access
    return None


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
    dropped = {
        (name, tick.instant): tick.dropped
        for name, output in plan.samples.outputs.items()
        for tick in output.ticks
        if tick.dropped
    }
    for instant, firings in enumerate(by_instant):
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
                        dropped=dropped.get((name, instant), 0),
                    )
                )
            else:
                before = length[name]
                peak = max([before] + [v.transient for v in grows])
                kept = [v.kept for _, v in touching if v.kept is not None]
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
        label = member_range(members) + (f" ×{len(members)}" if len(members) > 1 else "")
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
    fired = {(f.instant, f.stage): graph_of.get(f.signature) for f in plan.trace.firings}
    result = {}
    for stage in plan.clocks.stage_order:
        row = []
        for instant in range(instants):
            key = (_representative(plan, instant, traced), stage)
            graph = fired.get(key)
            if key not in fired:
                row.append(StageCell(False))
            elif graph is None:  # shapes decided at run time: eager
                row.append(StageCell(True, 0, False))
            else:
                row.append(StageCell(True, graph.key, graph.captured))
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


# --- drawing --------------------------------------------------------------------------------------


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


def _phase_label(plan: Plan, phase: str, columns: Sequence[Column], word: str, timeline: Timeline) -> str:
    trace = plan.trace
    first, last = columns[0].first, columns[-1].last
    span = f"{seconds(plan.clocks.instant_time(first))} – {seconds(plan.clocks.instant_time(last + 1))}"
    if phase == "warmup":
        shown = last - first + 1
        text = f"WARM-UP · {plural(trace.warmup_instants, word)}"
        if shown < trace.warmup_instants:
            text += f" (first {shown} shown)"
        if trace.shape_warmup_instants < trace.warmup_instants:
            text += f" · shapes already repeat from {word} {trace.shape_warmup_instants}: only fills change"
        return f"<B>{escape(text)}</B><BR/>{small(escape(span))}"
    if phase == "steady":
        shown = last - first + 1
        text = f"STEADY PERIOD · {plural(trace.period_instants, word)}, {seconds(plan.clocks.hyperperiod)}"
        if shown < trace.period_instants:
            text += f" (first {shown} shown)"
        return f"<B>{escape(text)}</B><BR/>{small(escape('repeats forever · ' + span))}"
    if phase == "repeat":
        periods = Fraction(last - first + 1, trace.period_instants)
        return f"<B>REPEATS</B><BR/>{small(escape(f'{float(periods):g} more periods'))}"
    text = f"NO STEADY STATE · first {plural(timeline.instants, word)} of {timeline.traced} traced"
    return f"<B>{escape(text)}</B><BR/>{small(escape((trace.reason or '') + ' · --ticks N shows more'))}"


def _eager_td(content: str) -> str:
    return td(content, BGCOLOR="white", BORDER=1, STYLE="dashed", COLOR="#555555")


def _stage_td(plan: Plan, column: Column, cells: Sequence[StageCell]) -> str:
    run = [cells[i] for i in range(column.first, column.last + 1)]
    firing = [c for c in run if c.fires]
    if not firing:
        return td("", BGCOLOR=EMPTY_STAGE, BORDER=1, COLOR=GRID)
    graphs = sorted({c.graph for c in firing})
    if column.phase == "repeat":
        captured = sorted({c.graph for c in firing if c.captured})
        text = " ".join(f"g{k}" for k in captured) + (" + eager" if len(captured) < len(graphs) else "")
        if not captured:
            return _eager_td("<I>eager</I>")
        share = 1 / len(captured)
        colours = [graph_colour(k) for k in captured]
        bg = ":".join(f"{c};{share:.3f}" if n < len(colours) - 1 else c for n, c in enumerate(colours))
        return td(escape(text), BGCOLOR=bg if len(colours) <= 2 else colours[0], BORDER=1, COLOR=GRID)
    times = f" ×{len(firing)}" if len(firing) > 1 else ""
    if len(graphs) == 1:
        names, note = f"g{graphs[0]}", ""
    else:
        names, note = f"g{graphs[0]}..g{graphs[-1]}", f"<BR/>{small(escape(plural(len(graphs), 'graph')))}"
    if not firing[0].captured:
        return _eager_td(f"<I>eager</I>{escape(times)}<BR/>{small(escape('shapes of ' + names), IDLE_TEXT)}")
    bg = graph_colour(graphs[0]) if len(graphs) == 1 else f"{graph_colour(graphs[0])}:{graph_colour(graphs[-1])}"
    return td(f"<B>{escape(names)}</B>{escape(times)}{note}", BGCOLOR=bg, BORDER=1, COLOR=GRID)


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
        return td(small("as in the steady period", IDLE_TEXT), BORDER=1, COLOR=GRID)
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
        extra = "<BR/>" + small("⇆ double buffer")
    if last.dropped:
        extra += "<BR/>" + small(escape(f"✕ {last.dropped} lost at the boundary"), LOSS_TEXT)
    body = escape(text) + extra
    if muted:
        body = f'<FONT COLOR="{IDLE_TEXT}">{body}</FONT>'
    bg = bar(lighten(colour, 0.55), fraction) if fraction is not None else "white"
    if last.trimmed:
        return td(body, BGCOLOR=bg, BORDER=2, COLOR=TRIM_BORDER)
    return td(body, BGCOLOR=bg, BORDER=1, COLOR=GRID)


def _lane_capacity(plan: Plan, lane: Lane) -> int | None:
    region = plan.schedule.regions.get(lane.members[0])
    return None if region is None else region.capacity


def _lane_label(plan: Plan, lane: Lane, colour: str) -> str:
    program = plan.program
    if lane.name == FIXED_LANE:
        total = sum(plan.schedule.regions[m].bytes for m in lane.members)
        names = _group_names(program, lane.members)
        return (
            f"<B>{escape(lane.name)}</B><BR/>{small(escape(names))}<BR/>"
            f"{small(escape(f'{len(lane.members)} tensors, {human_bytes(total)}, no time axis'), IDLE_TEXT)}"
        )
    region = program.regions[lane.members[0]]
    plan_region = plan.schedule.regions[lane.members[0]]
    role = {"input": "input · ", "output": "output · "}.get(region.role, "")
    assert region.clock is not None, "a lane of its own is a region with a time axis"
    clock = f"{region.clock} ({rate_text(program.clocks[region.clock].rate)})"
    each = " each" if len(lane.members) > 1 else ""
    detail = f"{role}{region.retention.describe()} · {clock}"
    size = f"capacity {plan_region.capacity} · {human_bytes(plan_region.bytes)}{each}"
    return (
        f'<FONT COLOR="{colour}">■</FONT> <B>{escape(lane.name)}</B><BR/>{small(escape(detail))}<BR/>'
        f"{small(escape(size), IDLE_TEXT)}"
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
            parts.append(member_range(list(members)))
            seen.update(members)
        else:
            parts.append(name)
            seen.add(name)
    return ", ".join(parts)


def _pruned_stage_label(plan: Plan, stage: str, reason: str) -> str:
    info = plan.pruning.source.stages[stage]
    target = f"{info.callable_kind} {info.target or '(root)'}"
    lines = [f"<I>{escape(stage)}</I>", escape(target), wrap(f"pruned: {reason}", PRUNED_WIDTH)]
    return f'<FONT COLOR="{IDLE_TEXT}">' + "<BR/>".join(lines) + "</FONT>"


def _pruned_td(columns: Sequence[Column]) -> str:
    return td("", BGCOLOR=PRUNED_STAGE, BORDER=1, COLOR=IDLE_TEXT, STYLE="dashed", COLSPAN=len(columns))


def _stage_label(plan: Plan, stage: str) -> str:
    info = plan.program.stages[stage]
    timing = plan.clocks.stages[stage]
    target = f"{info.callable_kind} {info.target or '(root)'}"
    per = f"{info.clock} · {param_text(timing.per_cadence)}/cadence"
    return f"<B>{escape(stage)}</B><BR/>{small(escape(target))}<BR/>{small(escape(per), IDLE_TEXT)}"


MAX_LEGEND_ROWS = 24
# Characters per line in the legend: it stays about as wide as the lanes whatever the graphs are for.
LEGEND_WIDTH = 90
DESCRIPTION_WIDTH = 64
USE_WIDTH = 32
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
                f'<TR><TD COLSPAN="4" ALIGN="LEFT">{escape(f"… {hidden} more graphs (dsl plan lists them all)")}</TD></TR>'
            )
            continue
        first, last = row[0], row[-1]
        each = " each" if len(row) > 1 else ""
        used = f"{plural(len(first.firings), 'firing')}{each}, {'steady' if first.steady else 'warm-up only'}"
        name = f"g{first.key}" if len(row) == 1 else f"g{first.key}..g{last.key}"
        description = descriptions[first.key]
        if len(row) > 1:
            used = f"{len(row)} graphs, " + used
            description = f"{description} … {descriptions[last.key]}"
        if first.captured:
            colour = graph_colour(first.key) if len(row) == 1 else f"{graph_colour(first.key)}:{graph_colour(last.key)}"
            swatch = td(f"<B>{name}</B>", BGCOLOR=colour, BORDER=1, COLOR=GRID)
        else:
            swatch = _eager_td(f"<I>{name}</I>")
            used += " · over the graph budget: eager"
        rows.append(
            "<TR>"
            + swatch
            + td(escape(first.stage), ALIGN="LEFT")
            + td(wrap(description, DESCRIPTION_WIDTH), ALIGN="LEFT", BALIGN="LEFT")
            + td(wrap(used, USE_WIDTH), ALIGN="LEFT", BALIGN="LEFT")
            + "</TR>"
        )
    return rows


def _graph_descriptions(plan: Plan, shown: Sequence) -> dict[int, str]:
    """Per shown graph, the views that differ among the stage's graphs (the exact shapes it is for)."""
    program = plan.program
    by_stage: dict[str, list] = {}
    for graph in plan.capture.graphs:
        by_stage.setdefault(graph.stage, []).append(graph)
    first_firing: dict[tuple, Firing] = {}
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
                descriptions[graph.key] = ", ".join(f"{v.region} {shape_text(v.shape)}" for v in views[graph.key])
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
                    parts.append((view.region, f"{view.kind} {shape_text(view.shape)}"))
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
                texts.append(f"{member_range(list(members))} {detail}")
                done.update((m, detail) for m in members)
                continue
        texts.append(f"{region} {detail}")
        done.add((region, detail))
    return ", ".join(texts) if texts else "same shapes"


def render_timeline(plan: Plan, options: ViewOptions = DEFAULT_OPTIONS) -> graphviz.Digraph:
    """The timeline of `options.ticks` instants from session start (default: warm-up + one steady period)."""
    ticks = options.ticks
    if ticks is not None and ticks < 1:
        raise ValueError(f"ticks must be at least 1, not {ticks}")
    timeline = build_timeline(plan, ticks)
    colours = clock_colours(plan.program)
    word = _instant_word(plan)

    groups: list[list[Column]] = []
    for column in timeline.columns:
        if groups and groups[-1][0].phase == column.phase:
            groups[-1].append(column)
        else:
            groups.append([column])
    band = {"warmup": WARMUP_BAND, "steady": STEADY_BAND, "repeat": REPEAT_BAND, "growing": GROWING_BAND}

    def row(label: str, cells_of, label_bg: str = "white") -> str:
        parts = [td(label, ALIGN="LEFT", BALIGN="LEFT", BGCOLOR=label_bg, BORDER=1, COLOR=GRID)]
        for n, group in enumerate(groups):
            if n:
                parts.append(td("", BGCOLOR=SEPARATOR, WIDTH=3))
            parts.extend(cells_of(group))
        return "<TR>" + "".join(parts) + "</TR>"

    rows = [
        row(
            "<B>phase</B>",
            lambda g: [
                td(
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
                td(escape(_time_text(plan, c)), BGCOLOR=lighten(band[c.phase], 0.5), BORDER=1, COLOR=GRID) for c in g
            ],
        ),
        row(
            f"<B>{escape(word)}</B>",
            lambda g: [
                td(
                    escape(_range_text(c.first, c.last, word)) + (small(escape(f" ×{c.count}")) if c.count > 1 else ""),
                    BGCOLOR=lighten(band[c.phase], 0.5),
                    BORDER=1,
                    COLOR=GRID,
                )
                for c in g
            ],
        ),
        row(
            f"<B>STAGES</B> {small('colour = the CUDA graph replayed')}",
            lambda g: [td("", BGCOLOR="#efefef", BORDER=1, COLOR=GRID, COLSPAN=len(g))],
            "#efefef",
        ),
    ]
    for stage in plan.clocks.stage_order:
        cells = timeline.stage_cells[stage]
        rows.append(row(_stage_label(plan, stage), lambda g, cells=cells: [_stage_td(plan, c, cells) for c in g]))
    for pruned in plan.pruning.stages:
        rows.append(row(_pruned_stage_label(plan, pruned.name, pruned.reason), lambda g: [_pruned_td(g)]))
    rows.append(
        row(
            f"<B>REGIONS</B> {small('length or fill after the ' + escape(word) + '; bar = share of capacity')}",
            lambda g: [td("", BGCOLOR="#efefef", BORDER=1, COLOR=GRID, COLSPAN=len(g))],
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

    graph = new_digraph("timeline", plan, "timeline", rankdir="TB", nodesep="0.3", ranksep="0.3")
    graph.node("lanes", html_table(rows, spacing=0, padding=5), shape="plaintext")
    graph.node("legend", _timeline_legend(plan, timeline, word), shape="plaintext")
    graph.edge("lanes", "legend", style="invis")
    return graph


def _timeline_legend(plan: Plan, timeline: Timeline, word: str) -> str:
    trace, capture = plan.trace, plan.capture
    summary = []
    if trace.periodic:
        warm = seconds(plan.clocks.instant_time(trace.warmup_instants)) if trace.warmup_instants else "0 s"
        summary.append(
            f"warm-up {plural(trace.warmup_instants, word)} ({warm}), then a steady period of "
            f"{plural(trace.period_instants, word)} ({seconds(plan.clocks.hyperperiod)}) repeated forever"
        )
    else:
        summary.append(f"no steady state ({trace.reason}); {plural(timeline.instants, word)} shown")
    summary.append(
        f"{len(capture.captured)} of {plural(len(capture.graphs), 'graph')} captured; "
        f"{capture.eager_firings} eager firings in the warm-up and one period"
    )
    lines = "<BR/>".join(wrap(text, LEGEND_WIDTH) for text in summary)
    rows = [f'<TR><TD COLSPAN="4" ALIGN="LEFT" BALIGN="LEFT"><B>Legend</B><BR/>{lines}</TD></TR>']
    rows += _graph_legend_rows(plan)
    samples = [
        (_eager_td("<I>eager</I>"), "a firing that runs eagerly (no graph: over the budget or outside the plan)"),
        (td("", BGCOLOR=EMPTY_STAGE, BORDER=1, COLOR=GRID), f"the stage does not fire at this {word}"),
        *(
            [
                (
                    td("", BGCOLOR=PRUNED_STAGE, BORDER=1, COLOR=IDLE_TEXT, STYLE="dashed"),
                    "a pruned stage: no output sees its work, so it never fires and its state has no bytes "
                    "(dsl plan says why; --no-prune runs it)",
                )
            ]
            if plan.pruning.stages
            else []
        ),
        (
            td(escape("8 +2 → 10"), BGCOLOR=bar(lighten(CLOCK_PALETTE[0], 0.55), 0.4), BORDER=1, COLOR=GRID),
            "a kept history: units before, appended, after; the bar is the share of the region's capacity",
        ),
        (
            td(
                escape("250 +50 → 300 ✂250"),
                BGCOLOR=bar(lighten(CLOCK_PALETTE[0], 0.55), 1.0),
                BORDER=2,
                COLOR=TRIM_BORDER,
            ),
            "✂ trimmed back to its retention at the end of the instant (dark orange border)",
        ),
        (
            td(escape("fill 8..250/250 (+2 each)"), BORDER=1, COLOR=GRID),
            "a ring the module keeps whole: only its fill grows; a column over a run shows the first..last value",
        ),
        (td(f'<FONT COLOR="{IDLE_TEXT}">25</FONT>', BORDER=1, COLOR=GRID), "grey text: held, not touched"),
        (
            td(f'<FONT COLOR="{CLOCK_PALETTE[0]}">■</FONT> {escape("region")}', BORDER=1, COLOR=GRID),
            "a region's square and fill bar take the colour of its clock (grey: fixed size)",
        ),
        (
            td(small("⇆ double buffer"), BORDER=1, COLOR=GRID),
            "the append or trim moves kept units onto overlapping memory: staged through a double buffer",
        ),
        (td("", BGCOLOR=SEPARATOR, WIDTH=3), "phase boundary: warm-up | steady period | repeats"),
    ]
    losses = [o for o in plan.samples.outputs.values() if o.dropped]
    if losses:
        lost = losses[0]
        samples.append(
            (
                td(small(escape(f"✕ {lost.loss} lost at the boundary"), LOSS_TEXT), BORDER=1, COLOR=GRID),
                f"an output's units lost at the boundary before the firing (`loses {lost.loss}`): the stream is "
                f"{plural(lost.dropped, lost.clock)} short of one offline call over {seconds(plan.samples.seconds)} "
                "(dsl plan, Samples)",
            )
        )
    for swatch, text in samples:
        rows.append("<TR>" + swatch + td(wrap(text, LEGEND_WIDTH), ALIGN="LEFT", BALIGN="LEFT", COLSPAN=3) + "</TR>")
    return html_table(rows, spacing=2, padding=3)
