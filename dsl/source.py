"""Source files and positions: what a diagnostic points at."""

from __future__ import annotations

from pathlib import Path

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

    @classmethod
    def read(cls, path: str | Path) -> SourceFile:
        """Read a file as UTF-8; raises OSError or UnicodeDecodeError (the CLI reports both)."""
        data = Path(path).read_bytes()
        if b"\x00" in data:
            raise UnicodeDecodeError("utf-8", data, data.index(b"\x00"), data.index(b"\x00") + 1,
                                     "NUL byte: this is a binary file, not a .clock file")
        return cls(str(path), data.decode("utf-8"))

    def line(self, number: int) -> str:
        """The text of 1-based line `number` without its newline ('' past the end)."""
        lines = self.text.splitlines()
        return lines[number - 1] if 1 <= number <= len(lines) else ""

    def end_span(self) -> Span:
        """A one-column span just after the last character (where 'file ended' errors point)."""
        lines = self.text.splitlines() or [""]
        if self.text.endswith("\n"):
            return Span.point(self.path, len(lines) + 1, 1)
        return Span.point(self.path, len(lines), len(lines[-1]) + 1)
