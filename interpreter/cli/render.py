"""`dsl render`: draw a `.clock` file's plan; the views are those of `duplexcadence.interpreter.views.registry`."""

from __future__ import annotations

import argparse
import sys

from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    UsageError,
    non_negative,
    positive,
)
from duplexcadence.interpreter.cli.plan import plan_of_file
from duplexcadence.interpreter.views.output import FORMATS, RenderError, output_format, to_bytes, write_output
from duplexcadence.interpreter.views.registry import DEFAULT_VIEW, VIEWS
from duplexcadence.interpreter.views.render import render_plan


def list_views() -> str:
    """`dsl render --list-views`: one line per registered view, its name then its summary."""
    width = max(len(name) for name in VIEWS)
    return "".join(f"{view.name:<{width}}  {view.summary}\n" for view in VIEWS.values())


def run(args: argparse.Namespace) -> int:
    if args.list_views:
        sys.stdout.write(list_views())
        return EXIT_CLEAN
    if args.file is None:
        raise UsageError("name the .clock FILE to draw", helps=("dsl render --list-views lists the views",))
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
    try:
        data = to_bytes(render_plan(plan, args.view, args.ticks), chosen)
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
        type=positive,
        default=None,
        metavar="N",
        help="timeline: draw N instants from session start (default: warm-up + one steady period)",
    )
    render.add_argument(
        "--max-graphs",
        type=non_negative,
        default=None,
        metavar="N",
        help="plan with at most N graphs (the other firings show as eager)",
    )
    render.set_defaults(handler=run)
