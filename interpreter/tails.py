"""The tail registry: model tails are plugins, found through the entry-point group `duplexcadence.tails`.

A distribution registers a tail by naming a `Tail` record in its metadata::

    [project.entry-points."duplexcadence.tails"]
    mytail = "mypackage.tail:TAIL"

`available()` lists the registered names, `get(name)` loads one record. Loading a record imports only the
module that holds it: its callables (`build_model`, `stock_loop`, `load_runtime`, `subject`, `serve`) are
`Reference`s, imported when first called, so a tail whose optional packages are missing is still listed,
and calling into it says which extra to install. The bench (`dsl bench NAME`), the tests and the serving
code find tails here; nothing in the core names one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

ENTRY_POINT_GROUP = "duplexcadence.tails"


class TailError(LookupError):
    """A tail name that is not registered, or a registration that does not load."""


class TailUnavailable(TailError, ImportError):
    """A registered tail whose optional packages are not installed."""


class ImportFailed(LookupError):
    """A function the user names (`MODULE:FUNCTION` on a command line) that cannot be imported: the message
    says why."""


def import_function(module_name: str, function_name: str) -> Callable[..., Any]:
    """FUNCTION of MODULE, from the current folder or the installed packages (a user's own model builder,
    stock loop or bench subject); `ImportFailed` saying why not."""
    if os.getcwd() not in sys.path:  # a console script does not put the current folder on the path
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportFailed(
            f"cannot import '{module_name}' from the current folder or the installed packages: {error}"
        ) from error
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ImportFailed(f"'{module_name}' has no function '{function_name}'")
    return function


@attrs.frozen
class Upstream:
    """A source file a tail follows: the repository (`owner/name`, or a PyPI distribution with its version)
    and the path inside it, with what the tail takes from it."""

    repository: str
    path: str
    what: str = ""

    def __str__(self) -> str:
        return f"{self.repository} `{self.path}`" + (f": {self.what}" if self.what else "")


@attrs.frozen
class Reference:
    """A callable named by `module:attribute` (attributes may be dotted), imported when first used.

    `requires` are the import names of the optional packages it needs, `extra` the pip extra that installs
    them: calling a reference with one of them missing raises `TailUnavailable` naming both."""

    target: str
    tail: str = ""
    extra: str | None = None
    requires: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def missing(self) -> tuple[str, ...]:
        return missing_modules(self.requires)

    def resolve(self) -> Any:
        """The object named by `target`; `TailUnavailable` if the tail's optional packages are missing."""
        missing = self.missing()
        if missing:
            raise TailUnavailable(unavailable_message(self.tail, missing, self.extra))
        module_name, sep, attribute = self.target.partition(":")
        if not sep or not module_name or not attribute:
            raise TailError(f"tail {self.tail!r}: {self.target!r} is not MODULE:ATTRIBUTE")
        value: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            value = getattr(value, part)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __str__(self) -> str:
        return self.target


def _reference(value: str | Reference) -> Reference:
    return value if isinstance(value, Reference) else Reference(value)


def _optional_reference(value: str | Reference | None) -> Reference | None:
    return None if value is None else _reference(value)


