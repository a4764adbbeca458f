"""`dsl plan`: the plan of a `.clock` file as tables (condensed, or `--verbose`) or JSON (docs/plan-json.md).

`plan_of_file` is shared with `dsl render`: the plan of `args.file` (a file, a module name or `-`) under
its `--param` overrides, or the diagnostics that stopped it, reported.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from fractions import Fraction

from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.frontend import check_file
from duplexcadence.dsl.source import SourceFile
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    UsageError,
    add_common_options,
    add_limit_option,
    add_output_format_option,
    add_prune_option,
    add_stdin_filename_option,
    clock_inputs,
    color_wanted,
    diagnostics_json,
    limits_or_usage_error,
    non_negative,
    params_or_usage_error,
    positive,
    print_diagnostics,
)
from duplexcadence.interpreter.plans.off_plan import OffPlanError, OffPlanStep
from duplexcadence.interpreter.plans.plan import Plan, make_plan, to_json
from duplexcadence.interpreter.plans.plan_text import Memory, format_plan
from duplexcadence.interpreter.plans.samples import SessionLengthError

_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB)?")
_SIZE_UNITS = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def session_length(text: str) -> Fraction:
    """An argparse type: a positive decimal number of seconds, exact (`60`, `2.5`)."""
    if not _DECIMAL.fullmatch(text) or Fraction(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (60, 2.5), not {text!r}")
    return Fraction(text)


def memory_size(text: str) -> int:
    """An argparse type: a number of bytes, with an optional binary unit (`80GiB`, `512 MiB`, `1000000`)."""
    match = _SIZE.fullmatch(text.strip())
    size = int(Fraction(match.group(1)) * _SIZE_UNITS[match.group(2)]) if match is not None else 0
    if size < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive size such as 80GiB, 512MiB or 1000000 (bytes), not {text!r}"
        )
    return size


def device_memory() -> Memory | None:
    """The free memory of the CUDA device torch sees, or None (no torch, no device)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info()
    return Memory(free, f"free on {torch.cuda.get_device_name()}")


def plan_of_file(
    args: argparse.Namespace, diagnostics_format: str = "text", **plan_options
) -> tuple[Plan | None, dict[str, SourceFile]]:
    """The plan of `args.file` and the sources read; (None, sources) once the diagnostics that stopped
    it are reported: as text on stderr (coloured by `args.color`), or with `diagnostics_format="json"`
    as the diagnostics document on stdout."""
    overrides = params_or_usage_error(args.param)
    limits = limits_or_usage_error(args.limit)
    [item] = clock_inputs([args.file], stdin_filename=getattr(args, "stdin_filename", None))
    diagnostics: list[Diagnostic] = list(item.problems)
    sources: dict[str, SourceFile] = {}
    if not diagnostics:
        result = check_file(item.path, overrides, text=item.text, limits=limits)
        sources = result.sources
        diagnostics = list(result.errors)
        if not diagnostics and result.program is not None:
            try:
                return make_plan(result.program, **plan_options), sources
            except ClockError as error:
                diagnostics = list(error.diagnostics)
            except SessionLengthError as error:
                raise UsageError(str(error), ("give fewer --seconds",)) from None
            except OffPlanError as error:
                raise UsageError(str(error), ("see `dsl plan --help`, --off-plan",)) from None
    if diagnostics_format == "json":
        print(diagnostics_json([(item.path, diagnostics)]))
    else:
        color = color_wanted(getattr(args, "color", "auto"), sys.stderr)
        print_diagnostics(diagnostics, sources, "full", color, sys.stderr, item.path)
    return None, sources


def off_plan_step(text: str) -> OffPlanStep:
    """An argparse type: an off-plan step as `OffPlanStep.parse` reads it."""
    try:
        return OffPlanStep.parse(text)
    except OffPlanError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    plan, _ = plan_of_file(
        args,
        diagnostics_format=args.output_format,
        max_graphs=args.max_graphs,
        max_arena_bytes=args.max_arena_bytes,
        sessions=args.sessions,
        seconds=args.seconds,
        prune=args.prune,
        off_plan=args.off_plan,
    )
    if plan is None:
        return EXIT_PROBLEMS
    memory = Memory(args.memory, "--memory") if args.memory is not None else None
    if memory is None and plan.conversations.batched:
        memory = device_memory()
    if args.output_format == "json":
        document = to_json(plan)
        if memory is not None:
            document["conversations"]["memory"] = {
                "bytes": memory.bytes,
                "source": memory.source,
                "conversations": plan.conversations.fits(memory.bytes),
            }
        print(json.dumps(document, indent=1, sort_keys=True))
    else:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None  # a pipe gets whole lines
        sys.stdout.write(format_plan(plan, args.verbose, color_wanted(args.color, sys.stdout), width, memory))
    return EXIT_CLEAN


def register(commands) -> None:
    plan = commands.add_parser(
        "plan",
        help="print the plan: clocks, warm-up, memory per region, graphs",
        description="Plan a .clock file: its clocks, the warm-up until the state repeats, the memory of "
        "every region against stock, and the CUDA graphs to capture. Exit 0: planned; 1: the file has "
        "errors or cannot be planned (diagnostics on stderr, or on stdout with --output-format json); 2: a "
        "usage error.",
    )
    plan.add_argument(
        "file",
        metavar="FILE",
        help="a .clock file, a module name (models.mimi_decoder: the current folder, then the stdlib) or - "
        "for standard input",
    )
    plan.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    add_limit_option(plan)
    add_output_format_option(
        plan, help="text (default) or json: the plan as data (docs/plan-json.md), or the diagnostics"
    )
    plan.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list every family member and the views of every graph (default: alike members share a row)",
    )
    plan.add_argument(
        "--max-graphs",
        type=non_negative,
        default=None,
        metavar="N",
        help="capture at most N graphs (the rest of the firings run eagerly)",
    )
    plan.add_argument(
        "--max-arena-bytes",
        type=non_negative,
        default=None,
        metavar="BYTES",
        help="fail if the arena would exceed BYTES",
    )
    plan.add_argument("--sessions", type=positive, default=1, metavar="N", help="sessions sharing the arena")
    plan.add_argument(
        "--seconds",
        type=session_length,
        default=None,
        metavar="T",
        help="count every output's units over a session of T seconds (default 60, whole cadences, fewer where 60 s has over 10 000 000 instants)",
    )
    plan.add_argument(
        "--off-plan",
        type=off_plan_step,
        action="append",
        default=[],
        metavar="STEP",
        help="a step off the plan a session may take, traced and counted like the planned ones: "
        "'step NAME=COUNTS [at start|any]' (an input with other unit counts) or 'finish NAME=COUNTS [at ...]' "
        "(the last instant), COUNTS a number or LOW-HIGH; e.g. --off-plan 'finish tokens=0' (repeatable)",
    )
    plan.add_argument(
        "--memory",
        type=memory_size,
        default=None,
        metavar="SIZE",
        help="say how many conversations fit in SIZE (80GiB, 512MiB, bytes): the memory left for their state "
        "(default, for a file with batched stages: the free memory of the CUDA device torch sees, if any)",
    )
    add_prune_option(plan)
    add_stdin_filename_option(plan)
    add_common_options(plan)
    plan.set_defaults(handler=run)
