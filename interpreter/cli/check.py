"""`dsl check`: check `.clock` files (and what they import) and report every problem."""

from __future__ import annotations

import argparse
import sys

from duplexcadence.dsl import diagnostic_text as report
from duplexcadence.dsl.diagnostics import Severity
from duplexcadence.dsl.frontend import CheckResult, check_file
from duplexcadence.dsl.limits import Limits
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    ClockInput,
    add_common_options,
    add_limit_option,
    add_output_format_option,
    add_stdin_filename_option,
    clock_inputs,
    color_wanted,
    diagnostics_json,
    limits_or_usage_error,
    params_or_usage_error,
    print_diagnostics,
)


def check_input(item: ClockInput, overrides: dict[str, str], limits: Limits | None = None) -> CheckResult:
    if item.problems:
        return CheckResult(item.path, None, item.problems, {})
    return check_file(item.path, overrides, text=item.text, limits=limits)


def run(args: argparse.Namespace) -> int:
    overrides = params_or_usage_error(args.param)
    limits = limits_or_usage_error(args.limit)
    inputs = clock_inputs(args.files, walk=True, stdin_filename=args.stdin_filename)
    results = [check_input(item, overrides, limits) for item in inputs]
    every = [d for result in results for d in result.diagnostics]
    if args.output_format == "json":
        print(diagnostics_json((result.path, result.diagnostics) for result in results))
    else:
        color = color_wanted(args.color, sys.stdout)
        form = "concise" if args.output_format == "concise" else "full"
        for result in results:
            print_diagnostics(result.diagnostics, result.sources, form, color, sys.stdout, result.path)
        if not args.quiet:
            print(report.summary(every, len(results)))
    return EXIT_PROBLEMS if any(d.severity is Severity.ERROR for d in every) else EXIT_CLEAN


def register(commands) -> None:
    check = commands.add_parser(
        "check",
        help="check .clock files and report every problem",
        description="Check .clock files (and what they import) and report every problem. Exit 0: no "
        "errors (warnings allowed); 1: errors; 2: a usage error.",
    )
    check.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="a .clock file, a directory (every *.clock under it), a module name (models.mimi_decoder: "
        "the current folder, then the stdlib) or - for standard input",
    )
    check.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    add_limit_option(check)
    add_output_format_option(
        check,
        choices=("text", "concise", "json"),
        hidden=("full",),
        help="text (default: rustc-like, with the source), concise (one line each) or json",
    )
    add_stdin_filename_option(check)
    add_common_options(check)
    check.set_defaults(handler=run)
