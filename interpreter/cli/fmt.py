"""`dsl fmt`: print `.clock` files in canonical form, check that they are, or rewrite them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from duplexcadence.dsl.diagnostics import ClockError, InternalError
from duplexcadence.dsl.loader import read_source
from duplexcadence.dsl.parse import parse_module
from duplexcadence.dsl.printer import module as print_module
from duplexcadence.dsl.source import SourceFile
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    ClockInput,
    UsageError,
    add_common_options,
    add_output_format_option,
    add_stdin_filename_option,
    clock_inputs,
    color_wanted,
    print_diagnostics,
)


def canonical(item: ClockInput) -> tuple[SourceFile | None, str | None, dict[str, SourceFile], list]:
    """(source, canonical text, sources, diagnostics): the text is None when the input does not parse."""
    sources: dict[str, SourceFile] = {}
    if item.problems:
        return None, None, sources, list(item.problems)
    try:
        source = SourceFile(item.path, item.text) if item.text is not None else read_source(item.path)
        sources[item.path] = source
        tree = parse_module(source)
    except ClockError as error:
        return None, None, sources, list(error.diagnostics)
    text = print_module(tree)
    if parse_module(SourceFile(item.path, text)) != tree:  # the formatter must never change meaning
        raise InternalError(f"the canonical form of {item.path} does not parse back to the same program")
    return source, text, sources, []


def run(args: argparse.Namespace) -> int:
    inputs = clock_inputs(args.files, walk=True, stdin_filename=args.stdin_filename)
    if args.write and any(item.from_stdin for item in inputs):
        raise UsageError("--write cannot rewrite standard input", ("drop --write: the canonical text goes to stdout",))
    color = color_wanted(args.color, sys.stderr)
    status = EXIT_CLEAN
    changed = unchanged = 0
    documents: list[dict[str, Any]] = []
    for item in inputs:
        source, text, sources, diagnostics = canonical(item)
        if text is None or source is None:
            status = EXIT_PROBLEMS
            if args.output_format == "json":
                documents.append(
                    {
                        "path": item.path,
                        "diagnostics": [d.to_json() for d in diagnostics],
                        "changed": None,
                        "formatted": None,
                    }
                )
            else:
                print_diagnostics(diagnostics, sources, "full", color, sys.stderr, item.path)
            continue
        differs = text != source.text
        changed += differs
        unchanged += not differs
        if args.check and differs:
            status = EXIT_PROBLEMS
        if args.write and differs:
            with open(item.path, "w", encoding="utf-8") as handle:
                handle.write(text)
        if args.output_format == "json":
            documents.append({"path": item.path, "diagnostics": [], "changed": differs, "formatted": text})
        elif args.check:
            if differs:
                print(f"would reformat {item.path}")
        elif args.write:
            if differs and not args.quiet:
                print(f"reformatted {item.path}")
        else:
            sys.stdout.write(text)
    if args.output_format == "json":
        print(json.dumps(documents, indent=2, sort_keys=True))
    elif (args.check or args.write) and not args.quiet:
        verb = "would be reformatted" if args.check else "reformatted"
        noun = "file" if changed == 1 else "files"
        print(f"{changed} {noun} {verb}, {unchanged} already in canonical form.", file=sys.stderr)
    return status


def register(commands) -> None:
    fmt = commands.add_parser(
        "fmt",
        help="print .clock files in canonical form",
        description="Print .clock files in canonical form (comments and blank lines kept). Exit 0: done; "
        "1: a file does not parse, or with --check is not canonical; 2: a usage error.",
    )
    fmt.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="a .clock file, a directory (every *.clock under it), a module name or - for standard input",
    )
    group = fmt.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if a file is not in canonical form")
    group.add_argument("--write", action="store_true", help="rewrite files in place")
    add_output_format_option(
        fmt,
        help="text (default) or json: per file its diagnostics, whether it changes and its canonical text",
    )
    add_stdin_filename_option(fmt)
    add_common_options(fmt)
    fmt.set_defaults(handler=run)
