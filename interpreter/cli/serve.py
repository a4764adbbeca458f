"""`dsl serve TAIL_OR_CLOCK`: one tail's sessions at the cadence on one device, over websockets.

TAIL_OR_CLOCK is a registered tail (its `Tail.serve` adapter; `--param K=V` are its options) or, with
`--model MODULE:FUNCTION`, a `.clock` file bound to the model FUNCTION returns (`--param K=V` are the file's
params). The pool loads the runtime with `--slots` session slots in `--lanes` lanes (or `--slots` lockstep
groups of `--lockstep` rows), opens every slot once, calibrates its tick model, prints it, and serves on
`--host` (loopback unless given) and `--port` until interrupted. docs/serving.md has the protocol.

Torch, the pool and the web packages are imported by `run` only (`pip install "duplexcadence[serve]"`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli import serve_conversations, serve_ray
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    UsageError,
    device_name,
    non_negative,
    positive,
    positive_float,
    resolve_device,
    status,
)
from duplexcadence.interpreter.serve import messages

DESCRIPTION = "Serve one tail's sessions at the cadence on one device, over websockets (docs/serving.md)."


def headroom(text: str) -> float:
    """An argparse type: a fraction from 0 to below 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to below 1, not {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to below 1, not {value}")
    return value


def pace(text: str) -> float:
    """An argparse type: ticks a period, a finite number >= 0 (0: no pace)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of ticks a period >= 0, not {text!r}") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of ticks a period >= 0, not {value}")
    return value


def tick_model(text: str) -> tuple[float, float]:
    """An argparse type: `FIXED_MS+PER_UNIT_MS`, the numbers of a `calibrated tick` line; seconds."""
    fixed, plus, per_unit = text.partition("+")
    try:
        numbers = (float(fixed), float(per_unit)) if plus else None
    except ValueError:
        numbers = None
    if numbers is None or not all(0.0 <= value < float("inf") for value in numbers):
        raise argparse.ArgumentTypeError(
            f"must be FIXED_MS+PER_UNIT_MS, two numbers >= 0 (a calibrated tick line's, e.g. 5.9+8.4), not {text!r}"
        )
    return numbers[0] / 1000, numbers[1] / 1000


def pairs(values: list[str]) -> dict[str, str]:
    found = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {pair!r} is not KEY=VALUE")
        found[key.strip()] = value.strip()
    return found


def pool_config(args: argparse.Namespace) -> Any:
    """The `PoolConfig` the arguments ask for (a pool here, or each replica's with --ray)."""
    from duplexcadence.interpreter.serve.admission import TickModel
    from duplexcadence.interpreter.serve.pool import PoolConfig

    return PoolConfig(
        tick_model=None if args.tick_model is None else TickModel(*args.tick_model),
        slots=args.slots,
        lanes=args.lanes,
        lockstep=args.lockstep,
        headroom=args.headroom,
        idle_timeout_s=args.idle_timeout,
        queue_depth=args.queue_depth,
        gather_s=None if args.gather_ms is None else args.gather_ms / 1000,
        pace=args.pace or None,
        latency_guard=args.latency_guard,
        freeze_gc=args.freeze_gc,
    )


def make_pool(args: argparse.Namespace) -> Any:
    """The `SessionPool` the arguments ask for (not started); UsageError for what cannot be served."""
    from duplexcadence.interpreter.serve.pool import SessionPool
    from duplexcadence.interpreter.serve.tail import ServeSetupError, served_tail

    device = resolve_device(args.device)
    try:
        served = served_tail(args.target, args.model, pairs(args.param), device)
    except (ServeSetupError, tails.TailError) as error:
        raise UsageError(str(error)) from None
    try:
        return SessionPool(served, pool_config(args))
    except ValueError as error:
        raise UsageError(str(error)) from None


async def started_pool(args: argparse.Namespace) -> Any:
    """The pool the arguments ask for, started and described; UsageError for what it cannot serve."""
    from duplexcadence.interpreter.serve.server import start_problem

    pool = make_pool(args)
    try:
        await pool.start()
    except Exception as error:
        problem = start_problem(args.target, error)
        if problem is None:
            raise
        raise UsageError(problem) from None
    status(args, pool.describe())
    return pool


def access_policy(args: argparse.Namespace) -> Any:
    """The `AccessPolicy` the arguments ask for."""
    from duplexcadence.interpreter.serve.access import AccessPolicy

    return AccessPolicy.serving_on(
        args.host,
        args.api_key,
        allowed_origins=tuple(args.allowed_origin),
        trusted_hosts=tuple(args.trusted_host),
        open_routes=("/healthz", *args.open_route),
        hidden_routes=tuple(args.hide_route),
    )


def session_url(server: Any) -> str:
    """The session websocket's address of a listening uvicorn `server` (the port it took, for `--port 0`)."""
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"ws://{f'[{host}]' if ':' in host else host}:{port}/v1/session"


async def serve(args: argparse.Namespace, started: Callable[[Any], None] | None = None) -> int:
    """Start the pool, then serve until the server is told to exit (an interrupt, or `server.should_exit`).
    Once it listens, its session address is said (`serving through ws://...`) and `started(server)` is called."""
    import uvicorn  # before the pool loads: a missing serving package is said at once

    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.server import ConnectionLimits, DrainingServer, serve_pool, server_config

    def listening(server: Any) -> None:
        status(args, f"serving through {session_url(server)}")
        if started is not None:
            started(server)

    pool = await started_pool(args)
    limits = ConnectionLimits(args.header_timeout, args.max_connections, args.drain_timeout)
    app = make_app(pool, manage_pool=False, access=access_policy(args))
    config: uvicorn.Config = server_config(app, args.host, args.port, args.log_level, limits=limits)
    server = DrainingServer(config, args.drain_timeout)
    await serve_pool(pool, server, listening)
    return EXIT_CLEAN


def run(args: argparse.Namespace) -> int:
    if getattr(args, "conversations", None) is not None:  # a Namespace of the tail's options alone has none
        return serve_conversations.run(args, pairs(args.param), access_policy(args))
    if args.lanes > args.slots:
        raise UsageError(messages.lanes_over_slots(args.lanes, args.slots))
    if serve_ray.wants_ray(args):
        return serve_ray.serve_cluster(args, pool_config(args), pairs(args.param), access_policy(args))
    from duplexcadence.interpreter.serve.server import run_loop

    return run_loop(serve(args))


def register(commands) -> None:
    parser = commands.add_parser(
        "serve", help="serve a tail's sessions at the cadence over websockets", description=DESCRIPTION
    )
    registered = ", ".join(tails.available()) or "none registered"
    parser.add_argument(
        "target", metavar="TAIL_OR_CLOCK", help=f"a registered tail ({registered}), or a .clock file with --model"
    )
    parser.add_argument("--model", default=None, metavar="MODULE:FUNCTION", help="the model builder of a .clock file")
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="K=V",
        help="a tail's option (e.g. steps=5 for minicpmo45), or a .clock param with --model",
    )
    parser.add_argument("--slots", type=positive, default=1, help="session slots (lockstep: groups) (default 1)")
    parser.add_argument("--lanes", type=positive, default=1, help="sessions stepped concurrently (default 1)")
    parser.add_argument(
        "--lockstep", type=positive, default=None, metavar="ROWS", help="sessions in lockstep groups of ROWS rows"
    )
    parser.add_argument("--port", type=non_negative, default=8000)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    parser.add_argument(
        "--device", type=device_name, default=None, help="cpu, cuda or cuda:N (default: cuda when present)"
    )
    parser.add_argument(
        "--headroom", type=headroom, default=0.15, help="the fraction of the tick period admission keeps free (0.15)"
    )
    parser.add_argument(
        "--idle-timeout", type=positive_float, default=30.0, metavar="SECONDS", help="close a silent session (30)"
    )
    parser.add_argument("--queue-depth", type=positive, default=4, help="ticks a session may have queued (4)")
    parser.add_argument(
        "--gather-ms",
        type=float,
        default=None,
        metavar="MS",
        help="how long a round may wait for the other sessions' ticks (default: 5%% of the tick period; 0: none)",
    )
    parser.add_argument(
        "--pace",
        type=pace,
        default=2.0,
        metavar="TICKS",
        help="a session's ticks are stepped at most TICKS a tick period on average, after a burst of "
        "--queue-depth (default 2; 0: no limit)",
    )
    parser.add_argument(
        "--tick-model",
        type=tick_model,
        default=None,
        metavar="FIXED_MS+PER_UNIT_MS",
        help="admission's tick model instead of a calibration at start-up, e.g. 5.9+8.4 (a calibrated tick line's)",
    )
    parser.add_argument(
        "--no-latency-guard",
        dest="latency_guard",
        action="store_false",
        help="admit on the tick model alone, also while the ticks answered run over the budget",
    )
    parser.add_argument(
        "--no-freeze-gc",
        dest="freeze_gc",
        action="store_false",
        help="leave what the pool loaded in the garbage collector's walk (by default it is frozen once started)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="every route but /healthz needs 'Authorization: Bearer KEY' (default: DUPLEXCADENCE_API_KEY, if set)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page's origin allowed besides the server's own (repeat; *: any); other browsers are refused",
    )
    parser.add_argument(
        "--trusted-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a Host header the server answers (repeat; *: any; default: the loopback names on a loopback address)",
    )
    parser.add_argument(
        "--open-route",
        action="append",
        default=[],
        metavar="PATH",
        help="a route served without the API key, besides /healthz (repeat; e.g. /metrics for a scraper)",
    )
    parser.add_argument(
        "--hide-route",
        action="append",
        default=[],
        metavar="PATH",
        help="a route answered 404 to everyone (repeat; e.g. /v1/sessions, its sessions' ids and seeds)",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="cut a connection whose request headers have not all arrived in SECONDS (10)",
    )
    parser.add_argument(
        "--max-connections",
        type=positive,
        default=1024,
        metavar="N",
        help="connections served at once, 503 past them; at most the open-file limit less 64 (1024)",
    )
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    serve_conversations.add_options(parser)
    serve_ray.add_ray_options(parser)
    parser.set_defaults(handler=run)
