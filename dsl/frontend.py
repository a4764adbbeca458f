"""The front-end driver: load -> resolve -> checks -> dependency graph, composed in that order.

`check_file` never raises for a bad program: it returns every diagnostic it found, sorted.
`load_program` is the same for library users who want a `Program` or an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from duplexcadence.dsl import checks, depgraph, loader, messages, resolve
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic, Severity
from duplexcadence.dsl.limits import Limits
from duplexcadence.dsl.program import Program
from duplexcadence.dsl.source import SourceFile


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


def check_file(
    path: str | Path,
    overrides: Mapping[str, str] | None = None,
    text: str | None = None,
    limits: Limits | Mapping[str, int] | None = None,
) -> CheckResult:
    """Check `path` (or `text` given for it) under `limits` (dsl/limits.py: a `Limits`, or a mapping
    that raises some of the defaults; ValueError for an unknown name); never raises for a bad file.
    The program carries its limits to its plan."""
    path = str(path)
    limits = Limits.of(limits)
    sources: dict[str, SourceFile] = {}
    try:
        source = SourceFile(path, text) if text is not None else loader.read_source(path)
        sources[path] = source
        loaded = loader.load(path, source, sources)
        program, found = resolve.resolve(loaded, overrides, limits)
        if not loaded.units[loaded.main].module.statements:
            found.append(messages.empty_file(path))
        program, problems = checks.run(program)
        found.extend(problems)
        program = attrs.evolve(program, graph=depgraph.build(program))
    except ClockError as error:
        return CheckResult(path, None, tuple(error.diagnostics), sources)
    has_errors = any(d.severity is Severity.ERROR for d in found)
    if has_errors:  # with errors the program is incomplete: a region may only look unused
        found = [d for d in found if d.code is not messages.UNUSED_REGION]
    diagnostics = tuple(sorted(checks.collapse_family_members(found), key=Diagnostic.sort_key))
    return CheckResult(path, None if has_errors else program, diagnostics, sources)


def load_program(
    path: str | Path, overrides: Mapping[str, str] | None = None, limits: Limits | Mapping[str, int] | None = None
) -> Program:
    """A checked program, or ClockError with every error (warnings are dropped)."""
    result = check_file(path, overrides, limits=limits)
    if result.program is None:
        raise ClockError(result.errors)
    return result.program
