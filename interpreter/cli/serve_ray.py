"""`dsl serve TAIL_OR_CLOCK --ray`: the same pool on every GPU of a Ray cluster, behind one Serve proxy.

`--ray` starts a local Ray (every core and GPU of this machine) and `--ray-address ADDR` connects to an
existing cluster (`auto`, `HOST:PORT`); either way Ray Serve runs `--replicas` replicas (default: one per GPU
of the cluster, or one on CPUs), each owning the pool the `dsl serve` options describe on its own GPU, and
its HTTP proxy listens on `--host:--port` with the routes of `dsl serve` (one websocket per session). A new
session goes to the replica with the most free predicted capacity and stays there. An interrupt (or SIGTERM)
stops Serve: each replica admits nothing new and waits up to `--drain-timeout` seconds for its sessions.
docs/serving.md, "Across GPUs and nodes" has the details.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    UsageError,
    missing_package,
    positive,
    positive_float,
    status,
)


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("across GPUs and nodes (Ray Serve; docs/serving.md)")
    group.add_argument("--ray", action="store_true", help="serve through Ray Serve on a local Ray (every GPU here)")
    group.add_argument(
        "--ray-address", default=None, metavar="ADDR", help="an existing Ray cluster (auto, HOST:PORT); implies --ray"
    )
    group.add_argument(
        "--ray-cpus", type=positive, default=None, metavar="N", help="CPUs of the local Ray (default: every core)"
    )
    group.add_argument(
        "--replicas", type=positive, default=None, help="replicas, each with its own pool (default: one per GPU)"
    )
    group.add_argument(
        "--cpus-per-replica",
        type=positive_float,
        default=1.0,
        metavar="CPUS",
        help="CPUs a replica reserves (default 1)",
    )
    group.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="at shutdown (SIGTERM, SIGINT), how long the server answers its queued ticks before it closes its "
        "sessions; with --ray, how long a replica waits for its sessions (600)",
    )
    group.add_argument(
        "--stats-period",
        type=positive_float,
        default=0.25,
        metavar="SECONDS",
        help="how often each replica's free capacity reaches the router (0.25)",
    )


def wants_ray(args: argparse.Namespace) -> bool:
    if args.replicas is not None and not (args.ray or args.ray_address):
        raise UsageError("--replicas needs --ray (or --ray-address): a single server has one pool")
    if args.ray_cpus is not None and args.ray_address is not None:
        raise UsageError("--ray-cpus sizes a local Ray; an existing cluster (--ray-address) has its own CPUs")
    return bool(args.ray or args.ray_address)


def pool_spec(args: argparse.Namespace, pool: Any, params: dict[str, str], access: Any) -> Any:
    """The `PoolSpec` of the arguments, `pool` (a `PoolConfig`), the tail's `params` and `access` (the
    `AccessPolicy` every replica applies), checked here before any replica starts."""
    from duplexcadence.interpreter.serve.cluster.replica import PoolSpec

    conversations = getattr(args, "conversations", None)
    if conversations is not None:
        target = checked_engine(args, pool, params)
        return PoolSpec(target, None, params, pool, conversations=conversations, access=access)
    target = checked_target(args, pool, params)
    return PoolSpec(target, args.model, params, pool, cpu_threads=None, access=access)


def checked_engine(args: argparse.Namespace, pool: Any, params: dict[str, str]) -> str:
    """The conversation engine to serve in the replicas, its builder found here first (not called) and `pool` (a
    `ConversationPoolConfig`) checked; UsageError for what cannot be served."""
    from duplexcadence.interpreter.serve.conversations import EngineSetupError, engine_factory

    try:
        engine_factory(args.target, "cpu", args.conversations, params)
    except EngineSetupError as error:
        raise UsageError(str(error)) from None
    problems = pool.problems()
    if problems:
        raise UsageError("; ".join(problems))
    return args.target


def checked_target(args: argparse.Namespace, pool: Any, params: dict[str, str]) -> str:
    """The tail or `.clock` file (its absolute path) to serve in other processes, with `pool` (a `PoolConfig`)
    and `params` checked here first, without loading the model; UsageError for what cannot be served."""
    from duplexcadence.interpreter.serve.tail import ServeSetupError, import_function, served_tail

    try:
        if args.model is None:  # the adapter only: the replicas load the model
            served_tail(args.target, None, params, "cpu")
            target = args.target
        else:
            if not Path(args.target).is_file():
                served_tail(args.target, args.model, params, "cpu")  # says what is wrong
            import_function(args.model)
            target = str(Path(args.target).resolve())
    except (ServeSetupError, tails.TailError, ValueError) as error:  # ValueError: a tail option out of range
        raise UsageError(str(error)) from None
    problems = pool.problems()
    if problems:
        raise UsageError("; ".join(problems))
    return target


def cluster_config(args: argparse.Namespace) -> Any:
    from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig

    cpu = args.device == "cpu"
    return ClusterConfig(
        replicas=args.replicas,
        address=args.ray_address,
        host=args.host,
        port=args.port,
        gpus_per_replica=0.0 if cpu else None,
        cpus_per_replica=args.cpus_per_replica,
        local_cpus=args.ray_cpus,
        stats_period_s=args.stats_period,
        drain_timeout_s=args.drain_timeout,
        # a model builder (or conversation engine) of your own is imported by the replicas from this folder
        runtime_env={"working_dir": os.getcwd()} if args.model is not None or ":" in args.target else None,
    )


def describe(cluster: Any) -> list[str]:
    capacities = cluster.capacities()
    lines = [f"serving on {len(capacities)} replica(s) through {cluster.ws_url}"]
    for replica, stats in sorted(capacities.items()):
        unit = "conversations" if "engine" in stats else "sessions"  # a conversation pool's has its engine's
        held = f"capacity {stats['capacity']} {unit} of {stats['slots']} slots, {stats['sessions']} active"
        lines.append(f"  replica {replica} on {stats['device']}: {held}")
    return lines


def serve_cluster(
    args: argparse.Namespace,
    pool: Any,
    params: dict[str, str],
    access: Any,
    started: Callable[[Any], None] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Start the replicas, each with a pool of `pool` (a `PoolConfig`) over the tail with `params` behind
    `access` (an `AccessPolicy`), then serve until interrupted (or `stop` is set); `started(cluster)` once they
    serve."""
    try:
        from duplexcadence.interpreter.serve.cluster.launch import ClusterStartError, start
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] == "duplexcadence":
            raise
        raise missing_package(error, extra="ray", what="dsl serve --ray") from None
    spec, config = pool_spec(args, pool, params, access), cluster_config(args)
    status(args, f"starting {config.replicas or 'one per GPU'} replica(s) of '{args.target}' on Ray")
    try:
        cluster = start(spec, config)
    except (ValueError, ClusterStartError) as error:
        raise UsageError(str(error)) from None
    stop = stop or threading.Event()
    previous = (
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        for line in describe(cluster):
            status(args, line)
        if started is not None:
            started(cluster)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        status(args, f"stopping: each replica admits nothing new and waits up to {config.drain_timeout_s:g} s")
        cluster.shutdown()
    return EXIT_CLEAN
