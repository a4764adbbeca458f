"""The look every view shares: palettes, the font, HTML-label helpers, text for rates and shapes, and
the digraph every view starts from.

Colours are picked from fixed palettes by a stable index (a graph's key; a clock's rank by rate, then
name), never by Python's salted `hash()`, so the DOT text is the same in every process.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import graphviz

from duplexcadence.dsl.program import ClockInfo, Program, RegionInfo
from duplexcadence.interpreter.plans.plan import Plan

FONT = "Helvetica"

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
SEPARATOR = "#3c3c3c"
GRID = "#c8c8c8"
IDLE_TEXT = "#8a8a8a"
TRIM_BORDER = "#b35806"
LOSS_TEXT = "#c0392b"  # units an output loses at a boundary between two firings


# --- colours --------------------------------------------------------------------------------------


def graph_colour(key: int) -> str:
    return GRAPH_PALETTE[key % len(GRAPH_PALETTE)]


def ranked_clocks(program: Program) -> list[ClockInfo]:
    """The program's clocks fastest first, ties by name: the order of clusters, legends and colours."""
    return sorted(program.clocks.values(), key=lambda clock: (-clock.rate, clock.name))


def clock_colours(program: Program) -> dict[str, str]:
    return {clock.name: CLOCK_PALETTE[i % len(CLOCK_PALETTE)] for i, clock in enumerate(ranked_clocks(program))}


def lighten(colour: str, amount: float) -> str:
    """`colour` mixed with white (`amount` of white, 0..1), as #rrggbb."""
    channels = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(c + (255 - c) * amount) for c in channels]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def bar(colour: str, fraction: float, background: str = "white") -> str:
    """A graphviz weighted colour list: `fraction` of the cell in `colour` from the left, then background."""
    if fraction >= 1:
        return colour
    if fraction <= 0:
        return background
    return f"{colour};{max(fraction, 0.004):.3f}:{background}"


def span_bar(colour: str, start: float, end: float, width: int = 160, height: int = 10) -> str:
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


# --- text -----------------------------------------------------------------------------------------


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def wrap(text: str, width: int, line_break: str = "<BR/>") -> str:
    """`text` escaped as HTML-label lines of about `width` characters (in a table cell, its BALIGN
    aligns them), broken after a `, `, `; ` or ` · ` where one is near, between words otherwise."""
    lines: list[str] = []
    line = ""
    for piece in re.split(r"(?<=, )|(?<=; )|(?<= · )", text):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
        while len(line) > width and (cut := line.rfind(" ", 0, width + 1)) > 0:
            lines.append(line[:cut].rstrip())
            line = line[cut + 1 :]
    if line.strip():
        lines.append(line.rstrip())
    return line_break.join(escape(part) for part in lines)


def rate_text(rate: Fraction) -> str:
    if rate >= 1000 and (rate / 1000).denominator == 1:
        return f"{rate / 1000} kHz"
    value = f"{float(rate):g}" if rate.denominator != 1 else str(rate.numerator)
    return f"{value} Hz"


def shape_text(shape: Sequence[int] | None) -> str:
    return "?" if shape is None else "×".join(str(d) for d in shape)


def declared_shape(region: RegionInfo) -> str:
    dims = ["t" if i == region.time_axis else str(d) for i, d in enumerate(region.shape)]
    return f"{region.dtype}[{', '.join(dims)}]"


def param_text(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(param_text(v) for v in value) + "]"
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    return str(value)


# --- HTML labels ----------------------------------------------------------------------------------


def html_table(rows: Sequence[str], border: int = 0, spacing: int = 0, padding: int = 4) -> str:
    """An HTML label of one table of `rows` (each a `<TR>...</TR>`)."""
    return (
        f'<<TABLE BORDER="{border}" CELLBORDER="0" CELLSPACING="{spacing}" CELLPADDING="{padding}">'
        + "".join(rows)
        + "</TABLE>>"
    )


def td(content: str = "", **attributes: object) -> str:
    attrs_text = "".join(f' {key.upper()}="{value}"' for key, value in attributes.items() if value is not None)
    return f"<TD{attrs_text}>{content}</TD>"


def small(text: str, colour: str | None = None, size: int = 9) -> str:
    colour_attr = f' COLOR="{colour}"' if colour else ""
    return f'<FONT POINT-SIZE="{size}"{colour_attr}>{text}</FONT>'


# --- the digraph every view starts from -----------------------------------------------------------


def node_id(prefix: str, name: str) -> str:
    return prefix + "_" + re.sub(r"\W", "_", name)


TITLE_WIDTH = 90  # characters per line of the params under a view's title


def title(plan: Plan, view: str) -> str:
    """The file and the view, and under them the params it was planned with (an HTML label)."""
    params = ", ".join(f"{k}={param_text(v)}" for k, v in sorted(plan.program.params.items()) if "." not in k)
    text = escape(f"{Path(plan.path).name} — {view}")
    if params:
        left = '<BR ALIGN="LEFT"/>'
        text += left + small(wrap(params, TITLE_WIDTH, left), IDLE_TEXT, 12)
    return f'<{text}<BR ALIGN="LEFT"/>>'


def new_digraph(name: str, plan: Plan, view: str, **graph_attr: str) -> graphviz.Digraph:
    attributes = {
        "label": title(plan, view),
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
