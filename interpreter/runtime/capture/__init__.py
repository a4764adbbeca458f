"""Capture strategies, chosen by name: which firings of an instant are captured into which CUDA graph.

    runtime = Runtime.load("tail.clock", model, capture="per-stage")

Built in: `fused` (the default: an instant's consecutive capturable firings as one graph), `per-stage`
(one graph per firing) and `eager` (no graphs). A strategy is a module holding a `CaptureStrategy`
(strategy.py: `plan_runs(template, blocked)`, a pure function of the instant and the blocked stages),
registered by name in `STRATEGIES`; another distribution registers one through the entry-point group
`duplexcadence.capture`::

    [project.entry-points."duplexcadence.capture"]
    mine = "mypackage.capture:STRATEGY"

A built-in name wins over an entry point of the same name. Loading a strategy imports only its module
(no torch: the capture itself is graphs.py).

Public: `STRATEGIES`, `DEFAULT`, `ENTRY_POINT_GROUP`, `available`, `get`; and strategy.py's
`CaptureStrategy`, `Run`, `StepTemplate`, `templates_of`, `off_plan_templates`, `capturable`, `checked_runs`.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from duplexcadence.interpreter.runtime.capture.strategy import (
    CaptureStrategy,
    Run,
    StepTemplate,
    capturable,
    checked_runs,
    off_plan_templates,
    templates_of,
)

__all__ = [
    "DEFAULT",
    "ENTRY_POINT_GROUP",
    "STRATEGIES",
    "CaptureStrategy",
    "Run",
    "StepTemplate",
    "available",
    "capturable",
    "checked_runs",
    "get",
    "off_plan_templates",
    "templates_of",
]

ENTRY_POINT_GROUP = "duplexcadence.capture"
DEFAULT = "fused"

STRATEGIES: dict[str, str] = {
    "fused": "duplexcadence.interpreter.runtime.capture.fused:STRATEGY",
    "per-stage": "duplexcadence.interpreter.runtime.capture.per_stage:STRATEGY",
    "eager": "duplexcadence.interpreter.runtime.capture.eager:STRATEGY",
}
"""Built-in strategies: name -> "module:attribute" of its `CaptureStrategy`."""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """The names of every registered strategy (built in, then through entry points), sorted."""
    return sorted(set(STRATEGIES) | set(_entry_points()))


def get(name: str) -> CaptureStrategy:
    """The strategy registered as `name`; ValueError naming the registered strategies if there is none."""
    if name in STRATEGIES:
        target = STRATEGIES[name]
        module, _, attribute = target.partition(":")
        strategy = getattr(importlib.import_module(module), attribute)
    else:
        entries = _entry_points()
        if name not in entries:
            raise ValueError(
                f"no capture strategy named {name!r}; the registered strategies are {', '.join(available())}"
            )
        target = entries[name].value
        try:
            strategy = entries[name].load()
        except (ImportError, AttributeError) as error:
            raise ValueError(
                f"capture strategy {name!r} is registered as {target!r}, which does not load: {error}"
            ) from error
    if not isinstance(strategy, CaptureStrategy):
        raise ValueError(f"capture strategy {name!r} is registered as {target!r}, which is not a CaptureStrategy")
    if strategy.name != name:
        raise ValueError(f"capture strategy {name!r} is registered as {target!r}, a strategy named {strategy.name!r}")
    return strategy
