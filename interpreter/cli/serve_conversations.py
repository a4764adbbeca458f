"""`dsl serve ENGINE --conversations N`: whole conversations of a conversation engine on one device, over
`/v1/realtime` (JSON events after OpenAI's Realtime API) with the page at `/` (docs/serving.md, "Conversations").

ENGINE is a registered conversation engine (`minicpmo45`; `--param K=V` are its keywords, e.g. `sizes=reduced`)
or `MODULE:FUNCTION`, a function of yours that returns a `ConversationEngine` (called with `device=`,
`conversations=` and the `--param` keywords). Torch, the engine and the web packages are imported by `run` only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from duplexcadence.interpreter.cli import serve_ray
from duplexcadence.interpreter.cli.common import EXIT_CLEAN, UsageError, positive, resolve_device, status


def counts(text: str) -> list[int]:
    """An argparse type: conversation counts, comma-separated (1,2,4)."""
    try:
        found = [int(part) for part in text.split(",")]
    except ValueError:
        found = []
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"must be conversation counts from 1, comma-separated (1,2,4), not {text!r}")
    return found


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "conversations", "whole conversations of a conversation engine over /v1/realtime (docs/serving.md)"
    )
    group.add_argument(
        "--conversations",
        type=positive,
        default=None,
        metavar="N",
        help="serve N conversations at most of the conversation engine TARGET (its name, or MODULE:FUNCTION), "
        "with the page at /",
    )
    group.add_argument(
        "--calibrate",
        type=counts,
        default=[],
        metavar="COUNTS",
        help="time the engine's round at these conversation counts at start-up (e.g. 1,2,4): admission then keeps "
        "the predicted round under the cadence less the headroom (default: none, admission by the slots)",
    )


def where(url: str) -> str:
    return f"serving on {url}/ (the page) and {url.replace('http', 'ws', 1)}/v1/realtime"


async def serve(
    args: argparse.Namespace, params: dict[str, str], access: Any, started: Callable[[Any], None] | None = None
) -> int:
    """Build the engine and its pool, then serve until the server is told to exit; `access`: the
    `AccessPolicy` of `dsl serve`'s options. `started(server)` is called once it listens."""
    import uvicorn  # before the engine loads: a missing serving package is said at once

    from duplexcadence.interpreter.serve.conversations import (
        ConversationPool,
        EngineSetupError,
        engine_factory,
        engine_name,
    )
    from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
    from duplexcadence.interpreter.serve.server import ConnectionLimits, DrainingServer, serve_pool, server_config

    device = resolve_device(args.device)
    try:
        build = engine_factory(args.target, device, args.conversations, params)
    except EngineSetupError as error:
        raise UsageError(str(error)) from None
    pool = ConversationPool(build, engine_name(args.target), pool_config(args))
    try:
        await pool.start()
    except (LookupError, ValueError, TypeError) as error:  # an unknown engine, an option it does not take
        raise UsageError(f"cannot build the conversation engine '{args.target}': {error}") from None
    limits = ConnectionLimits(args.header_timeout, args.max_connections, args.drain_timeout)
    app = make_conversation_app(pool, manage_pool=False, access=access)
    config: uvicorn.Config = server_config(app, args.host, args.port, args.log_level, limits=limits)
    server = DrainingServer(config, args.drain_timeout)

    def listening(running: Any) -> None:
        port = running.servers[0].sockets[0].getsockname()[1]
        status(args, pool.describe())
        status(args, where(f"http://{args.host}:{port}"))
        if started is not None:
            started(running)

    await serve_pool(pool, server, listening)
    return EXIT_CLEAN


def problems(args: argparse.Namespace) -> list[str]:
    """The `dsl serve` options that do not apply to conversations."""
    found = []
    for option, value, default in (
        ("--slots", args.slots, 1),
        ("--lanes", args.lanes, 1),
        ("--lockstep", args.lockstep, None),
        ("--model", args.model, None),
        ("--tick-model", args.tick_model, None),
    ):
        if value != default:
            found.append(f"{option} does not apply to --conversations")
    return found


def pool_config(args: argparse.Namespace) -> Any:
    from duplexcadence.interpreter.serve.conversations import ConversationPoolConfig

    return ConversationPoolConfig(
        queue_depth=args.queue_depth,
        idle_timeout_s=args.idle_timeout,
        gather_s=None if args.gather_ms is None else args.gather_ms / 1000,
        headroom=args.headroom,
        latency_guard=args.latency_guard,
        calibration=tuple(args.calibrate),
        freeze_gc=args.freeze_gc,
        pace=args.pace or None,
    )


def run(args: argparse.Namespace, params: dict[str, str], access: Any) -> int:
    found = problems(args)
    if found:
        raise UsageError("; ".join(found))
    if serve_ray.wants_ray(args):
        return serve_ray.serve_cluster(args, pool_config(args), params, access)
    from duplexcadence.interpreter.serve.server import run_loop

    return run_loop(serve(args, params, access))
