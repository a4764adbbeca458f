"""Source files and positions: what a diagnostic points at."""

from __future__ import annotations

import functools

import attrs


@attrs.frozen(order=True)
class Span:
    """A region of one source file: 1-based line and column, end exclusive.

    Ordered by (path, line, column) so diagnostics sort by position.
    """

    path: str
    line: int
    column: int
    end_line: int
    end_column: int

    @classmethod
    def point(cls, path: str, line: int, column: int, width: int = 1) -> Span:
        return cls(path, line, column, line, column + max(width, 1))

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


@attrs.frozen
class SourceFile:
    """The text of one `.clock` file, kept for carets under spans."""

    path: str
    text: str

    def line(self, number: int) -> str:
        """The text of 1-based line `number` without its newline ('' past the end)."""
        lines = _lines(self.text)
        return lines[number - 1].rstrip("\r") if 1 <= number <= len(lines) else ""

    @property
    def line_count(self) -> int:
        return self.text.count("\n") + (0 if self.text.endswith("\n") or not self.text else 1)

    def end_span(self) -> Span:
        """A one-column span just after the last non-blank character (where "the file ended" errors
        point), or 1:1 for a blank file."""
        stripped = self.text.rstrip()
        if not stripped:
            return Span.point(self.path, 1, 1)
        lines = stripped.split("\n")
        return Span.point(self.path, len(lines), len(lines[-1]) + 1)


@functools.lru_cache(maxsize=16)
def _lines(text: str) -> tuple[str, ...]:
    """The lines of a text, split once: a file with thousands of diagnostics quotes a line for each.
    The parser counts "\n" only, not every Unicode line break."""
    return tuple(text.split("\n"))
