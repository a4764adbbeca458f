"""The dataflow view (`--view graph`): stages in their order, the regions between them, and the read /
write / update edges with their spans and advances. The state only one stage touches is one table beside
that stage (one edge, not one per region); a clock's colour marks the regions and stages on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import graphviz

from duplexcadence.dsl.program import Access, Program, RegionInfo, StageInfo
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, member_range, plural, seconds
from duplexcadence.interpreter.views.style import (
    FIXED_COLOUR,
    IDLE_TEXT,
    clock_colours,
    declared_shape,
    escape,
    html_table,
    lighten,
    new_digraph,
    node_id,
    param_text,
    ranked_clocks,
    rate_text,
    small,
    wrap,
)
from duplexcadence.interpreter.views.view import DEFAULT_OPTIONS, ViewOptions


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
    loss = f" (−{access.loss} every firing, lost at each boundary)" if access.loss else ""
    if access.advance is None:
        return f"{verb} (in place)" if verb == "update" else f"{verb} (length set by the module){loss}"
    text = f"{verb} +{access.advance}"
    if access.latency:
        text += f" (first firing −{access.latency}{', never released' if access.latency_dropped else ''})"
    return text + loss


def _graph_keys(keys: Sequence[int]) -> str:
    """`g0 g3 g6`, or `g0..g71` for a run of consecutive keys."""
    if len(keys) > 3 and list(keys) == list(range(keys[0], keys[0] + len(keys))):
        return f"g{keys[0]}..g{keys[-1]}"
    return " ".join(f"g{k}" for k in keys)


def _memory_text(allocation, count: int) -> tuple[str, str]:
    """(demand, detail): `1000.0 KiB ×8 = 7.8 MiB` and the stock size and double buffer, if any."""
    demand = human_bytes(allocation.bytes)
    if count > 1:
        demand += f" ×{count} = {human_bytes(allocation.bytes * count)}"
    details = []
    if allocation.stock_bytes is not None:
        details.append(f"stock {human_bytes(allocation.stock_bytes)}" + (" each" if count > 1 else ""))
    if allocation.double_buffer_bytes:
        details.append(f"+ double buffer {human_bytes(allocation.double_buffer_bytes)}")
    return demand, ", ".join(details)


def _kept_text(region: RegionInfo, capacity: int | None) -> str:
    if region.fixed:
        return "fixed size"
    kept = region.retention.describe()
    return kept if capacity is None or region.retention.kind == "ring" else f"{kept} · capacity {capacity}"


def _region_node_label(plan: Plan, name: str, members: Sequence[str], colour: str) -> str:
    region = plan.program.regions[members[0]]
    allocation = plan.schedule.regions[members[0]]
    count = len(members)
    title = f"{member_range(members)} ×{count}" if count > 1 else name
    demand, detail = _memory_text(allocation, count)
    lines = [
        f'<FONT COLOR="{colour}">■</FONT> <B>{escape(title)}</B>',
        escape(declared_shape(region)),
        escape(_kept_text(region, allocation.capacity)),
        escape(demand),
    ]
    if detail:
        lines.append(small(escape(detail), IDLE_TEXT))
    return "<" + "<BR/>".join(lines) + ">"


def _stage_node_label(plan: Plan, stage: str, colour: str) -> str:
    info = plan.program.stages[stage]
    timing = plan.clocks.stages[stage]
    keys = [g.key for g in plan.capture.graphs if g.stage == stage]
    calls = f"{info.callable_kind} {info.target or '(root)'}"
    fires = f"on {info.clock} · {param_text(timing.per_cadence)}/cadence · {timing.per_hyperperiod}/hyperperiod"
    replays = plural(len(keys), "graph") + ": " + _graph_keys(keys) + (" · rng" if info.rng else "")
    rows = [f'<TR><TD BGCOLOR="{lighten(colour, 0.6)}"><B>{escape(stage)}</B></TD></TR>'] + [
        f"<TR><TD>{escape(text)}</TD></TR>" for text in (calls, fires, replays)
    ]
    return '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) + "</TABLE>>"


def _state_table_label(plan: Plan, stage: str, rows: Sequence[tuple[str, tuple[str, ...], str]], colours) -> str:
    """The regions only `stage` touches, one row each: (group name, members, what the stage does)."""
    program = plan.program
    total = sum(plan.schedule.regions[m].bytes for _, members, _ in rows for m in members)
    count = sum(len(members) for _, members, _ in rows)
    head = f"state of {stage} · {plural(count, 'region')} · {human_bytes(total)}"
    cells = [
        f'<TR><TD COLSPAN="4" ALIGN="LEFT" BGCOLOR="#efefef"><B>{escape(head)}</B></TD></TR>',
        "<TR>"
        + "".join(f'<TD ALIGN="LEFT">{small(f"<B>{h}</B>")}</TD>' for h in ("region", "shape · kept", "memory", "use"))
        + "</TR>",
    ]
    for name, members, use in rows:
        region = program.regions[members[0]]
        allocation = plan.schedule.regions[members[0]]
        colour = colours.get(region.clock, FIXED_COLOUR) if region.clock else FIXED_COLOUR
        count = len(members)
        title = f"{member_range(members)} ×{count}" if count > 1 else name
        demand, detail = _memory_text(allocation, count)
        cells.append(
            "<TR>"
            + f'<TD ALIGN="LEFT"><FONT COLOR="{colour}">■</FONT> {escape(title)}</TD>'
            + f'<TD ALIGN="LEFT" BALIGN="LEFT">{escape(declared_shape(region))}<BR/>'
            + f"{small(escape(_kept_text(region, allocation.capacity)), IDLE_TEXT)}</TD>"
            + f'<TD ALIGN="LEFT" BALIGN="LEFT">{escape(demand)}'
            + (f"<BR/>{small(escape(detail), IDLE_TEXT)}" if detail else "")
            + "</TD>"
            + f'<TD ALIGN="LEFT">{escape(use)}</TD>'
            + "</TR>"
        )
    return (
        '<<TABLE BORDER="1" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" COLOR="#1f5f9f">'
        + "".join(cells)
        + "</TABLE>>"
    )


def _access_labels(info: StageInfo, group_of: Mapping[str, str]) -> list[tuple[str, str, str, Access]]:
    """(kind, group, label, first access) per distinct use of a region group, in the stage's order;
    a label repeated over a family's members says how many (`update +2 ×8`)."""
    seen: dict[tuple[str, str, str], int] = {}
    order: list[tuple[str, str, str, Access]] = []
    for access in info.accesses:
        group = group_of[access.region]
        label = _read_label(access) if access.kind == "read" else _write_label(access)
        key = (access.kind, group, label)
        if key not in seen:
            order.append((access.kind, group, label, access))
        seen[key] = seen.get(key, 0) + 1
    return [
        (kind, group, label + (f" ×{seen[(kind, group, label)]}" if seen[(kind, group, label)] > 1 else ""), access)
        for kind, group, label, access in order
    ]


