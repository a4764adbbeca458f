"""Load a `.clock` file and everything it imports (`use`), detecting unknown imports and cycles.

`use a.b` looks for `a/b.clock` beside the importing file first, then in the stdlib shipped with
the package (`stdlib/a/b.clock`), so `use std.audio` works from any folder.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import attrs

from . import ast, messages
from .diagnostics import ClockError, DiagnosticBag
from .parse import parse_module
from .source import SourceFile


@attrs.frozen
class Unit:
    """One loaded file: its source, its AST, and the units it imports (by key), in `use` order."""

    key: str
    source: SourceFile
    module: ast.Module
    imports: tuple[tuple[ast.Use, str], ...]


@attrs.frozen
class Loaded:
    """The main unit and every unit reachable from it, keyed by resolved path."""

    main: str
    units: dict[str, Unit] = attrs.field(hash=False)


def stdlib_root() -> Path:
    return Path(str(resources.files("duplexcadence").joinpath("stdlib")))


def stdlib_modules() -> list[str]:
    """Dotted names of every stdlib module (`std.audio`, `models.mimi_decoder`, ...)."""
    root = stdlib_root()
    return sorted(".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.clock"))


def stdlib_path(dotted: str) -> Path:
    return stdlib_root().joinpath(*dotted.split(".")).with_suffix(".clock")


def _find(use: ast.Use, importer: Path) -> Path | None:
    local = importer.parent.joinpath(*use.module).with_suffix(".clock")
    if local.is_file():
        return local
    std = stdlib_path(use.dotted)
    return std if std.is_file() else None


def load(path: str | Path, source: SourceFile | None = None) -> Loaded:
    """Load `path` (or the given source text for it) and its imports; raises ClockError on failure."""
    bag = DiagnosticBag()
    units: dict[str, Unit] = {}
    main_key = str(Path(path))
    stack: list[str] = []

    def visit(key: str, src: SourceFile, via: ast.Use | None) -> None:
        try:
            module = parse_module(src)
        except ClockError as error:
            bag.extend(error.diagnostics)
            return
        imports: list[tuple[ast.Use, str]] = []
        stack.append(key)
        for use in module.of(ast.Use):
            found = _find(use, Path(key))
            if found is None:
                bag.add(messages.unknown_import(use.dotted, use.span, stdlib_modules()))
                continue
            target = str(found)
            imports.append((use, target))
            if target in stack:
                cycle = [Path(k).stem for k in stack[stack.index(target):]] + [Path(target).stem]
                bag.add(messages.import_cycle(cycle, use.span))
                continue
            if target not in units:
                try:
                    child = SourceFile.read(found)
                except (OSError, UnicodeDecodeError) as error:
                    bag.add(messages.unreadable(target, str(error)))
                    continue
                visit(target, child, use)
        stack.pop()
        units[key] = Unit(key, src, module, tuple(imports))

    visit(main_key, source if source is not None else SourceFile.read(path), None)
    bag.raise_if_errors()
    return Loaded(main_key, units)
