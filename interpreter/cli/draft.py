"""`dsl draft MODULE:FUNCTION`: run a stock streaming loop and print the `.clock` file that declares its state.

FUNCTION (in a module importable from the current folder or the installed packages) takes the
`--option KEY=VALUE` pairs as keywords and returns an `interpreter.draft.loop.StockLoop`. The draft
goes to stdout (or `--output FILE`), a one-line summary to stderr; the exit code is 1 when the draft
does not pass `dsl check` (its diagnostics are printed), 2 when the loop cannot be built or run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    UsageError,
    color_wanted,
    non_negative,
    print_diagnostics,
)
from duplexcadence.interpreter.draft.draft import DEFAULT_CALLS, DEFAULT_MAX_CALLS, draft
from duplexcadence.interpreter.draft.loop import StockLoop
from duplexcadence.interpreter.draft.propose import DraftError
from duplexcadence.interpreter.draft.record import StepError


def _loop_function(spec: str) -> Callable[..., object] | str:
    """FUNCTION of `MODULE:FUNCTION`, or an error message."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        return f"'{spec}' is not MODULE:FUNCTION (a function returning a StockLoop, e.g. mymodel_draft:stock_loop)"
    try:
        return tails.import_function(module_name, function_name)
    except tails.ImportFailed as error:
        return str(error)


def _options(pairs: list[str]) -> dict[str, str] | str:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            return f"--option {pair!r} is not KEY=VALUE"
        options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    make_loop = _loop_function(args.loop)
    if isinstance(make_loop, str):
        raise UsageError(make_loop)
    options = _options(args.option)
    if isinstance(options, str):
        raise UsageError(options)
    if args.calls < 2:
        raise UsageError(f"--calls must be at least 2 (drafting compares calls), not {args.calls}")
    try:
        loop = make_loop(**options)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{args.loop}({', '.join(options)}) failed: {error}") from None
    if not isinstance(loop, StockLoop):
        raise UsageError(f"{args.loop} returned {type(loop).__name__}, not a StockLoop")
    path = args.output or "draft.clock"
    try:
        result = draft(loop, calls=args.calls, max_calls=args.max_calls, source=args.loop, path=path)
    except (StepError, DraftError) as error:
        raise UsageError(str(error)) from None
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(result.text)
    else:
        sys.stdout.write(result.text)
    if result.check.diagnostics:
        print_diagnostics(
            result.check.diagnostics, result.check.sources, "full", color_wanted("auto", sys.stderr), sys.stderr, path
        )
    print(f"dsl draft: {result.summary()}", file=sys.stderr)
    return EXIT_CLEAN if result.check.ok else EXIT_PROBLEMS


def register(commands) -> None:
    parser = commands.add_parser("draft", help="draft a .clock file from a stock streaming loop")
    parser.add_argument("loop", metavar="MODULE:FUNCTION", help="a function returning a StockLoop")
    parser.add_argument("--calls", type=non_negative, default=DEFAULT_CALLS, help="stock calls to run (at least 2)")
    parser.add_argument(
        "--max-calls", type=non_negative, default=DEFAULT_MAX_CALLS, help="run on up to this many while a tensor grows"
    )
    parser.add_argument("--output", metavar="FILE", help="write the draft here instead of stdout")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a keyword for FUNCTION")
    parser.set_defaults(handler=run)
