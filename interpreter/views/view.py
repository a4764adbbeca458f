"""What a view is: a name, a one-line summary, and the function that draws a plan as a graphviz digraph.
The registry (`registry.VIEWS`) lists them; each view module defines its drawing function."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import graphviz

from duplexcadence.interpreter.plans.plan import Plan


@attrs.frozen
class ViewOptions:
    """What `dsl render` passes to every view; a view reads the options that concern it."""

    ticks: int | None = None  # timeline: instants from session start (None: warm-up + one steady period)


DEFAULT_OPTIONS = ViewOptions()


@attrs.frozen
class View:
    name: str  # `dsl render --view NAME`
    summary: str  # one line for `--help`, `--list-views` and docs/render.md
    draw: Callable[[Plan, ViewOptions], graphviz.Digraph]
