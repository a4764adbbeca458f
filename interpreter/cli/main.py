"""The `dsl` command: check, fmt, plan, render (and the benchmarks, once examples are installed).

Exit codes: 0 clean, 1 problems found in the input, 2 usage or internal error. No Python traceback
ever reaches the user for a bad file; an internal error prints one line and asks for a bug report
(set DUPLEXCADENCE_DEBUG=1 to see the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from duplexcadence.dsl import diagnostic_text as report
from duplexcadence.dsl.diagnostics import ClockError, InternalError
from duplexcadence.dsl.frontend import check_file
from duplexcadence.dsl.loader import read_source
from duplexcadence.dsl.parse import parse_module
from duplexcadence.dsl.printer import module as print_module
from duplexcadence.dsl.source import SourceFile
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    color_wanted,
    parse_params,
    print_diagnostics,
)


def cmd_check(args: argparse.Namespace) -> int:
    overrides, problems = parse_params(args.param)
    if problems:  # a malformed NAME=VALUE is a usage error, like an unknown option
        for problem in problems:
            print(f"dsl check: error: {problem.message}", file=sys.stderr)
            for help_text in problem.helps:
                print(f"  help: {help_text}", file=sys.stderr)
        return EXIT_USAGE
    color = color_wanted(args.color, sys.stdout)
    results = []
    for path in args.files:
        result = check_file(path, overrides)
        diagnostics = list(result.diagnostics)
        results.append((path, diagnostics, result.sources))
    all_diagnostics = [d for _, ds, _ in results for d in ds]
    if args.format == "json":
        print(report.to_json((path, ds) for path, ds, _ in results))
    else:
        for path, diagnostics, sources in results:
            print_diagnostics(diagnostics, sources, args.format, color, sys.stdout, path)
        print(report.summary(all_diagnostics, len(args.files)))
    return EXIT_PROBLEMS if any(d.severity.value == "error" for d in all_diagnostics) else EXIT_CLEAN


def cmd_fmt(args: argparse.Namespace) -> int:
    status = EXIT_CLEAN
    changed = unchanged = 0
    for path in args.files:
        sources = {}
        try:
            source = read_source(path)
            sources[path] = source
            tree = parse_module(source)
        except ClockError as error:
            print_diagnostics(error.diagnostics, sources, "full", False, sys.stderr, path)
            status = EXIT_PROBLEMS
            continue
        text = print_module(tree)
        if parse_module(SourceFile(path, text)) != tree:  # the formatter must never change meaning
            raise InternalError(f"the canonical form of {path} does not parse back to the same program")
        if text == source.text:
            unchanged += 1
        else:
            changed += 1
        if args.check:
            if text != source.text:
                print(f"would reformat {path}")
                status = EXIT_PROBLEMS
        elif args.write:
            if text != source.text:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
                print(f"reformatted {path}")
        else:
            sys.stdout.write(text)
    if args.check or args.write:
        verb = "would be reformatted" if args.check else "reformatted"
        noun = "file" if changed == 1 else "files"
        print(f"{changed} {noun} {verb}, {unchanged} already in canonical form.", file=sys.stderr)
    return status


# Subcommands beyond check and fmt, each a module with `register(subparsers)`; only the module of the
# command being run is imported (with every one for `--help`), and one whose optional dependencies are
# missing (torch, for `bench`) is left out of the parser.
COMMAND_MODULES = {
    "plan": "duplexcadence.interpreter.cli.plan",
    "render": "duplexcadence.interpreter.cli.render",
    "bench": "duplexcadence.interpreter.cli.bench",
    "draft": "duplexcadence.interpreter.cli.draft",
    "lsp": "duplexcadence.interpreter.cli.lsp",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `dsl` argument parser; `only` names the one subcommand beyond check and fmt to register
    (None: all of them)."""
    parser = argparse.ArgumentParser(prog="dsl", description="DuplexCadence: .clock files, plans and renders.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser("check", help="check .clock files and report every problem")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    check.add_argument("--format", choices=("full", "concise", "json"), default="full")
    check.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    check.set_defaults(handler=cmd_check)

    fmt = commands.add_parser("fmt", help="print .clock files in canonical form")
    fmt.add_argument("files", nargs="+", metavar="FILE")
    group = fmt.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if a file is not in canonical form")
    group.add_argument("--write", action="store_true", help="rewrite files in place")
    fmt.set_defaults(handler=cmd_fmt)

    for name, module_name in COMMAND_MODULES.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # e.g. `bench` without torch: check, fmt, plan and render still work
            continue
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=argv[0] if argv and argv[0] in (*COMMAND_MODULES, "check", "fmt") else None)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("dsl: interrupted", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_CLEAN
    except Exception as error:  # the last line of defence: never a traceback for the user
        if os.environ.get("DUPLEXCADENCE_DEBUG"):
            traceback.print_exc()
        print(f"dsl: internal error: {type(error).__name__}: {error}", file=sys.stderr)
        print(
            "dsl: this is a bug in DuplexCadence; rerun with DUPLEXCADENCE_DEBUG=1 and report the traceback",
            file=sys.stderr,
        )
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
