"""Moshi's Mimi decoder (released size, seeded weights) on a local Ray cluster (2 CPUs): 2 replicas of one
slot each behind the Serve proxy; two sessions of 3 frames land one per replica, and every frame is
`torch.equal` to moshi's own streaming decode of that session alone.

On the CPU the replicas run torch with one intra-op thread (`PoolSpec.cpu_threads`), and stock runs with one
too: Mimi's kernels sum in another order with another thread count, so the bits are compared at equal counts
(as on a GPU they are compared at equal batch sizes)."""

from __future__ import annotations

import asyncio

import pytest
import torch

pytest.importorskip("ray.serve")
pytest.importorskip("moshi")

from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, start
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec
from duplexcadence.interpreter.serve.loadgen import run_load, verify
from duplexcadence.interpreter.serve.pool import PoolConfig
from duplexcadence.interpreter.serve.tail import served_tail

pytestmark = [pytest.mark.models, pytest.mark.own_process]  # own_process: starts Ray (tests/conftest.py)

FRAMES = 3
# One slot per replica, no calibration (a given tick model), no warm-up: a CPU replica starts in seconds. A Mimi
# frame on the CPU takes longer than the period, so admission goes by the model alone (no latency guard).
POOL = PoolConfig(
    slots=1, lanes=1, tick_model=TickModel(0.0, 0.001), warm_slots=False, idle_timeout_s=300, latency_guard=False
)


@pytest.fixture(scope="module")
def cluster():
    config = ClusterConfig(replicas=2, cpus_per_replica=0.5, local_cpus=2, port=0)
    running = start(PoolSpec("moshi", config=POOL, cpu_threads=1), config)
    try:
        yield running
    finally:
        running.shutdown()


def test_mimi_sessions_one_per_replica_equal_moshi_alone(cluster):
    served = served_tail("moshi")
    report = asyncio.run(
        asyncio.wait_for(run_load(cluster.ws_url, 2, FRAMES, served.inputs, paced=False, record=2, first_seed=3), 120)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = verify(served, report)
    finally:
        torch.set_num_threads(threads)
    refusals = [load.refused for load in report.per_session]
    assert (report.opened, report.errors, report.ticks) == (2, {}, 2 * FRAMES), refusals
    assert sorted(load.replica or "" for load in report.per_session) == sorted(cluster.capacities())
    assert (report.verified_ticks, report.unequal_ticks) == (2 * FRAMES, 0)
