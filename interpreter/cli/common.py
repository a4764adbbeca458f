"""What every `dsl` subcommand shares: exit codes, argparse types, `--param` pairs, diagnostics output."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from duplexcadence.dsl import diagnostic_text as report
from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import Diagnostic

EXIT_CLEAN, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


def color_wanted(choice: str, stream) -> bool:
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return hasattr(stream, "isatty") and stream.isatty()


def non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def parse_params(pairs: Sequence[str]) -> tuple[dict[str, str], list[Diagnostic]]:
    """`NAME=VALUE` pairs from `--param`; malformed ones become diagnostics."""
    overrides: dict[str, str] = {}
    problems: list[Diagnostic] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip():
            problems.append(messages.override_syntax(pair))
            continue
        overrides[name.strip()] = value.strip()
    return overrides, problems


def print_diagnostics(
    diagnostics: Sequence[Diagnostic], sources, fmt: str, color: bool, stream, path: str | None = None
) -> None:
    """Print diagnostics in the `full` or `concise` form; `path` locates those without a span."""
    for diagnostic in diagnostics:
        if fmt == "concise":
            print(report.format_concise(diagnostic, path), file=stream)
        else:
            print(report.format_full(diagnostic, sources, color, path), file=stream)
            print(file=stream)
