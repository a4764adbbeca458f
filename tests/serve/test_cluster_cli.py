"""`dsl serve ... --ray`: what it refuses before any Ray starts, and a local 2-CPU Ray it starts and stops
(2 CPU replicas of the toy tail, one session through the proxy, the drain at the interrupt)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

pytest.importorskip("ray.serve")

from duplexcadence.interpreter.cli import main as cli
from duplexcadence.interpreter.cli import serve, serve_ray
from duplexcadence.interpreter.serve.client import SessionClient
from duplexcadence.interpreter.serve.cluster import launch
from duplexcadence.interpreter.serve.tail import served_tail

pytestmark = pytest.mark.own_process  # starts Ray (tests/conftest.py says why)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["serve", "toy", "--replicas", "2"],
            "dsl serve: error: --replicas needs --ray (or --ray-address): a single server has one pool\n",
        ),
        (
            ["serve", "nosuch", "--ray"],
            "dsl serve: error: 'nosuch' is not a registered tail (minicpmo45, moshi, personaplex, qwen3omni, toy); "
            "to serve a .clock file, give the model builder with --model MODULE:FUNCTION\n",
        ),
        (
            ["serve", "toy", "--ray", "--slots", "2", "--lanes", "3"],
            "dsl serve: error: --lanes 3 is more than --slots 2: a lane needs a slot\n",
        ),
        (["serve", "toy", "--ray", "--replicas", "0"], "dsl serve: error: argument --replicas: must be >= 1, not 0\n"),
        (
            ["serve", "toy", "--ray-address", "auto", "--ray-cpus", "2"],
            "dsl serve: error: --ray-cpus sizes a local Ray; an existing cluster (--ray-address) has its own CPUs\n",
        ),
    ],
)
def test_what_cannot_be_served_is_a_usage_error_before_ray_starts(argv, says, dsl):
    code, out, err = dsl(*argv)
    assert (code, out) == (2, "")
    assert err.endswith(says) and "Traceback" not in err


def test_dsl_serve_ray_starts_replicas_serves_a_session_and_stops(capsys):
    args = cli.build_parser("serve").parse_args(
        ["serve", "toy", "--ray", "--ray-cpus", "2", "--device", "cpu", "--replicas", "2", "--cpus-per-replica", "0.5"]
        + ["--slots", "2", "--port", "0", "--drain-timeout", "30"]
    )
    config = serve_ray.cluster_config(args)
    assert (config.gpus_per_replica, config.replicas, config.local_cpus, config.drain_timeout_s) == (0.0, 2, 2, 30.0)
    toy, stop, served = served_tail("toy"), threading.Event(), {}

    def started(cluster) -> None:  # on the command's thread, once the replicas serve
        async def one_session():
            client = await SessionClient.connect(cluster.ws_url, seed=4)
            outputs = [await client.step(toy.inputs(4, tick)) for tick in range(3)]
            closed = await client.close()
            return client.replica, outputs, closed

        served["replica"], served["outputs"], served["closed"] = asyncio.run(asyncio.wait_for(one_session(), 60))
        served["replicas"], served["port"] = sorted(cluster.capacities()), cluster.config.port
        stop.set()

    code = serve_ray.serve_cluster(
        args, serve.pool_config(args), {}, serve.access_policy(args), started=started, stop=stop
    )
    ours = ("starting ", "serving on ", "  replica ", "stopping: ")  # Ray and Serve log on stderr too
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ours)]
    assert code == 0
    assert served["replica"] in served["replicas"] and len(served["replicas"]) == 2
    assert (len(served["outputs"]), served["closed"]["ticks"], served["closed"]["errors"]) == (3, 3, 0)
    assert err[0] == "starting 2 replica(s) of 'toy' on Ray"
    assert served["port"] >= launch.FREE_PORT_LOW
    assert err[1] == f"serving on 2 replica(s) through ws://127.0.0.1:{served['port']}/v1/session"
    assert sorted(err[2:4]) == [
        f"  replica {name} on cpu: capacity 2 sessions of 2 slots, 0 active" for name in served["replicas"]
    ]
    assert len(err) == 5 and err[-1] == "stopping: each replica admits nothing new and waits up to 30 s"


def test_a_pool_that_cannot_start_on_the_replicas_is_a_usage_error_with_its_reason(dsl):
    code, out, err = dsl(
        *["serve", "toy", "--ray", "--ray-cpus", "2", "--device", "cpu", "--replicas", "1", "--cpus-per-replica"],
        *["0.5", "--slots", "2", "--lockstep", "2", "--port", "0"],
    )
    # Ray's raylet may print its own line as Serve stops ("Task ServeController.graceful_shutdown failed...")
    assert code == 2 and all("(raylet)" in line for line in out.splitlines())
    assert err.splitlines()[-1] == (
        "dsl serve: error: the replicas did not start: ValueError: --lockstep 2: this plan cannot take a session "
        "into a running group: region(s) cache do not start as zeros, so a zeroed row is not a fresh one; members "
        "join at the group's start"
    )


def test_a_port_in_use_is_a_usage_error_that_names_it(dsl):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, out, err = dsl(
            *["serve", "toy", "--ray", "--ray-cpus", "2", "--device", "cpu", "--replicas", "1"],
            *["--cpus-per-replica", "0.5", "--slots", "2", "--port", str(port)],
        )
    assert code == 2 and all("(raylet)" in line for line in out.splitlines())
    assert err.splitlines()[-1] == (
        f"dsl serve: error: the Serve proxy cannot listen on 127.0.0.1:{port}: the port is in use (another port, "
        "or 0 for a free one)"
    )
