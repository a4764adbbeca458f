"""The front-end driver: load -> resolve -> checks -> dependency graph, composed in that order.

`check_file` never raises for a bad program: it returns every diagnostic it found, sorted. 
`load_program` is the same for library users who want a `Program` or an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from . import checks, depgraph, loader, messages, resolve
from .diagnostics import ClockError, Diagnostic, Severity
from .program import Program
from .source import SourceFile


@attrs.frozen
class CheckResult:
    """The outcome of checking one file: the program (None if errors stopped it) and its diagnostics."""

    path: str
    program: Program | None
    diagnostics: tuple[Diagnostic, ...]
    sources: dict[str, SourceFile] = attrs.field(hash=False, eq=False)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors


def check_file(path: str | Path, overrides: Mapping[str, str] | None = None,
               text: str | None = None) -> CheckResult:
    """Check `path` (or `text` given for it); never raises for a bad file."""
    path = str(path)
    sources: dict[str, SourceFile] = {}
    try:
        source = SourceFile(path, text) if text is not None else _read(path)
        sources[path] = source
        loaded = loader.load(path, source)
        sources.update({key: unit.source for key, unit in loaded.units.items()})
        program, found = resolve.resolve(loaded, overrides)
        program, problems = checks.run(program)
        found.extend(problems)
        program = attrs.evolve(program, graph=depgraph.build(program))
    except ClockError as error:
        return CheckResult(path, None, tuple(error.diagnostics), sources)
    diagnostics = tuple(sorted(found, key=Diagnostic.sort_key))
    has_errors = any(d.severity is Severity.ERROR for d in diagnostics)
    return CheckResult(path, None if has_errors else program, diagnostics, sources)


def load_program(path: str | Path, overrides: Mapping[str, str] | None = None) -> Program:
    """A checked program, or ClockError with every error (warnings are dropped)."""
    result = check_file(path, overrides)
    if result.program is None:
        raise ClockError(result.errors)
    return result.program


def _read(path: str) -> SourceFile:
    target = Path(path)
    if target.is_dir():
        raise ClockError([messages.unreadable(path, "it is a directory")])
    try:
        size = target.stat().st_size
    except OSError as error:
        raise ClockError([messages.unreadable(path, error.strerror or str(error))]) from None
    if size > 10 * 1_000_000:
        raise ClockError([messages.file_too_large(path, size, 1_000_000)])
    try:
        return SourceFile.read(target)
    except UnicodeDecodeError as error:
        raise ClockError([messages.unreadable(path, f"not UTF-8 text ({error.reason} at byte {error.start})")]) from None
    except OSError as error:
        raise ClockError([messages.unreadable(path, error.strerror or str(error))]) from None
