"""`dsl render`: draw a `.clock` file's plan; the views are those of `duplexcadence.interpreter.views.registry`."""

from __future__ import annotations

import argparse
import sys

from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    UsageError,
    add_limit_option,
    add_output_format_option,
    add_prune_option,
    non_negative,
    positive,
    status,
)
from duplexcadence.interpreter.cli.plan import plan_of_file
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.views.output import FORMATS, RenderError, output_format, to_bytes, write_output
from duplexcadence.interpreter.views.registry import DEFAULT_VIEW, VIEWS
from duplexcadence.interpreter.views.render import render_plan


def list_views() -> str:
    """`dsl render --list-views`: one line per registered view, its name then its summary."""
    width = max(len(name) for name in VIEWS)
    return "".join(f"{view.name:<{width}}  {view.summary}\n" for view in VIEWS.values())


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
    if args.list_views:
        sys.stdout.write(list_views())
        return EXIT_CLEAN
    if args.file is None:
        raise UsageError("name the .clock FILE to draw", helps=("dsl render --list-views lists the views",))
    try:
        chosen = output_format(args.output, args.output_format)
        if args.output is None and chosen in ("png", "pdf") and sys.stdout.isatty():
            raise RenderError(f"{chosen} is binary: write it to a file with -o OUT.{chosen}")
    except RenderError as error:
        print(f"dsl render: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    plan, _ = plan_of_file(args, max_graphs=args.max_graphs, prune=args.prune)
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
            status(args, f"wrote {args.output} ({args.view}, {chosen})")
    except RenderError as error:
        print(f"dsl render: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_CLEAN


def register(commands) -> None:
    render = commands.add_parser(
        "render",
        help="draw the plan with graphviz: " + ", ".join(VIEWS) + " (dsl render --list-views)",
        description="Draw a .clock file's plan. DOT text needs nothing else; svg, png and pdf need "
        "Graphviz's `dot` (apt-get install graphviz / brew install graphviz).",
    )
    render.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="a .clock file, a module name (models.mimi_decoder: the current folder, then the stdlib) or - for "
        "standard input",
    )
    render.add_argument(
        "--view",
        choices=tuple(VIEWS),
        default=DEFAULT_VIEW,
        help="; ".join(f"{view.name}: {view.summary}" for view in VIEWS.values()),
    )
    render.add_argument("--list-views", action="store_true", help="list the views with what each draws, and exit")
    render.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a param")
    add_limit_option(render)
    add_prune_option(render)
    render.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="OUT",
        help="write here (.dot/.gv, .svg, .png, .pdf); default: standard output",
    )
    add_output_format_option(
        render, choices=FORMATS, default=None, help="the drawing's format (default: from the -o suffix, else dot)"
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
