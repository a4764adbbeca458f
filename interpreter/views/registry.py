"""The views `dsl render` draws, chosen by name.

A view is one module with a drawing function `(plan, ViewOptions) -> graphviz.Digraph`, registered by
one line in `VIEWS`. `dsl render --view` (its choices and help), `dsl render --list-views`,
docs/render.md's list (kept equal by tests/render) and scripts/render_diagrams.sh read this table.
"""

from __future__ import annotations

from collections.abc import Mapping

from duplexcadence.interpreter.views.arena_map import render_arena
from duplexcadence.interpreter.views.dataflow import render_dataflow
from duplexcadence.interpreter.views.timeline import render_timeline
from duplexcadence.interpreter.views.unit import render_unit
from duplexcadence.interpreter.views.view import View

VIEWS: Mapping[str, View] = {
    view.name: view
    for view in (
        View("timeline", "firings and region fill per instant, from session start (the default)", render_timeline),
        View(
            "graph", "the dataflow: stages in order, what flows between them, each stage's own state", render_dataflow
        ),
        View("arena", "the memory map: the session block and the shared scratch block", render_arena),
        View(
            "unit",
            "one cadence of the steady state firing by firing, up to each bound (a conversation's unit)",
            render_unit,
        ),
    )
}
DEFAULT_VIEW = "timeline"


def view_names() -> tuple[str, ...]:
    return tuple(VIEWS)


def get_view(name: str) -> View:
    """The view registered as `name`; ValueError naming the registered views otherwise."""
    try:
        return VIEWS[name]
    except KeyError:
        raise ValueError(f"unknown view {name!r}; choose one of {', '.join(VIEWS)}") from None
