"""Rendering a plan: `render_plan` draws a registered view, `render_file` plans a `.clock` file, draws
it and writes it (the library form of `dsl render`).

The DOT text is deterministic: ids come from names; lanes, nodes and clusters follow fixed orders
(dataflow order, clock rate, name); colours come from fixed palettes by a stable index
(`style.py`), never from Python's salted `hash()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import graphviz

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.plans.plan import Plan, make_plan
from duplexcadence.interpreter.views.output import output_format, to_bytes, write_output
from duplexcadence.interpreter.views.registry import DEFAULT_VIEW, get_view
from duplexcadence.interpreter.views.view import ViewOptions


def render_plan(plan: Plan, view: str = DEFAULT_VIEW, ticks: int | None = None) -> graphviz.Digraph:
    """The `view` of `plan` as a graphviz Digraph (its `.source` is the DOT text)."""
    return get_view(view).draw(plan, ViewOptions(ticks=ticks))


def render_file(
    path: str | Path,
    params: Mapping[str, str] | None = None,
    view: str = DEFAULT_VIEW,
    output: str | Path | None = None,
    ticks: int | None = None,
    fmt: str | None = None,
    max_graphs: int | None = None,
    prune: bool = True,
) -> bytes:
    """Plan `path` with `params` (`prune`: leave out the stages no output sees), render `view`, write it to
    `output` (if given) and return the bytes.

    Raises ClockError for a bad program and RenderError when the file cannot be written.
    """
    chosen = output_format(output, fmt)
    plan = make_plan(load_program(path, params), max_graphs=max_graphs, prune=prune)
    data = to_bytes(render_plan(plan, view, ticks), chosen)
    if output is not None:
        write_output(data, output)
    return data
