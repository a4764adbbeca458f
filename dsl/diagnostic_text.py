"""Diagnostics as text: the full rustc/ruff-like form, the one-line concise form, and JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from duplexcadence.dsl.diagnostics import Diagnostic, Severity
from duplexcadence.dsl.source import SourceFile, Span

_STYLES = {
    "error": "\x1b[1;31m",
    "warning": "\x1b[1;33m",
    "note": "\x1b[1;36m",
    "help": "\x1b[1;32m",
    "bold": "\x1b[1m",
    "reset": "\x1b[0m",
}


def printable(text: str) -> str:
    """`text` safe for a terminal: control characters (an escape sequence hidden in a file could
    recolour or rewrite the screen) become U+FFFD, one character for one, so columns still line up."""
    return "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in text)


class _Painter:
    def __init__(self, color: bool):
        self.color = color

    def __call__(self, style: str, text: str) -> str:
        if not self.color:
            return text
        return f"{_STYLES[style]}{text}{_STYLES['reset']}"


def _excerpt(span: Span, sources: Mapping[str, SourceFile], paint: _Painter, gutter: int) -> list[str]:
    source = sources.get(span.path)
    if source is None:
        return []
    text = source.line(span.line)
    if not text and span.line > source.line_count:
        return []
    width = (span.end_column - span.column) if span.end_line == span.line else len(text) - span.column + 1
    width = max(1, width)
    pad = " " * gutter
    text = printable(text).expandtabs(1)
    return [
        f"{pad} |",
        f"{str(span.line).rjust(gutter)} | {text}",
        f"{pad} | " + " " * (span.column - 1) + paint("error", "^" * width),
    ]


def format_full(
    diagnostic: Diagnostic, sources: Mapping[str, SourceFile], color: bool = False, path: str | None = None
) -> str:
    """The long form: header, location, the source line with carets, notes and help lines.

    A diagnostic without a span (a file that cannot be read, a --param) shows `path` as its location."""
    paint = _Painter(color)
    severity = diagnostic.severity.value
    lines = [
        paint(severity, f"{severity}[{diagnostic.code.name}]") + paint("bold", f": {printable(diagnostic.message)}")
    ]
    spans = [diagnostic.span] + [n.span for n in diagnostic.notes]
    gutter = max((len(str(s.line)) for s in spans if s is not None), default=1)
    pad = " " * gutter
    if diagnostic.span is not None:
        lines.append(f"{pad}--> {printable(str(diagnostic.span))}")
        lines.extend(_excerpt(diagnostic.span, sources, paint, gutter))
    elif path is not None:
        lines.append(f"{pad}--> {printable(path)}")
    for note in diagnostic.notes:
        location = f" ({note.span})" if note.span is not None else ""
        lines.append(f"{pad} = " + paint("note", "note") + f": {printable(note.message)}{location}")
        if note.span is not None:
            lines.extend(_excerpt(note.span, sources, paint, gutter)[1:])
    for help_text in diagnostic.helps:
        lines.append(f"{pad} = " + paint("help", "help") + f": {printable(help_text)}")
    return "\n".join(lines)


def format_concise(diagnostic: Diagnostic, path: str | None = None) -> str:
    """One line: `path:line:col: error: message [code]` (without a span: `path: error: ...`)."""
    where = str(diagnostic.span) if diagnostic.span is not None else (path or "dsl")
    return f"{printable(where)}: {diagnostic.severity.value}: {printable(diagnostic.message)} [{diagnostic.code.name}]"


def summary(diagnostics: Iterable[Diagnostic], files: int) -> str:
    diagnostics = list(diagnostics)
    errors = sum(d.severity is Severity.ERROR for d in diagnostics)
    warnings = len(diagnostics) - errors
    noun = "file" if files == 1 else "files"
    if not diagnostics:
        return f"All clean: {files} {noun} checked."
    parts = []
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    return f"Found {' and '.join(parts)} in {files} {noun}."


def to_json(results: Iterable[tuple[str, Iterable[Diagnostic]]]) -> str:
    payload = [{"path": path, "diagnostics": [d.to_json() for d in diagnostics]} for path, diagnostics in results]
    return json.dumps(payload, indent=2, sort_keys=True)