def render_dataflow(plan: Plan, options: ViewOptions = DEFAULT_OPTIONS) -> graphviz.Digraph:
    """Top to bottom in stage order: inputs, each stage with the table of the state only it touches
    beside it, what one stage hands the next, outputs; a clock's colour marks its regions and stages."""
    program = plan.program
    colours = clock_colours(program)
    graph = new_digraph("dataflow", plan, "dataflow", rankdir="TB", nodesep="0.35", ranksep="0.45", concentrate="true")
    groups = dict(_region_groups(program))
    group_of = {m: name for name, members in groups.items() for m in members}
    uses = {stage: _access_labels(program.stages[stage], group_of) for stage in plan.clocks.stage_order}
    users: dict[str, set[str]] = {}
    for stage, labels in uses.items():
        for _, group, _, _ in labels:
            users.setdefault(group, set()).add(stage)

    def private_to(group: str) -> str | None:
        """The one stage that touches `group`, when it is that stage's state (not an input or output)."""
        stages = users.get(group, set())
        region = program.regions[groups[group][0]]
        return next(iter(stages)) if len(stages) == 1 and region.role == "state" else None

    def colour_of(region: RegionInfo) -> str:
        return colours.get(region.clock, FIXED_COLOUR) if region.clock else FIXED_COLOUR

    for name, members in groups.items():
        if private_to(name) is not None or name not in users:
            continue
        region = program.regions[members[0]]
        fill = lighten(colour_of(region), 0.88)
        style = {"shape": "cylinder", "style": "filled", "fillcolor": fill, "margin": "0.1,0.12"}
        if region.role == "input":
            style = {"shape": "invhouse", "style": "filled", "fillcolor": fill}
        elif region.role == "output":
            style = {"shape": "house", "style": "filled", "fillcolor": fill}
        elif not region.fixed and region.retention.kind == "scratch":
            style = {"shape": "box", "style": "dashed,filled", "fillcolor": fill}
        elif region.fixed:
            style = {"shape": "box", "style": "rounded,filled", "fillcolor": fill}
        graph.node(node_id("region", name), _region_node_label(plan, name, members, colour_of(region)), **style)

    previous = None
    for stage in plan.clocks.stage_order:
        info = program.stages[stage]
        stage_node = node_id("stage", stage)
        graph.node(stage_node, _stage_node_label(plan, stage, colours[info.clock]), shape="plaintext")
        own = [(kind, group, label) for kind, group, label, _ in uses[stage] if private_to(group) == stage]
        if own:
            rows: dict[str, list[str]] = {}
            for _, group, label in own:
                rows.setdefault(group, []).append(label)
            state_node = node_id("state", stage)
            table_rows = [(group, groups[group], "; ".join(labels)) for group, labels in rows.items()]
            graph.node(state_node, _state_table_label(plan, stage, table_rows, colours), shape="plaintext")
            updates = any(kind == "update" for kind, _, _ in own)
            graph.edge(stage_node, state_node, dir="both" if updates else "back", color="#1f5f9f", penwidth="1.6")
            with graph.subgraph() as same:
                same.attr(rank="same")
                same.node(stage_node)
                same.node(state_node)
        if previous is not None:  # stage order is the vertical order, whatever the edges say
            graph.edge(previous, stage_node, style="invis")
        previous = stage_node
        for kind, group, label, access in uses[stage]:
            if private_to(group) == stage:
                continue
            node = node_id("region", group)
            if kind == "read":
                graph.edge(
                    node,
                    stage_node,
                    label=label,
                    style="dashed" if access.prev else "solid",
                    color="#555555",
                    constraint="false" if access.prev else "true",
                )
            elif kind == "update":
                graph.edge(stage_node, node, label=label, dir="both", color="#1f5f9f", penwidth="1.6")
            else:
                graph.edge(stage_node, node, label=label, color="#222222", penwidth="1.6")

    _draw_pruned(plan, graph, previous, groups)

    with graph.subgraph() as bottom:
        bottom.attr(rank="sink")
        bottom.node("clocks", _clock_legend(program, colours), shape="plaintext")
        bottom.node("legend", _graph_legend(bool(plan.pruning.stages)), shape="plaintext")
    return graph