@attrs.frozen
class Tail:
    """One model tail: what it is, the `.clock` it declares, the upstream it follows, and how to build,
    run, bind and measure it.

    `clock`: a stdlib module name (`models.mimi_decoder`: `stdlib/models/mimi_decoder.clock`) or a path
    ending in `.clock`, relative to the tail's package (`package`) unless absolute.
    `build_model(**options)`: the model at its released size with seeded random weights.
    `stock_loop(model, ...)`: the stock streaming loop, the reference every output is compared with.
    `load_runtime(model, ...)`: the DuplexCadence runtime over the model, its hooks bound.
    `subject(device=, seconds=, batch=, dtype=, **options)`: its `dsl bench` subject.
    `serve(device=, **options)`: its serving adapter, a `duplexcadence.interpreter.serve.ServedTail` (`dsl serve
    NAME`); None for a tail that declares none.
    `extra`: the pip extra of this distribution that installs `requires` (None: none needed).
    `offline(model, ...)`: one call of the stock model over a whole input (the streamed inputs
    concatenated along their time axis), what a stream is compared with by
    `interpreter.runtime.offline.verify_offline` and `scripts/boundary_report.py` (None: the tail has none).
    """

    name: str
    summary: str
    package: str
    clock: str
    upstream: tuple[Upstream, ...]
    build_model: Reference = attrs.field(converter=_reference)
    stock_loop: Reference = attrs.field(converter=_reference)
    load_runtime: Reference = attrs.field(converter=_reference)
    subject: Reference = attrs.field(converter=_reference)
    extra: str | None = None
    requires: tuple[str, ...] = ()
    serve: Reference | None = attrs.field(default=None, converter=_optional_reference)
    offline: Reference | None = attrs.field(default=None, converter=_optional_reference)

    def __attrs_post_init__(self) -> None:
        for field in ("build_model", "stock_loop", "load_runtime", "subject", "serve", "offline"):
            if getattr(self, field) is None:
                continue
            reference = attrs.evolve(getattr(self, field), tail=self.name, extra=self.extra, requires=self.requires)
            object.__setattr__(self, field, reference)

    def missing(self) -> tuple[str, ...]:
        """The import names of this tail's optional packages that are not installed."""
        return missing_modules(self.requires)

    @property
    def installed(self) -> bool:
        return not self.missing()

    def require(self) -> None:
        """Raise `TailUnavailable` (what is missing, the extra to install) unless the tail can run."""
        missing = self.missing()
        if missing:
            raise TailUnavailable(unavailable_message(self.name, missing, self.extra))

    def clock_path(self) -> Path:
        """The tail's `.clock` file."""
        if not self.clock.endswith(".clock"):
            from duplexcadence.dsl.loader import stdlib_path

            return stdlib_path(self.clock)
        path = Path(self.clock)
        if path.is_absolute():
            return path
        return Path(str(resources.files(self.package).joinpath(self.clock)))

    @property
    def readme(self) -> str:
        """Where the tail's README is, as a path inside its package."""
        return f"{self.package.replace('.', '/')}/README.md"


def missing_modules(names: tuple[str, ...]) -> tuple[str, ...]:
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return tuple(missing)


def unavailable_message(tail: str, missing: tuple[str, ...], extra: str | None) -> str:
    needs = ", ".join(repr(name) for name in missing)
    install = f"install duplexcadence[{extra}]" if extra else "install " + " ".join(missing)
    return (
        f"the '{tail}' tail needs {needs}, which {'is' if len(missing) == 1 else 'are'} not installed: {install} "
        "(model packages go with pip's --no-deps, so that torch stays: see the tail's README.md)"
    )


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> list[str]:
    """The names of every registered tail, sorted (whether or not its optional packages are installed)."""
    return sorted(_entry_points())


def unknown_message(name: str, names: list[str]) -> str:
    if not names:
        return (
            f"no tail named '{name}': no tail is registered (the '{ENTRY_POINT_GROUP}' entry points come with an "
            "installed distribution: pip install -e . in the repository)"
        )
    return f"no tail named '{name}'; the registered tails are {', '.join(names)}"


def get(name: str) -> Tail:
    """The registered tail `name`; `TailError` naming the registered tails if there is none."""
    entries = _entry_points()
    if name not in entries:
        raise TailError(unknown_message(name, sorted(entries)))
    try:
        tail = entries[name].load()
    except ImportError as error:
        raise TailError(
            f"tail '{name}' is registered as {entries[name].value!r}, which does not import: {error}"
        ) from error
    if not isinstance(tail, Tail):
        raise TailError(f"tail '{name}' is registered as {entries[name].value!r}, which is not a Tail record")
    if tail.name != name:
        raise TailError(f"tail '{name}' is registered as {entries[name].value!r}, a Tail named '{tail.name}'")
    return tail


def all_tails() -> list[Tail]:
    """Every registered tail's record, by name."""
    return [get(name) for name in available()]
