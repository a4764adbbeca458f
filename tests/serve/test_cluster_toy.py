"""The toy tail on a local Ray cluster (2 CPUs): 2 replicas behind the Serve proxy, each owning a pool of 3 slots.

Every session's outputs equal that session run alone on stock; a burst is spread by free capacity and a session
too many is refused with the pool's text; a new session goes where most capacity is free; a replica killed
mid-run fails only its own sessions (`ReplicaLost` naming it, close code 1014), the others finish equal to
stock; a drained replica admits nothing (new sessions go to the other) while its session finishes; the
cluster's shutdown drains every replica, then closes a session still open with 1001 and the reason.

Ray starts once for the module (a minute at most on 2 busy cores) and stops at its end; every test is
bounded by `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest
import torch

pytest.importorskip("ray.serve")

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.client import Refused, ReplicaLost, SessionClient, SessionClosedByServer
from duplexcadence.interpreter.serve.cluster import launch
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, ClusterStartError, DuplexCluster, start
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec
from duplexcadence.interpreter.serve.loadgen import SessionLoad, compare_with_stock, run_load, verify
from duplexcadence.interpreter.serve.pool import PoolConfig
from duplexcadence.interpreter.serve.tail import served_tail

pytestmark = pytest.mark.own_process  # starts Ray (tests/conftest.py says why)

TOY = served_tail("toy")
SLOTS = 3
# A given tick model (no calibration: capacity is the slots on any machine) and a period long enough that a
# paced session outlives a kill.
POOL = PoolConfig(slots=SLOTS, lanes=1, tick_model=TickModel(0.0, 0.001), tick_period_s=0.2, idle_timeout_s=300)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Stock runs with the replicas' one intra-op thread (`PoolSpec.cpu_threads`): CPU kernels sum in another
    order with another thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cluster():
    config = ClusterConfig(replicas=2, cpus_per_replica=0.5, local_cpus=2, port=0, stats_period_s=0.2)
    running = start(PoolSpec("toy", config=POOL, cpu_threads=1), config)
    try:
        yield running
    finally:
        running.shutdown()


def run(coroutine, timeout: float = 120):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=timeout))


def equal_to_stock(load: SessionLoad) -> bool:
    compared, unequal = compare_with_stock(TOY, load)
    return compared == len(load.outputs) > 0 and unequal == 0


def wait_until_idle(cluster: DuplexCluster) -> dict:
    """Every replica with no session, and one routing-stats period for the routers to hear it."""
    deadline = time.monotonic() + 30
    while True:
        found = cluster.capacities()
        if all(stats["sessions"] == 0 for stats in found.values()) or time.monotonic() > deadline:
            time.sleep(3 * cluster.config.stats_period_s)
            return found
        time.sleep(0.05)


def test_with_serve_running_port_0_gives_its_port_and_another_port_is_refused(cluster):
    """A second start on a cluster whose Serve runs keeps that Serve's proxies (Serve ignores new HTTP options)."""
    running = cluster.config.port
    assert launch.running_proxy_port() == running
    assert launch.start_proxy(ClusterConfig(port=0)).port == running
    with pytest.raises(ClusterStartError) as refused:
        launch.start_proxy(ClusterConfig(port=running + 1))
    assert str(refused.value) == (
        f"Serve already runs on this Ray cluster with its proxies on port {running}, not {running + 1}: give port "
        f"{running} (or 0), or stop that Serve first (serve shutdown)"
    )


def test_sessions_through_the_proxy_equal_each_session_alone_on_stock_and_a_burst_is_spread(cluster):
    report = run(run_load(cluster.ws_url, SLOTS * 2 + 1, 6, TOY.inputs, paced=False, record=SLOTS * 2 + 1))
    report = verify(TOY, report)
    opened = [load for load in report.per_session if load.refused is None]
    refused = [load for load in report.per_session if load.refused is not None]
    assert collections.Counter(load.replica for load in opened).most_common() == [
        (name, SLOTS) for name in sorted({load.replica for load in opened})
    ]
    assert len(refused) == 1 and refused[0].refused == (
        f"at-capacity: at capacity: {SLOTS} of {SLOTS} sessions, predicted tick 4.0 ms of 200 ms (headroom 15%); "
        f"all {SLOTS} session slots are taken"
    )
    assert (report.errors, report.ticks) == ({}, 6 * len(opened))
    assert (report.verified_ticks, report.unequal_ticks) == (6 * len(opened), 0)