PRUNED_GREY = "#9a9a9a"


def _pruned_stage_label(plan: Plan, stage: str, reason: str, left_out: Sequence[str]) -> str:
    """A pruned stage, greyed: what it would call, why it is pruned, the state left out with it."""
    info = plan.pruning.source.stages[stage]
    lines = [f"<I>{escape(stage)}</I>", escape(f"{info.callable_kind} {info.target or '(root)'}")]
    lines.append(wrap(f"pruned: {reason}", 44))
    if left_out:
        lines.append(small(wrap("left out: " + ", ".join(left_out), 44)))
    return f'<<FONT COLOR="{PRUNED_GREY}">' + "<BR/>".join(lines) + "</FONT>>"


def _draw_pruned(
    plan: Plan, graph: graphviz.Digraph, previous: str | None, groups: Mapping[str, tuple[str, ...]]
) -> None:
    """Below the kept stages, each pruned stage as a dashed grey box: its reason, the state only it touched
    (left out, no bytes), and dashed edges from the kept regions it would read and between pruned stages
    through the regions they would hand over."""
    pruning = plan.pruning
    if not pruning.stages:
        return
    source = pruning.source
    touched: dict[str, list[str]] = {}
    for region in pruning.regions:
        touched.setdefault(region.stages[0] if len(region.stages) == 1 else "", []).append(region.name)
    writer: dict[str, str] = {}
    for pruned in pruning.stages:
        for access in source.stages[pruned.name].writes():
            writer[access.region] = pruned.name
    for pruned in pruning.stages:
        own: dict[str, list[str]] = {}
        for name in touched.get(pruned.name, []):
            family = source.regions[name].family
            own.setdefault(family or name, []).append(name)
        left_out = [member_range(members) if len(members) > 1 else members[0] for members in own.values()]
        node = node_id("pruned", pruned.name)
        graph.node(
            node,
            _pruned_stage_label(plan, pruned.name, pruned.reason, left_out),
            shape="box",
            style="dashed",
            color=PRUNED_GREY,
        )
        if previous is not None:
            graph.edge(previous, node, style="invis")
        previous = node
        for access in source.stages[pruned.name].reads():
            if access.kind != "read":
                continue
            if access.region in plan.program.regions:
                group = next(name for name, members in groups.items() if access.region in members)
                graph.edge(
                    node_id("region", group),
                    node,
                    label=_read_label(access),
                    style="dashed",
                    color=PRUNED_GREY,
                    fontcolor=PRUNED_GREY,
                )
            elif writer.get(access.region) not in (None, pruned.name):
                graph.edge(
                    node_id("pruned", writer[access.region]),
                    node,
                    label=access.region,
                    style="dashed",
                    color=PRUNED_GREY,
                    fontcolor=PRUNED_GREY,
                )


