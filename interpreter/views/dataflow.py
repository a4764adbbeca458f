"""The dataflow view (`--view graph`): stages, regions, and the read / write / update edges between them
with their spans and advances, one cluster per clock domain."""

from __future__ import annotations

from collections.abc import Sequence

import graphviz

from duplexcadence.dsl.program import Access, Program
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, seconds
from duplexcadence.interpreter.views.style import (
    FIXED_COLOUR,
    FONT,
    IDLE_TEXT,
    clock_colours,
    declared_shape,
    escape,
    lighten,
    member_range,
    new_digraph,
    node_id,
    param_text,
    plural,
    ranked_clocks,
    rate_text,
    shape_text,
    small,
    table,
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
    title = f"{member_range(members)} ×{count}" if count > 1 else name
    retention = "fixed (no time axis)" if region.fixed else region.retention.describe()
    each = " each" if count > 1 else ""
    lines = [f"<B>{escape(title)}</B>", escape(f"{declared_shape(region)} · {retention}")]
    if allocation.capacity is not None:
        lines.append(escape(f"capacity {allocation.capacity} → {shape_text(allocation.shape)}"))
    size = f"{human_bytes(allocation.bytes)}{each}"
    if count > 1:
        size += f" = {human_bytes(allocation.bytes * count)}"
    if allocation.stock_bytes is not None:
        size += f" · stock {human_bytes(allocation.stock_bytes)}{each}"
    lines.append(escape(size))
    if allocation.double_buffer_bytes:
        lines.append(escape(f"double buffer {human_bytes(allocation.double_buffer_bytes)}"))
    if region.bind:
        lines.append(small(escape("bind " + region.bind), IDLE_TEXT, 8))
    return "<" + "<BR/>".join(lines) + ">"


def _stage_node_label(plan: Plan, stage: str) -> str:
    info = plan.program.stages[stage]
    timing = plan.clocks.stages[stage]
    graphs = [g for g in plan.capture.graphs if g.stage == stage]
    calls = f"{info.callable_kind} {info.target or '(root)'}"
    fires = f"on {info.clock} · {param_text(timing.per_cadence)} per cadence · {timing.per_hyperperiod} per hyperperiod"
    replays = (
        plural(len(graphs), "graph") + ": " + " ".join(f"g{g.key}" for g in graphs) + (" · rng" if info.rng else "")
    )
    rows = [f'<TR><TD BGCOLOR="#f0f0f0"><B>{escape(stage)}</B></TD></TR>'] + [
        f"<TR><TD>{escape(text)}</TD></TR>" for text in (calls, fires, replays)
    ]
    return '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="3">' + "".join(rows) + "</TABLE>>"


def render_dataflow(plan: Plan, options: ViewOptions = DEFAULT_OPTIONS) -> graphviz.Digraph:
    program = plan.program
    colours = clock_colours(program)
    graph = new_digraph(
        "dataflow", plan, "dataflow", rankdir="LR", newrank="true", compound="true", nodesep="0.25", ranksep="0.6"
    )
    groups = _region_groups(program)
    members_of = dict(groups)
    node_of_region = {m: node_id("region", name) for name, members in groups for m in members}

    domains: dict[str | None, list[tuple[str, str]]] = {}
    for stage in sorted(program.stages):
        domains.setdefault(program.stages[stage].clock, []).append(("stage", stage))
    for name, members in groups:
        domains.setdefault(program.regions[members[0]].clock, []).append(("region", name))

    def add_nodes(target: graphviz.Digraph, items: Sequence[tuple[str, str]]) -> None:
        for kind, name in items:
            if kind == "stage":
                target.node(node_id("stage", name), _stage_node_label(plan, name), shape="plaintext")
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
            target.node(node_id("region", name), _region_node_label(plan, name, members_of[name]), **style)

    ranked = ranked_clocks(program)
    for clock in ranked:
        if clock.name not in domains:
            continue
        colour = colours[clock.name]
        with graph.subgraph(name=node_id("cluster", clock.name)) as cluster:
            label = f"clock {clock.name} · {rate_text(clock.rate)} · period {seconds(clock.period)}"
            parents = [name for name in clock.uses if name in program.clocks]
            if parents:
                label += f" · from {', '.join(parents)}"
            cluster.attr(
                label=label,
                style="filled,rounded",
                color=colour,
                fillcolor=lighten(colour, 0.85),
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
                fillcolor=lighten(FIXED_COLOUR, 0.85),
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
        stage_node = node_id("stage", stage)
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
                same.node(node_id("stage", stage))
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
    return table(rows, border=1, spacing=0, padding=3)
