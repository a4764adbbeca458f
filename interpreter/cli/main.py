"""The `dsl` command (also `python -m duplexcadence`): check, fmt, plan, render, bench.

Exit codes: 0 clean, 1 problems found in the input, 2 a usage error (an unknown option, a value out of
range, a device that is not there, a missing optional package) or an internal error. No Python
traceback ever reaches the user for bad input; an internal error prints one line and asks for a bug
report (set DUPLEXCADENCE_DEBUG=1 to see the traceback).

Only the module of the command being run is imported: `dsl --help` lists the commands from
`COMMAND_SUMMARIES` without importing any, so it, `dsl COMMAND --help` and the language commands
start without torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from duplexcadence import __version__
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_USAGE,
    UsageError,
    add_common_options,
    missing_package,
    parse_params,
)

__all__ = ["COMMAND_MODULES", "COMMAND_SUMMARIES", "build_parser", "main", "parse_params"]

# Each subcommand is a module with `register(subparsers)` that sets `handler` (its run function).
COMMAND_MODULES = {
    "check": "duplexcadence.interpreter.cli.check",
    "fmt": "duplexcadence.interpreter.cli.fmt",
    "plan": "duplexcadence.interpreter.cli.plan",
    "render": "duplexcadence.interpreter.cli.render",
    "bench": "duplexcadence.interpreter.cli.bench",
    "draft": "duplexcadence.interpreter.cli.draft",
    "lsp": "duplexcadence.interpreter.cli.lsp",
    "serve": "duplexcadence.interpreter.cli.serve",
    "loadgen": "duplexcadence.interpreter.cli.loadgen",
}

# The line `dsl --help` shows for a command without importing its module (a command not listed here
# is imported for the listing).
COMMAND_SUMMARIES = {
    "check": "check .clock files and report every problem",
    "fmt": "print .clock files in canonical form",
    "plan": "print the plan: clocks, warm-up, memory per region, graphs",
    "render": "draw the plan with graphviz (the views: dsl render --list-views)",
    "bench": "benchmark a model tail: stock variants vs DuplexCadence",
    "serve": "serve a tail's sessions at the cadence over websockets",
    "loadgen": "drive N concurrent sessions against a dsl serve server",
}


def _register(commands, name: str) -> None:
    """Register `name` from its module; UsageError when the module needs a package that is not
    installed (torch, for `bench`)."""
    try:
        module = importlib.import_module(COMMAND_MODULES[name])
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] == "duplexcadence":
            raise
        raise missing_package(error, what=f"dsl {name}") from None
    module.register(commands)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `dsl` argument parser with the subcommand `only` registered in full; every other command is
    listed by its summary, its module not imported (None: only the listing)."""
    parser = argparse.ArgumentParser(
        prog="dsl",
        description="DuplexCadence: check, format, plan, draw and benchmark .clock files.",
        epilog="Exit codes: 0 clean, 1 problems in the input, 2 a usage error. "
        "`dsl COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"duplexcadence {__version__}")
    add_common_options(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        if name == only:
            _register(commands, name)
        elif only is None and name not in COMMAND_SUMMARIES:
            try:
                _register(commands, name)
            except UsageError:  # listed without its summary
                commands.add_parser(name, add_help=False)
        else:
            commands.add_parser(name, help=COMMAND_SUMMARIES.get(name), add_help=False)
    if only is not None:
        add_common_options(commands.choices[only])
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option (nor `--color`'s value)."""
    words = iter(argv)
    for word in words:
        if word == "--color":
            next(words, None)
        elif not word.startswith("-"):
            return word if word in COMMAND_MODULES else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_named(argv)
    try:
        parser = build_parser(only=command)
    except UsageError as error:  # the command's module needs a package that is not installed
        return _usage_error(str(command), error)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        return _usage_error(args.command, error)
    except KeyboardInterrupt:
        print("dsl: interrupted", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_CLEAN
    except ModuleNotFoundError as error:  # an optional package imported inside a run function
        if (error.name or "").partition(".")[0] == "duplexcadence":
            return _internal_error(error)
        return _usage_error(args.command, missing_package(error, what=f"dsl {args.command}"))
    except Exception as error:  # the last line of defence: never a traceback for the user
        return _internal_error(error)


def _usage_error(command: str, error: UsageError) -> int:
    print(f"dsl {command}: error: {error.message}", file=sys.stderr)
    for help_text in error.helps:
        print(f"  help: {help_text}", file=sys.stderr)
    return EXIT_USAGE


def _internal_error(error: BaseException) -> int:
    if os.environ.get("DUPLEXCADENCE_DEBUG"):
        traceback.print_exception(error)
    print(f"dsl: internal error: {type(error).__name__}: {error}", file=sys.stderr)
    print(
        "dsl: this is a bug in DuplexCadence; rerun with DUPLEXCADENCE_DEBUG=1 and report the traceback",
        file=sys.stderr,
    )
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
