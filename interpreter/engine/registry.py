"""Conversation models by name: the ``duplexcadence.conversations`` entry points, each a function that builds an
:class:`~.engine.Engine` from keyword options (``device``, ``sizes``, ``conversations``, ...).

A model of another distribution registers the same way from its own ``pyproject.toml``::

    [project.entry-points."duplexcadence.conversations"]
    mymodel = "mypackage.conversation:load_engine"
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from duplexcadence.interpreter.engine.engine import Engine

GROUP = "duplexcadence.conversations"


class UnknownModel(ValueError):
    """No conversation model of that name is installed."""


def available() -> list[str]:
    """The names of the installed conversation models."""
    return sorted({entry.name for entry in entry_points(group=GROUP)})


def load_engine(name: str, **options: Any) -> Engine:
    """The engine of the conversation model ``name``, built with ``options``."""
    for entry in entry_points(group=GROUP):
        if entry.name == name:
            return entry.load()(**options)
    names = available()
    raise UnknownModel(f"no conversation model named {name!r}; installed: {', '.join(names) if names else 'none'}")