def _clock_legend(program: Program, colours: Mapping[str, str]) -> str:
    rows = ['<TR><TD ALIGN="LEFT" COLSPAN="4"><B>Clocks</B> (colour of their regions and stages)</TD></TR>']
    for clock in ranked_clocks(program):
        parents = [name for name in clock.uses if name in program.clocks]
        rows.append(
            "<TR>"
            + f'<TD ALIGN="LEFT"><FONT COLOR="{colours[clock.name]}">■</FONT> {escape(clock.name)}</TD>'
            + f'<TD ALIGN="RIGHT">{escape(rate_text(clock.rate))}</TD>'
            + f'<TD ALIGN="RIGHT">{escape(seconds(clock.period))}</TD>'
            + f'<TD ALIGN="LEFT">{escape("from " + ", ".join(parents)) if parents else ""}</TD>'
            + "</TR>"
        )
    if any(region.fixed for region in program.regions.values()):
        rows.append(
            f'<TR><TD ALIGN="LEFT" COLSPAN="4"><FONT COLOR="{FIXED_COLOUR}">■</FONT> fixed size (no time axis)</TD></TR>'
        )
    return html_table(rows, border=1, spacing=0, padding=3)


def _graph_legend(pruned: bool) -> str:
    entries = [
        ("box table", "a stage: what it calls, its clock, its firings, the graphs captured for it"),
        ("blue-framed table", "the state only that stage touches, one row per region or family"),
        ("cylinder", "kept state that stages share; house shapes are inputs and outputs"),
        ("dashed box", "per-instant scratch; a rounded box is fixed-size state"),
        ("grey arrow", "read, with its span (dashed: the previous instant's value)"),
        ("black arrow", "write, +units appended per firing"),
        ("blue two-way arrow", "update (read-modify-write), +units per firing"),
    ]
    if pruned:
        entries.append(
            ("grey dashed box", "a pruned stage: no output sees its work; it never runs, its state has no bytes")
        )
    rows = ['<TR><TD ALIGN="LEFT" COLSPAN="2"><B>Legend</B></TD></TR>'] + [
        f'<TR><TD ALIGN="LEFT">{escape(shape)}</TD><TD ALIGN="LEFT">{escape(text)}</TD></TR>' for shape, text in entries
    ]
    return html_table(rows, border=1, spacing=0, padding=3)
