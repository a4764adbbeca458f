"""`dsl serve TAIL_OR_CLOCK`: one tail's sessions at the cadence on one device, over websockets.

TAIL_OR_CLOCK is a registered tail (its `Tail.serve` adapter; `--param K=V` are its options) or, with
`--model MODULE:FUNCTION`, a `.clock` file bound to the model FUNCTION returns (`--param K=V` are the file's
params). The pool loads the runtime with `--slots` session slots in `--lanes` lanes (or `--slots` lockstep
groups of `--lockstep` rows), opens every slot once, calibrates its tick model, prints it, and serves on
`--host` (loopback unless given) and `--port` until interrupted. docs/serving.md has the protocol.
`--workers N` runs N such servers as processes on the one port, the slots and lanes split evenly over them
(`interpreter/serve/workers.py`); `--fronts N` keeps the one pool in this process and serves its websockets
from N front processes on the one port (`interpreter/serve/fronts.py`).

Torch, the pool and the web packages are imported by `run` only (`pip install "duplexcadence[serve]"`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import attrs

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli import serve_ray
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    UsageError,
    device_name,
    non_negative,
    positive,
    positive_float,
    resolve_device,
    status,
)
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.workers import split_problems

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


def lanes(args: argparse.Namespace) -> int:
    """`--lanes`, by default one for each worker."""
    return args.lanes if args.lanes is not None else args.workers


def pool_config(args: argparse.Namespace) -> Any:
    """The `PoolConfig` the arguments ask for (a pool here, or each replica's with --ray)."""
    from duplexcadence.interpreter.serve.admission import TickModel
    from duplexcadence.interpreter.serve.pool import PoolConfig

    return PoolConfig(
        tick_model=None if args.tick_model is None else TickModel(*args.tick_model),
        slots=args.slots,
        lanes=lanes(args),
        lockstep=args.lockstep,
        headroom=args.headroom,
        idle_timeout_s=args.idle_timeout,
        queue_depth=args.queue_depth,
        gather_s=None if args.gather_ms is None else args.gather_ms / 1000,
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


def session_url(server: Any) -> str:
    """The session websocket's address of a listening uvicorn `server` (the port it took, for `--port 0`)."""
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"ws://{f'[{host}]' if ':' in host else host}:{port}/v1/session"


async def serve(args: argparse.Namespace, started: Callable[[Any], None] | None = None) -> int:
    """Start the pool, then serve until the server is told to exit (an interrupt, or `server.should_exit`).
    Once it listens, its session address is said (`serving through ws://...`) and `started(server)` is called."""
    import uvicorn

    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.server import serve_pool, server_config

    def listening(server: Any) -> None:
        status(args, f"serving through {session_url(server)}")
        if started is not None:
            started(server)

    pool = await started_pool(args)
    server = uvicorn.Server(server_config(make_app(pool, manage_pool=False), args.host, args.port, args.log_level))
    await serve_pool(pool, server, listening)
    return EXIT_CLEAN


def serve_workers(
    args: argparse.Namespace, started: Callable[[Any], None] | None = None, stop: threading.Event | None = None
) -> int:
    """`--workers N`: N server processes on the one port until interrupted; 1 when a worker exits unasked or
    fails to start (said on stderr, `-q` or not)."""
    from duplexcadence.interpreter.serve import workers

    params = pairs(args.param)
    config = pool_config(args)
    spec = workers.ServeSpec(
        target=args.target,
        pool=config,
        workers=args.workers,
        model=args.model,
        params=tuple(params.items()),
        device=resolve_device(args.device),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
    )
    problems = spec.problems()
    if problems:
        raise UsageError("; ".join(problems))
    spec = attrs.evolve(spec, target=serve_ray.checked_target(args, config, params))
    try:
        return workers.serve_workers(spec, lambda line: status(args, line), started, stop)
    except workers.WorkersFailed as failure:
        if failure.usage:
            raise UsageError(failure.message) from None
        print(messages.serve_error(failure.message), file=sys.stderr)
        return EXIT_PROBLEMS


async def serve_fronts(
    args: argparse.Namespace, started: Callable[[Any], None] | None = None, stop: asyncio.Event | None = None
) -> int:
    """`--fronts N`: the pool in this process behind N front processes on the one port, until SIGINT, SIGTERM
    or SIGHUP (or `stop` is set); 1 when a front exits unasked or fails to start (said on stderr).
    `started(group)` is called once every front listens."""
    from duplexcadence.interpreter.serve import fronts, workers

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    if threading.current_thread() is threading.main_thread():
        for number in workers.STOP_SIGNALS:
            loop.add_signal_handler(number, stop.set)
            handled.append(number)
    pool = None
    group = None
    try:
        status(args, messages.fronts_split(args.fronts, os.getpid()))
        pool = await started_pool(args)
        group = fronts.FrontGroup(pool, args.fronts, args.host, args.port, args.log_level)
        try:
            await group.start()
        except workers.WorkersFailed as failure:
            if failure.usage:
                raise UsageError(failure.message) from None
            print(messages.serve_error(failure.message), file=sys.stderr)
            return EXIT_PROBLEMS
        for index, pid in enumerate(group.pids):
            status(args, messages.front_ready(index, pid))
        status(args, messages.serving_on_fronts(args.fronts, group.ws_url))
        if started is not None:
            started(group)
        problem = await group.wait(stop)
        if problem is not None:
            print(messages.serve_error(problem), file=sys.stderr)
            return EXIT_PROBLEMS
        status(args, messages.fronts_stopping(args.fronts))
        return EXIT_CLEAN
    finally:
        if pool is not None:
            await pool.stop()
        if group is not None:
            await group.stop()
        for number in handled:
            loop.remove_signal_handler(number)


def run(args: argparse.Namespace) -> int:
    if args.fronts > 1:
        if args.workers > 1:
            raise UsageError(messages.fronts_with("--workers"))
        if serve_ray.wants_ray(args):
            raise UsageError(messages.fronts_with("--ray"))
    if args.workers > 1:
        if args.ray or args.ray_address:
            raise UsageError(messages.workers_with_ray())
        problems = split_problems(args.slots, lanes(args), args.workers)
        if problems:
            raise UsageError("; ".join(problems))
    if lanes(args) > args.slots:
        raise UsageError(messages.lanes_over_slots(lanes(args), args.slots))
    if args.workers > 1:
        return serve_workers(args)
    if args.fronts > 1:
        from duplexcadence.interpreter.serve.server import run_loop

        return run_loop(serve_fronts(args))
    if serve_ray.wants_ray(args):
        return serve_ray.serve_cluster(args, pool_config(args), pairs(args.param))
    return asyncio.run(serve(args))


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
    parser.add_argument(
        "--lanes",
        type=positive,
        default=None,
        help="sessions stepped concurrently (default 1; with --workers, 1 a worker)",
    )
    parser.add_argument(
        "--workers",
        type=positive,
        default=1,
        metavar="N",
        help="server processes on the one host and port, each with its own pool of 1/N of --slots and --lanes "
        "on the same device (default 1)",
    )
    parser.add_argument(
        "--fronts",
        type=positive,
        default=1,
        metavar="N",
        help="websocket front processes on the one host and port over the one pool in this process (default 1: "
        "the front in this process)",
    )
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
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    serve_ray.add_ray_options(parser)
    parser.set_defaults(handler=run)
