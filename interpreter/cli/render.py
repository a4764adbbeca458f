"""`dsl render`: draw a `.clock` file's plan (views in `duplexcadence.interpreter.views`)."""

from __future__ import annotations

import argparse
import sys

from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    add_limit_option,
    non_negative,
    positive,
    status,
)
from duplexcadence.interpreter.cli.plan import plan_of_file
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.views.render import (
    FORMATS,
    VIEWS,
    RenderError,
    output_format,
    render_plan,
    to_bytes,
    write_output,
)

MAX_TICKS = 10_000
"""The most instants `--ticks` draws: the default limit of a warm-up, and after the warm-up every
instant repeats the steady period (drawing a million would take minutes and show nothing new)."""


def ticks_count(text: str) -> int:
    """An argparse type: an integer from 1 to MAX_TICKS."""
    value = positive(text)
    if value > MAX_TICKS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_TICKS}, not {value}")
    return value


TIMELINE_WORK = 1_000_000
"""The timeline gives alike members of a family one lane, comparing every member's cells with the
others' at each instant it draws: F x F x instants for a family of F members. Past this many, the
timeline draws fewer instants (its title says how many are shown) so that it takes seconds."""


def timeline_ticks(plan: Plan, ticks: int | None) -> tuple[int | None, str | None]:
    """The instants the timeline draws (None: its default, the warm-up and one steady period), and
    why fewer than asked, if so."""
    if not plan.program.families:
        return ticks, None
    family, members = max(plan.program.families.items(), key=lambda item: (len(item[1]), item[0]))
    wanted = ticks if ticks is not None else len(plan.trace.states)
    most = max(1, TIMELINE_WORK // (len(members) * len(members)))
    if wanted <= most:
        return ticks, None
    return most, (
        f"the timeline shows the first {most} of {wanted} instants: family '{family}' has {len(members)} "
        "members, and comparing them at every instant would take minutes (the graph and arena views show all)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        chosen = output_format(args.output, args.format)
        if args.output is None and chosen in ("png", "pdf") and sys.stdout.isatty():
            raise RenderError(f"{chosen} is binary: write it to a file with -o OUT.{chosen}")
    except RenderError as error:
        print(f"dsl render: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    plan, _ = plan_of_file(args, max_graphs=args.max_graphs)
    if plan is None:
        return EXIT_PROBLEMS
    ticks = args.ticks
    if args.view == "timeline":
        ticks, fewer = timeline_ticks(plan, ticks)
        if fewer is not None:
            status(args, f"dsl render: {fewer}")
    try:
        data = to_bytes(render_plan(plan, args.view, ticks), chosen)
        if args.output is None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            write_output(data, args.output)
            print(f"wrote {args.output} ({args.view}, {chosen})", file=sys.stderr)
    except RenderError as error:
        print(f"dsl render: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_CLEAN


def register(commands) -> None:
    render = commands.add_parser(
        "render",
        help="draw the plan with graphviz: timeline, dataflow graph or arena map",
        description="Draw a .clock file's plan. DOT text needs nothing else; svg, png and pdf need "
        "Graphviz's `dot` (apt-get install graphviz / brew install graphviz).",
    )
    render.add_argument("file", metavar="FILE")
    render.add_argument(
        "--view",
        choices=VIEWS,
        default="timeline",
        help="timeline (default): firings and region fill per instant; graph: the dataflow; arena: the memory map",
    )
    render.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    add_limit_option(render)
    render.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="OUT",
        help="write here (.dot/.gv, .svg, .png, .pdf); default: standard output",
    )
    render.add_argument(
        "--format", choices=FORMATS, default=None, help="output format (default: from the -o suffix, else dot)"
    )
    render.add_argument(
        "--ticks",
        type=ticks_count,
        default=None,
        metavar="N",
        help=f"timeline: draw N instants from session start, at most {MAX_TICKS} (default: warm-up + one steady "
        "period)",
    )
    render.add_argument(
        "--max-graphs",
        type=non_negative,
        default=None,
        metavar="N",
        help="plan with at most N graphs (the other firings show as eager)",
    )
    render.set_defaults(handler=run)
