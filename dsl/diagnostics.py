"""Diagnostics: located problems, collected per file and reported sorted by position.

The wording of every diagnostic lives in `duplexcadence.dsl.messages`; this module only carries them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator

import attrs

from duplexcadence.dsl.source import Span


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"


@attrs.frozen
class ErrorCode:
    """A registered diagnostic code: `name` is what users see (`[retention-too-short]`)."""

    name: str
    summary: str
    severity: Severity = Severity.ERROR


@attrs.frozen
class Note:
    """A secondary line under a diagnostic, optionally pointing at a second site."""

    message: str
    span: Span | None = None


@attrs.frozen
class Diagnostic:
    """One problem: what is wrong (`message`), where (`span`), and what would be legal (`helps`)."""

    code: ErrorCode
    message: str
    span: Span | None
    notes: tuple[Note, ...] = ()
    helps: tuple[str, ...] = ()

    @property
    def severity(self) -> Severity:
        return self.code.severity

    def sort_key(self) -> tuple:
        if self.span is None:
            return ("", 0, 0, self.code.name, self.message)
        return (self.span.path, self.span.line, self.span.column, self.code.name, self.message)

    def to_json(self) -> dict:
        def span_json(span: Span | None) -> dict | None:
            return None if span is None else attrs.asdict(span)

        return {
            "code": self.code.name,
            "severity": self.severity.value,
            "message": self.message,
            "span": span_json(self.span),
            "notes": [{"message": n.message, "span": span_json(n.span)} for n in self.notes],
            "helps": list(self.helps),
        }


class ClockError(Exception):
    """Raised when a program cannot go further: carries every diagnostic found so far, sorted."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        super().__init__(
            "\n".join(
                (f"{d.span}: " if d.span is not None else "") + f"{d.message} [{d.code.name}]" for d in self.diagnostics
            )
        )


class InternalError(Exception):
    """A broken invariant inside DuplexCadence (a bug, never the user's input)."""


@attrs.define
class DiagnosticBag:
    """Collects diagnostics during a pass; `raise_if_errors` stops the pipeline with all of them.

    A diagnostic equal to one already in the bag (same code, message, span, notes and helps) is
    dropped; the check is a set lookup, so a file that repeats one mistake thousands of times stays
    linear."""

    items: list[Diagnostic] = attrs.field(factory=list)
    seen: set[Diagnostic] = attrs.field(factory=set, repr=False)

    def add(self, diagnostic: Diagnostic) -> None:
        if diagnostic not in self.seen:
            self.seen.add(diagnostic)
            self.items.append(diagnostic)

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        for d in diagnostics:
            self.add(d)

    def __iter__(self) -> Iterator[Diagnostic]:
        return iter(sorted(self.items, key=Diagnostic.sort_key))

    def __len__(self) -> int:
        return len(self.items)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self if d.severity is Severity.ERROR]

    def raise_if_errors(self) -> None:
        if self.errors:
            raise ClockError(self.items)
