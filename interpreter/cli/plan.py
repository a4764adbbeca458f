"""`dsl plan` (and the other interpreter subcommands), registered into the `dsl` CLI."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.frontend import check_file
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    non_negative,
    parse_params,
    print_diagnostics,
)
from duplexcadence.interpreter.plans.plan import Plan, make_plan, to_json
from duplexcadence.interpreter.plans.plan_text import format_plan


def plan_of_file(args: argparse.Namespace, **plan_options) -> tuple[Plan | None, Any]:
    """The plan of `args.file` under its `--param` overrides, and the sources for later diagnostics;
    (None, sources) once the checker's or the planner's diagnostics are printed to stderr."""
    overrides, problems = parse_params(args.param)
    result = check_file(args.file, overrides)
    diagnostics = problems + list(result.errors)
    if not diagnostics and result.program is not None:
        try:
            return make_plan(result.program, **plan_options), result.sources
        except ClockError as error:
            diagnostics = list(error.diagnostics)
    print_diagnostics(diagnostics, result.sources, "full", False, sys.stderr, args.file)
    return None, result.sources


def run(args: argparse.Namespace) -> int:
    plan, _ = plan_of_file(
        args, max_graphs=args.max_graphs, max_arena_bytes=args.max_arena_bytes, sessions=args.sessions
    )
    if plan is None:
        return EXIT_PROBLEMS
    if args.json:
        print(json.dumps(to_json(plan), indent=1, sort_keys=True))
    else:
        sys.stdout.write(format_plan(plan))
    return EXIT_CLEAN


def register(commands) -> None:
    plan = commands.add_parser("plan", help="print the plan: clocks, warm-up, memory per region, graphs")
    plan.add_argument("file", metavar="FILE")
    plan.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (docs/plan-json.md)")
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
    plan.add_argument("--sessions", type=int, default=1, metavar="N", help="sessions sharing the arena")
    plan.set_defaults(handler=run)
