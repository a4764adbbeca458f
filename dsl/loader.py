"""Load a `.clock` file and everything it imports (`use`), detecting unknown imports and cycles.

`use a.b` looks for `a/b.clock` beside the importing file first, then in the stdlib shipped with
the package (`stdlib/a/b.clock`), so `use std.audio` works from any folder; `find_module` is that
search, which the CLI also uses for module names on its command line (`dsl plan models.mimi_decoder`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import attrs

from duplexcadence.dsl import messages, syntax
from duplexcadence.dsl.diagnostics import ClockError, DiagnosticBag
from duplexcadence.dsl.parse import MAX_SOURCE_BYTES, parse_module
from duplexcadence.dsl.source import SourceFile


@attrs.frozen
class Unit:
    """One loaded file: its source, its AST, and the units it imports (by key), in `use` order.

    `dotted` is the module name it was first imported by (`std.audio`; the file's stem for the main
    file): the prefix of its declarations' names when the main file does not import them itself."""

    key: str
    source: SourceFile
    module: syntax.Module
    imports: tuple[tuple[syntax.Use, str], ...]
    dotted: str = ""


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


def find_module(parts: Sequence[str], folder: Path) -> Path | None:
    """The file of module `a.b` (`parts` ("a", "b")): `a/b.clock` in `folder` first, then in the stdlib."""
    local = folder.joinpath(*parts).with_suffix(".clock")
    if local.is_file():
        return local
    std = stdlib_path(".".join(parts))
    return std if std.is_file() else None


def _find(use: syntax.Use, importer: Path) -> Path | None:
    return find_module(use.module, importer.parent)


@functools.lru_cache(maxsize=128)
def _parse(path: str, text: str) -> syntax.Module:
    """Parse once per (path, text): the stdlib is imported by nearly every check. The AST is frozen,
    so sharing it is safe; a failed parse raises and is not cached."""
    return parse_module(SourceFile(path, text))


def read_source(path: str | Path) -> SourceFile:
    """Read a `.clock` file, or raise ClockError with one clear file-level diagnostic: a missing
    file, a directory, a file over the size limit, binary data, text that is not UTF-8."""
    target = Path(path)
    name = str(path)
    if target.is_dir():
        raise ClockError([messages.unreadable(name, "it is a directory")])
    try:
        size = target.stat().st_size
        if size > MAX_SOURCE_BYTES:
            raise ClockError([messages.file_too_large(name, size, MAX_SOURCE_BYTES)])
        data = target.read_bytes()
    except OSError as error:
        raise ClockError([messages.unreadable(name, (error.strerror or str(error)).lower())]) from None
    return source_from_bytes(name, data)


def source_from_bytes(name: str, data: bytes) -> SourceFile:
    """`data` as the text of the `.clock` source `name` (a file's bytes, or standard input's), or
    ClockError: over the size limit, binary data, not UTF-8."""
    if len(data) > MAX_SOURCE_BYTES:
        raise ClockError([messages.file_too_large(name, len(data), MAX_SOURCE_BYTES)])
    if b"\x00" in data:
        raise ClockError([messages.unreadable(name, f"it is a binary file (a NUL byte at byte {data.index(0)})")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ClockError(
            [messages.unreadable(name, f"it is not UTF-8 text ({error.reason} at byte {error.start})")]
        ) from None
    return SourceFile(name, text.removeprefix("\ufeff"))


def load(path: str | Path, source: SourceFile | None = None, sources: dict[str, SourceFile] | None = None) -> Loaded:
    """Load `path` (or the given source text for it) and its imports; raises ClockError on failure.

    Every file read is also put in `sources` (when given), so that diagnostics can quote them even
    when loading fails."""
    if sources is None:
        sources = {}
    bag = DiagnosticBag()
    units: dict[str, Unit] = {}
    main_key = os.path.normpath(path)
    stack: list[str] = []

    def visit(key: str, src: SourceFile, via: syntax.Use | None) -> None:
        sources[key] = src
        try:
            module = _parse(src.path, src.text)
        except ClockError as error:
            bag.extend(error.diagnostics)
            return
        imports: list[tuple[syntax.Use, str]] = []
        stack.append(key)
        for use in module.of(syntax.Use):
            found = _find(use, Path(key))
            if found is None:
                bag.add(messages.unknown_import(use.dotted, use.module_span or use.span, stdlib_modules()))
                continue
            target = os.path.normpath(found)
            imports.append((use, target))
            if target in stack:
                cycle = [Path(k).stem for k in stack[stack.index(target) :]] + [Path(target).stem]
                bag.add(messages.import_cycle(cycle, use.module_span or use.span))
                continue
            if target not in units:
                try:
                    child = read_source(found)
                except ClockError as error:
                    reason = error.diagnostics[0].message.split(": ", 1)[-1]
                    bag.add(messages.unreadable_import(use.dotted, target, reason, use.module_span or use.span))
                    continue
                visit(target, child, use)
        stack.pop()
        units[key] = Unit(key, src, module, tuple(imports), via.dotted if via is not None else Path(key).stem)

    visit(main_key, source if source is not None else read_source(path), None)
    bag.raise_if_errors()
    return Loaded(main_key, units)
