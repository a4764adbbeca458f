"""Load a `.clock` file and everything it imports (`use`), detecting unknown imports and cycles.

`use a.b` looks for `a/b.clock` beside the importing file first, then in the stdlib shipped with
the package (`stdlib/a/b.clock`), so `use std.audio` works from any folder; `find_module` is that
search, which the CLI also uses for module names on its command line (`dsl plan models.mimi_decoder`).
A module found there must really lie inside that folder (or the stdlib): a symbolic link out of it
is refused before anything is read. Only regular files are read, and never more than the size limit.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import BinaryIO

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


@functools.cache
def stdlib_root() -> Path:
    return Path(str(resources.files("duplexcadence").joinpath("stdlib")))


def stdlib_modules() -> list[str]:
    """Dotted names of every stdlib module (`std.audio`, `models.mimi_decoder`, ...)."""
    return list(_stdlib_modules())


@functools.cache
def _stdlib_modules() -> tuple[str, ...]:
    root = stdlib_root()
    return tuple(sorted(".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.clock")))


def stdlib_path(dotted: str) -> Path:
    return stdlib_root().joinpath(*dotted.split(".")).with_suffix(".clock")


NAME_MAX = 255
"""The longest file name (bytes) of the file systems DuplexCadence runs on (Linux, macOS)."""

PATH_MAX = 4096
"""The longest path (bytes) those systems open."""


def module_name_problem(parts: Sequence[str], folder: Path) -> str | None:
    """Why module `a.b` (`parts`) cannot name a file in `folder` or the stdlib (a part too long for a
    file name, a path too long to open), or None."""
    for part in parts:
        if len((part + ".clock").encode("utf-8")) > NAME_MAX:
            return (
                f"its part '{_shortened(part)}' is {len(part)} characters, too long for a file name ({NAME_MAX} bytes)"
            )
    for root in (folder, stdlib_root()):
        length = len(str(root.joinpath(*parts).with_suffix(".clock")).encode("utf-8", "surrogateescape"))
        if length > PATH_MAX:
            return f"its file would be a path of {length} bytes, over the {PATH_MAX} bytes a file system opens"
    return None


def _shortened(text: str, keep: int = 24) -> str:
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


def _candidates(parts: Sequence[str], folder: Path) -> list[tuple[Path, Path]]:
    """Where module `a.b` may be, in search order, each with the root it must stay inside."""
    return [
        (folder.joinpath(*parts).with_suffix(".clock"), folder),
        (stdlib_path(".".join(parts)), stdlib_root()),
    ]


def _exists(path: Path) -> bool:
    """Whether anything (a file, a folder, a link, even a broken one) is at `path`."""
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def find_module(parts: Sequence[str], folder: Path) -> Path | None:
    """The file of module `a.b` (`parts` ("a", "b")): `a/b.clock` in `folder` first, then in the stdlib.

    The first place where something of that name exists wins, whatever it is: reading it says why
    when it is not a regular `.clock` file inside its search root (`outside_root`)."""
    if module_name_problem(parts, folder) is not None:
        return None
    for path, _ in _candidates(parts, folder):
        if _exists(path):
            return path
    return None


def outside_root(path: Path, parts: Sequence[str], folder: Path) -> Path | None:
    """The search root that `path` (found for module `parts` from `folder`) leaves by a symbolic link,
    or None when its real location is inside it."""
    for candidate, root in _candidates(parts, folder):
        if candidate == path:
            try:
                real, real_root = os.path.realpath(path), os.path.realpath(root)
            except (OSError, ValueError):
                return root
            return None if os.path.commonpath([real, real_root]) == real_root else root
    return None


def _find(use: syntax.Use, importer: Path) -> Path | None:
    return find_module(use.module, importer.parent)


@functools.lru_cache(maxsize=128)
def _parse(path: str, text: str) -> syntax.Module:
    """Parse once per (path, text): the stdlib is imported by nearly every check. The AST is frozen,
    so sharing it is safe; a failed parse raises and is not cached."""
    return parse_module(SourceFile(path, text))


_KINDS = (
    (stat.S_ISDIR, "it is a directory"),
    (stat.S_ISFIFO, "it is a FIFO (a named pipe), not a regular file"),
    (stat.S_ISCHR, "it is a character device, not a regular file"),
    (stat.S_ISBLK, "it is a block device, not a regular file"),
    (stat.S_ISSOCK, "it is a socket, not a regular file"),
)


def read_source(path: str | Path) -> SourceFile:
    """Read a `.clock` file, or raise ClockError with one clear file-level diagnostic: a missing
    file, anything but a regular file (a directory, a FIFO, a device), a file over the size limit,
    binary data, text that is not UTF-8.

    The file is opened without blocking (a FIFO never waits for a writer) and its kind is checked on
    the open descriptor before anything is read; at most MAX_SOURCE_BYTES + 1 bytes are read, whatever
    size the file system reports (`/proc` files report 0, devices never end)."""
    name = str(path)
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as error:
        raise ClockError([messages.unreadable(name, _reason(error))]) from None
    except ValueError:  # a NUL character in the path
        raise ClockError([messages.unreadable(name, "its name holds a NUL character")]) from None
    try:
        status = os.fstat(descriptor)
        mode = status.st_mode
        for test, reason in _KINDS:
            if test(mode):
                raise ClockError([messages.unreadable(name, reason)])
        if not stat.S_ISREG(mode):
            raise ClockError([messages.unreadable(name, "it is not a regular file")])
        data = _read_at_most(descriptor, MAX_SOURCE_BYTES + 1)
        if len(data) > MAX_SOURCE_BYTES:  # the reported size, when it is believable
            size = status.st_size if status.st_size > MAX_SOURCE_BYTES else None
            raise ClockError([messages.file_too_large(name, size, MAX_SOURCE_BYTES)])
    except OSError as error:
        raise ClockError([messages.unreadable(name, _reason(error))]) from None
    finally:
        os.close(descriptor)
    return source_from_bytes(name, data)


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()


def _read_at_most(descriptor: int, limit: int) -> bytes:
    """Up to `limit` bytes from `descriptor`, stopping at the end of the file."""
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(descriptor, min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_bounded(stream: BinaryIO) -> bytes:
    """Up to MAX_SOURCE_BYTES + 1 bytes of `stream` (standard input): enough to tell it is too large."""
    chunks: list[bytes] = []
    remaining = MAX_SOURCE_BYTES + 1
    while remaining > 0:
        chunk = stream.read(min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def source_from_bytes(name: str, data: bytes) -> SourceFile:
    """`data` as the text of the `.clock` source `name` (a file's bytes, or standard input's), or
    ClockError: over the size limit, binary data, not UTF-8."""
    if len(data) > MAX_SOURCE_BYTES:
        raise ClockError([messages.file_too_large(name, None, MAX_SOURCE_BYTES)])
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
    searched: dict[tuple[tuple[str, ...], str], tuple[str | None, Path | None, Path | None]] = {}

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
            at = use.module_span or use.span
            if (use.module, key) not in searched:  # a file may repeat a `use` thousands of times
                problem = module_name_problem(use.module, Path(key).parent)
                found = _find(use, Path(key)) if problem is None else None
                root = outside_root(found, use.module, Path(key).parent) if found is not None else None
                searched[use.module, key] = (problem, found, root)
            problem, found, root = searched[use.module, key]
            if problem is not None:
                bag.add(messages.import_name_too_long(_shortened(use.dotted), problem, at))
                continue
            if found is None:
                bag.add(messages.unknown_import(use.dotted, at, stdlib_modules()))
                continue
            target = os.path.normpath(found)
            if root is not None:
                bag.add(messages.import_outside_root(use.dotted, target, str(root), at))
                continue
            imports.append((use, target))
            if target in stack:
                cycle = [Path(k).stem for k in stack[stack.index(target) :]] + [Path(target).stem]
                bag.add(messages.import_cycle(cycle, at))
                continue
            if target not in units:
                try:
                    child = read_source(found)
                except ClockError as error:
                    reason = error.diagnostics[0].message.split(": ", 1)[-1]
                    bag.add(messages.unreadable_import(use.dotted, target, reason, at))
                    continue
                visit(target, child, use)
        stack.pop()
        units[key] = Unit(key, src, module, tuple(imports), via.dotted if via is not None else Path(key).stem)

    visit(main_key, source if source is not None else read_source(path), None)
    bag.raise_if_errors()
    return Loaded(main_key, units)
