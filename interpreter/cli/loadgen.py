"""`dsl loadgen URL`: N concurrent sessions against a `dsl serve` server, T ticks each, then the numbers.

It opens one session first to read what the server serves (its `ready` frame). A registered tail gives the
ticks' inputs (each session's own seeded stream) and, with `--verify`, the stock loop every recorded output
is compared with, after the load, on `--verify-device` (the server's device by default): each session's inputs
run alone, or, when the server runs lockstep groups, the tail's batched decode of each group with its members'
inputs in their rows (every member of those groups must be one of this run's sessions); another tail gets
zeros of its input shapes. Prints the sessions opened and refused, tick
latency p50 / p99, missed ticks and errors; exit 1 when a session was refused, a tick failed or an output
differs from stock.
"""

from __future__ import annotations

import argparse
import json
from urllib.parse import urlsplit, urlunsplit

from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    UsageError,
    add_json_path_option,
    add_output_format_option,
    device_name,
    non_negative,
    positive,
)

DESCRIPTION = "Drive N concurrent sessions against a dsl serve server, T ticks each, and print the numbers."


TAIL_DEFAULTS: dict[str, object] = {
    "--sessions": 4,
    "--ticks": 50,
    "--bundle": 1,
    "--verify": False,
    "--verify-device": None,
}
"""The tail mode's options and their defaults: with --conversations, one set otherwise is refused."""


def session_url(url: str) -> str:
    """`URL` as the session websocket's address: ws(s)://, with `/v1/session` when no path is given."""
    parts = urlsplit(url if "://" in url else f"ws://{url}")
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise UsageError(f"{url!r} is not a ws://, wss://, http:// or https:// address")
    path = parts.path if parts.path not in ("", "/") else "/v1/session"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def realtime_url(url: str) -> str:
    """`URL` as the conversation websocket's address: ws(s)://, with `/v1/realtime` when no path is given."""
    parts = urlsplit(session_url(url))
    path = "/v1/realtime" if parts.path == "/v1/session" and "/v1/session" not in url else parts.path
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def run_conversations(args: argparse.Namespace) -> int:
    """`--conversations N`: N scripted conversations against a `dsl serve ENGINE --conversations` server."""
    import asyncio

    from duplexcadence.interpreter.serve.realtime.loadgen import Script, run_conversations

    tail_options = [
        option for option, default in TAIL_DEFAULTS.items() if getattr(args, option[2:].replace("-", "_")) != default
    ]
    if tail_options:
        raise UsageError(
            "; ".join(f"{option} does not apply to --conversations" for option in tail_options)
            + " (conversations take --units, --listen-units, --speak-units, --own-turns, --seed, --no-pace, "
            "--output-format and --json)"
        )
    url = realtime_url(args.url)
    script = Script(listen=args.listen_units, speak=args.speak_units, own=args.own_turns)
    report = asyncio.run(
        run_conversations(url, args.conversations, args.units, script, paced=not args.no_pace, first_seed=args.seed)
    )
    if args.output_format == "json":
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        for line in report.lines():
            print(line)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.to_json(), handle, indent=1, sort_keys=True)
    return EXIT_PROBLEMS if report.refused or report.errors else EXIT_CLEAN


def run(args: argparse.Namespace) -> int:
    import asyncio

    if args.conversations is not None:
        return run_conversations(args)

    from duplexcadence.interpreter.serve import loadgen
    from duplexcadence.interpreter.serve.client import Refused

    url = session_url(args.url)
    try:
        ready = asyncio.run(loadgen.probe(url))
    except Refused as refusal:
        raise UsageError(f"{url}: the server refused the first session: {refusal.message}") from None
    except OSError as error:
        raise UsageError(f"{url}: cannot connect: {error}") from None
    served = loadgen.served_for(ready, args.verify_device)
    inputs = served.inputs if served is not None and served.inputs is not None else loadgen.zeros_inputs(ready)
    lockstep = ready.get("lockstep")
    if args.verify and (served is None or served.stock is None or served.inputs is None):
        raise UsageError(
            f"--verify: the server serves '{ready['tail']}', which is not a registered tail with a stock loop here"
        )
    if args.verify and lockstep is not None and served is not None and served.stock_group is None:
        raise UsageError(
            f"--verify: the server runs lockstep groups of {lockstep} and the '{ready['tail']}' tail has no batched "
            "stock loop to compare their rows with"
        )
    if not args.quiet and args.output_format == "text":
        print(loadgen.describe_ready(ready))
    report = asyncio.run(
        loadgen.run_load(
            url,
            args.sessions,
            args.ticks,
            inputs,
            paced=not args.no_pace,
            record=args.sessions if args.verify else 0,
            first_seed=args.seed,
            bundle=args.bundle,
        )
    )
    if args.verify:
        assert served is not None
        report = loadgen.verify(served, report, lockstep, ready.get("numerics"))
    if args.output_format == "json":
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        for line in report.lines():
            print(line)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report.to_json(), handle, indent=1, sort_keys=True)
    failed = report.refused or report.errors or (args.verify and report.unequal_ticks)
    return EXIT_PROBLEMS if failed else EXIT_CLEAN


def register(commands) -> None:
    parser = commands.add_parser(
        "loadgen", help="drive N concurrent sessions against a dsl serve server", description=DESCRIPTION
    )
    parser.add_argument("url", metavar="URL", help="the server (ws://127.0.0.1:8000 or its /v1/session address)")
    parser.add_argument(
        "--sessions", type=positive, default=TAIL_DEFAULTS["--sessions"], help="concurrent sessions (4)"
    )
    parser.add_argument("--ticks", type=positive, default=TAIL_DEFAULTS["--ticks"], help="ticks per session (50)")
    parser.add_argument("--seed", type=non_negative, default=0, help="the first session's seed; the others follow (0)")
    parser.add_argument(
        "--bundle",
        type=positive,
        default=TAIL_DEFAULTS["--bundle"],
        metavar="K",
        help="drive the sessions in bundles of K, a websocket each (/v1/bundle; default 1: a websocket a session)",
    )
    parser.add_argument(
        "--no-pace", action="store_true", help="send each tick when the last is answered (default: one a tick period)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare every output with stock: each session alone, or its lockstep group's batched stock",
    )
    parser.add_argument(
        "--verify-device",
        type=device_name,
        default=TAIL_DEFAULTS["--verify-device"],
        help="where stock runs for --verify (the server's device)",
    )
    add_output_format_option(parser, help="text (default) or json: the report on standard output", old_spelling=False)
    add_json_path_option(parser)
    conversations = parser.add_argument_group(
        "conversations", "against `dsl serve ENGINE --conversations` (/v1/realtime; docs/serving.md, Conversations)"
    )
    conversations.add_argument(
        "--conversations", type=positive, default=None, metavar="N", help="N scripted conversations at once"
    )
    conversations.add_argument("--units", type=positive, default=20, help="units (seconds of audio) each (20)")
    conversations.add_argument(
        "--listen-units", type=non_negative, default=1, metavar="L", help="the script: L units listening (1), then"
    )
    conversations.add_argument(
        "--speak-units",
        type=non_negative,
        default=2,
        metavar="S",
        help="S units speaking, the last ending the turn (2; 0: listening throughout)",
    )
    conversations.add_argument(
        "--own-turns", action="store_true", help="no script: the model decides every unit (a model with its weights)"
    )
    parser.set_defaults(handler=run)