def test_a_new_session_goes_to_the_replica_with_the_most_free_capacity(cluster):
    wait_until_idle(cluster)

    async def scenario():
        first = [await SessionClient.connect(cluster.ws_url, seed=seed) for seed in range(4)]
        spread = collections.Counter(client.replica for client in first)
        emptied = first[0].replica
        for client in first:
            if client.replica == emptied:
                await client.close()
        await asyncio.to_thread(wait_for_sessions, cluster, emptied, 0)
        later = [await SessionClient.connect(cluster.ws_url, seed=seed) for seed in range(4, 6)]
        for client in [client for client in first if client.replica != emptied] + later:
            await client.close()
        return spread, emptied, [client.replica for client in later]

    spread, emptied, placed = run(scenario())
    assert sorted(spread.values()) == [2, 2]
    assert placed == [emptied, emptied]  # 3 free there, 1 on the other


def wait_for_sessions(cluster: DuplexCluster, replica: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while cluster.capacity(replica)["sessions"] != count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3 * cluster.config.stats_period_s)  # the routers hear of it


def test_a_killed_replica_fails_only_its_own_sessions(cluster):
    wait_until_idle(cluster)

    async def scenario():
        direct = await SessionClient.connect(cluster.ws_url, seed=50)
        load = asyncio.create_task(run_load(cluster.ws_url, 4, 25, TOY.inputs, paced=True, record=4, first_seed=51))
        while (await asyncio.to_thread(cluster.capacities)).get(direct.replica, {}).get("sessions", 0) < 3:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # a few ticks into the run
        await asyncio.to_thread(cluster.kill, direct.replica)
        with pytest.raises(ReplicaLost) as lost:
            while True:
                await direct.step(TOY.inputs(50, 0))
        return direct.replica, lost.value, await load

    victim, lost, report = run(scenario())
    assert (lost.replica, lost.code, lost.close_code) == (victim, messages.REPLICA_LOST, 1014)
    assert str(lost) == f"replica-lost: replica {victim} stopped; this session's state was on it and is lost"
    on_victim = [load for load in report.per_session if load.replica == victim]
    survivors = [load for load in report.per_session if load.replica != victim]
    assert on_victim and survivors
    for load in on_victim:
        assert load.errors == (messages.REPLICA_LOST,) and 0 < load.ticks < 25
        assert equal_to_stock(load)  # what it received before the loss is stock's
    for load in survivors:
        assert (load.errors, load.ticks) == ((), 25)
        assert equal_to_stock(load)


def test_a_drained_replica_admits_nothing_while_its_session_finishes(cluster):
    cluster.wait_serving(2, timeout_s=120)  # the killed replica's replacement
    wait_until_idle(cluster)

    async def scenario():
        first = [await SessionClient.connect(cluster.ws_url, seed=seed) for seed in (60, 61)]
        drained = first[0].replica
        stats = await asyncio.to_thread(cluster.drain, drained)
        later = [await SessionClient.connect(cluster.ws_url, seed=seed) for seed in (62, 63)]
        outputs = [await first[0].step(TOY.inputs(60, tick)) for tick in range(5)]
        closed = await first[0].close()
        after = await asyncio.to_thread(cluster.capacity, drained)
        for client in first[1:] + later:
            await client.close()
        return drained, stats, [client.replica for client in later], outputs, closed, after

    drained, stats, placed, outputs, closed, after = run(scenario())
    assert (stats["draining"], stats["free"], stats["sessions"]) == (True, 0, 1)
    assert drained not in placed and len(set(placed)) == 1
    assert equal_to_stock(SessionLoad(60, 5, (), (), 0, None, tuple(outputs)))
    assert (closed["ticks"], closed["errors"]) == (5, 0)
    assert (after["draining"], after["sessions"]) == (True, 0)


def test_shutdown_drains_then_closes_a_session_left_with_1001(cluster):
    async def scenario():
        client = await SessionClient.connect(cluster.ws_url, seed=80)
        await client.step(TOY.inputs(80, 0))
        stopping = asyncio.create_task(asyncio.to_thread(cluster.shutdown, 2.0))
        await asyncio.sleep(0.5)
        with pytest.raises(Refused) as refused:  # every replica drains first
            await SessionClient.connect(cluster.ws_url, seed=81)
        ticks = 1
        with pytest.raises(SessionClosedByServer) as closed:
            while True:
                await client.step(TOY.inputs(80, ticks))
                ticks += 1
                await asyncio.sleep(0.05)
        await stopping
        return refused.value, closed.value, ticks

    refused, closed, ticks = run(scenario())
    assert (refused.code, refused.close_code) == (messages.DRAINING, messages.CLOSE_TRY_AGAIN_LATER)
    assert refused.message.startswith("draining: this pool admits no new session while its ")
    assert ticks > 5  # the session kept its ticks while the cluster drained
    assert type(closed) is SessionClosedByServer and closed.close_code == messages.CLOSE_GOING_AWAY
    assert closed.message == messages.shutting_down()
