"""The arena view: the memory map of the per-session pinned block and of the scratch block all sessions
share, every allocation at its offset, its demand beside the stock size, and scratch liveness per stage
position of an instant."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import graphviz

from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, member_range, plural
from duplexcadence.interpreter.views.style import (
    FIXED_COLOUR,
    GRID,
    bar,
    clock_colours,
    escape,
    html_table,
    lighten,
    new_digraph,
    ranked_clocks,
    rate_text,
    shape_text,
    small,
    span_bar,
    td,
)
from duplexcadence.interpreter.views.view import DEFAULT_OPTIONS, ViewOptions


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
        return f"{member_range(list(row.names))} ×{len(row.names)}"
    return name


def _row_colour(plan: Plan, colours: Mapping[str, str], row: _ArenaRow) -> str:
    region = plan.program.regions[row.names[0].removesuffix("~double")]
    return colours.get(region.clock, FIXED_COLOUR) if region.clock else FIXED_COLOUR


def render_arena(plan: Plan, options: ViewOptions = DEFAULT_OPTIONS) -> graphviz.Digraph:
    program = plan.program
    arena = plan.arena
    colours = clock_colours(program)
    graph = new_digraph("arena", plan, "arena", rankdir="TB", nodesep="0.4", ranksep="0.4")

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
            td(f"<B>{h}</B>", BGCOLOR="#efefef", BORDER=1, COLOR=GRID)
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
    allocations = plural(sum(len(r.names) for r in session_rows), "allocation")
    title = escape(f"Session block: pinned, one per session · {human_bytes(arena.session_bytes)}")
    subtitle = escape(f" · {allocations}, offsets aligned to {arena.alignment} B")
    rows = [f'<TR><TD COLSPAN="8" ALIGN="LEFT"><B>{title}</B>{small(subtitle)}</TD></TR>', header]
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
            f'<TR><TD WIDTH="220" HEIGHT="7" FIXEDSIZE="TRUE" BGCOLOR="{bar(colour, row.bytes_each / scale, "#f7f7f7")}"></TD></TR>'
            + (
                f'<TR><TD WIDTH="220" HEIGHT="7" FIXEDSIZE="TRUE" BGCOLOR="{bar("#9a9a9a", stock / scale, "#f7f7f7")}"></TD></TR>'
                if stock is not None
                else ""
            )
            + "</TABLE>"
        )
        position = span_bar(colour, row.offset / block, row.end / block)
        note = (
            f"<BR/>{small(escape('+ double buffer ' + human_bytes(region.double_buffer_bytes) + ' in scratch'))}"
            if region.double_buffer_bytes
            else ""
        )
        rows.append(
            "<TR>"
            + "".join(
                [
                    td(escape(offset), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    td(
                        f'<FONT COLOR="{colour}">■</FONT> {escape(_row_title(program, row))}{note}',
                        ALIGN="LEFT",
                        BORDER=1,
                        COLOR=GRID,
                    ),
                    td(escape(shape_text(region.shape)), BORDER=1, COLOR=GRID),
                    td(position, BORDER=1, COLOR=GRID),
                    td(bars, BORDER=1, COLOR=GRID),
                    td(escape(demand_text), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    td(escape(human_bytes(stock) if stock is not None else "-"), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    td(escape(saving), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
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
    rows.append(f'<TR><TD COLSPAN="8" ALIGN="LEFT">{escape(total)}</TD></TR>')
    graph.node("session", html_table(rows, spacing=0, padding=3), shape="plaintext")

    # the shared scratch block: offsets and which stage positions of an instant each allocation is live in
    scratch_rows = _arena_rows(plan, persistent=False)
    order = plan.clocks.stage_order
    positions = list(order) + ["(output out)"]
    scratch = max(arena.scratch_bytes, 1)
    head = (
        "<TR>"
        + "".join(
            td(f"<B>{h}</B>", BGCOLOR="#efefef", BORDER=1, COLOR=GRID)
            for h in ("offset", "allocation", "bytes", "position in the scratch block")
        )
        + "".join(td(small(f"<B>{escape(p)}</B>"), BGCOLOR="#efefef", BORDER=1, COLOR=GRID) for p in positions)
        + "</TR>"
    )
    width = 4 + len(positions)
    rows = [
        f'<TR><TD COLSPAN="{width}" ALIGN="LEFT"><B>{escape("Scratch block: shared by all sessions, packed by liveness · " + human_bytes(arena.scratch_bytes))}</B>'
        f"{small(escape(' · columns: the stages of an instant in dataflow order; filled = live'))}</TD></TR>",
        head,
    ]
    if not scratch_rows:
        rows.append(f'<TR><TD COLSPAN="{width}">{escape("(empty: every region is pinned)")}</TD></TR>')
    for row in scratch_rows:
        colour = _row_colour(plan, colours, row)
        live = row.live if row.live is not None else (0, len(positions) - 1)
        cells = [
            td("", BGCOLOR=lighten(colour, 0.3) if live[0] <= p <= live[1] else "white", BORDER=1, COLOR=GRID)
            for p in range(len(positions))
        ]
        scratch_region = plan.schedule.regions.get(row.names[0])
        size = human_bytes(row.bytes_each)
        if scratch_region is not None and scratch_region.stock_bytes:
            # a working buffer the stock code keeps at a fixed size: its saving belongs beside it
            size += f" (stock {human_bytes(scratch_region.stock_bytes)}, {scratch_region.saving_fraction:.1%} less)"
        rows.append(
            "<TR>"
            + "".join(
                [
                    td(escape(f"{row.offset:,}"), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    td(
                        f'<FONT COLOR="{colour}">■</FONT> {escape(_row_title(program, row))}',
                        ALIGN="LEFT",
                        BORDER=1,
                        COLOR=GRID,
                    ),
                    td(escape(size), ALIGN="RIGHT", BORDER=1, COLOR=GRID),
                    td(span_bar(colour, row.offset / scratch, row.end / scratch), BORDER=1, COLOR=GRID),
                ]
                + cells
            )
            + "</TR>"
        )
    graph.node("scratch", html_table(rows, spacing=0, padding=3), shape="plaintext")
    sessions_note = (
        f"one device allocation: sessions × {human_bytes(arena.session_bytes)} + "
        f"{human_bytes(arena.scratch_bytes)} shared scratch; 1 session = "
        f"{human_bytes(arena.total_bytes(1))}, 8 sessions = {human_bytes(arena.total_bytes(8))}"
    )
    legend = [
        f'<TR><TD ALIGN="LEFT"><B>Legend</B> — {escape(sessions_note)}</TD></TR>',
        '<TR><TD ALIGN="LEFT">colour = the clock the region\'s time axis advances on (grey: fixed size); '
        "bars are to scale within their table</TD></TR>",
    ]
    used = {r.clock for r in program.regions.values()}
    for clock in ranked_clocks(program):
        if clock.name not in used:
            continue
        legend.append(
            f'<TR><TD ALIGN="LEFT"><FONT COLOR="{colours[clock.name]}">■</FONT> '
            f"{escape(f'{clock.name} · {rate_text(clock.rate)}')}</TD></TR>"
        )
    graph.node("legend", html_table(legend, border=1, spacing=0, padding=3), shape="plaintext")
    graph.edge("session", "scratch", style="invis")
    graph.edge("scratch", "legend", style="invis")
    return graph
