"""Placement over the workers of one port: the rule (`better_worker`) on loads given as data, the board in
shared memory across a spawned process, a simulated burst of lockstep sessions hashed at random to workers
that ends in the fewest groups spread evenly, and a toy pool seated on a board: it publishes its load and
leaves a session to a worker that takes it at a lower cost, with the exact refusal and its metric."""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import random
from collections.abc import AsyncIterator

import pytest

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import (
    AdmissionRefused,
    AdmissionRule,
    TickModel,
    shared_device_capacity,
)
from duplexcadence.interpreter.serve.placement import PlacementBoard, WorkerLoad, better_worker
from duplexcadence.interpreter.serve.pool import PUBLISH_EVERY_S, PoolConfig, SessionPool
from duplexcadence.interpreter.serve.tail import served_tail

W = WorkerLoad


@contextlib.asynccontextmanager
async def seated_pool(served, model: TickModel, seat) -> AsyncIterator[SessionPool]:
    """A started pool of 3 slots in 1 lane on `seat`, stopped at the end whatever happened."""
    pool = SessionPool(served, PoolConfig(slots=3, lanes=1, tick_model=model), seat)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.stop()


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        # lockstep: a free row in a running group beats starting a group
        ([W(True, 1, 31), W(True, 0, 0)], [None, 0]),
        # every worker would start a group: the one stepping the fewest takes it
        ([W(True, 2, 0), W(True, 1, 0), W(True, 2, 0)], [1, None, 1]),
        # equal costs: any of them admits
        ([W(True, 1, 0), W(True, 1, 0)], [None, None]),
        ([W(True, 2, 3), W(True, 5, 1)], [None, 0]),
        # a worker that admits nothing (full, draining, not started) is not a place (its own pool refuses
        # before it asks the board)
        ([W(True, 3, 0), W(False, 0, 0)], [None, None]),
        ([W(False, 0, 0), W(False, 0, 0)], [None, None]),
        # lanes: every session is a unit; the least loaded, the lowest index among equals
        ([W(True, 5), W(True, 2), W(True, 2)], [1, None, None]),
        ([W(True, 97), W(True, 95)], [1, None]),
    ],
)
def test_the_worker_that_takes_a_session_at_a_lower_cost(loads, expected):
    assert [better_worker(here, loads) for here in range(len(loads))] == expected


def publish_from_a_child(board: PlacementBoard) -> None:
    board.seat(1).publish(WorkerLoad(True, 7, 5))


@pytest.mark.slow
def test_a_load_published_in_another_process_is_read_from_the_board():
    context = multiprocessing.get_context("spawn")
    board = PlacementBoard(2, context)
    assert board.loads() == [W(False, 0, 0), W(False, 0, 0)]  # not published yet: admits nothing
    board.seat(0).publish(W(True, 2, 0))
    child = context.Process(target=publish_from_a_child, args=(board,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert board.loads() == [W(True, 2, 0), W(True, 7, 5)]
    assert board.seat(0).better_worker(W(True, 2, 0)) == 1  # a free row there
    assert board.seat(1).better_worker(W(True, 7, 5)) is None


@pytest.mark.parametrize(("sessions", "groups"), [(512, [4, 4, 4, 4]), (448, [4, 4, 3, 3]), (100, [1, 1, 1, 1])])
def test_a_burst_hashed_at_random_fills_the_fewest_groups_spread_evenly(sessions, groups):
    """Each connection reaches a random worker of 4; a worker admits when no other takes the session at a
    lower cost, else the client connects again. Groups of 32 rows; each worker has 8."""
    rows, workers, draw = 32, 4, random.Random(5)
    held = [0] * workers

    def load(count: int) -> WorkerLoad:
        running = math.ceil(count / rows)
        return WorkerLoad(count < 8 * rows, running, running * rows - count)

    connections = 0
    for _ in range(sessions):
        while True:
            connections += 1
            here = draw.randrange(workers)
            if better_worker(here, [load(count) for count in held]) is None:
                held[here] += 1
                break
    assert sorted((math.ceil(count / rows) for count in held), reverse=True) == groups
    assert sum(math.ceil(count / rows) for count in held) == math.ceil(sessions / rows)
    assert connections < 8 * sessions


def test_a_pool_on_a_board_publishes_its_load_and_leaves_a_session_to_a_cheaper_worker():
    board = PlacementBoard(2, multiprocessing.get_context("spawn"))
    toy = served_tail("toy")

    async def scenario():
        async with seated_pool(toy, TickModel(0.001, 0.001), board.seat(1)) as pool:
            published = [board.loads()[1]]
            board.seat(0).publish(W(True, 0))
            first = await pool.open(seed=1)  # equal costs: taken here
            published.append(board.loads()[1])
            with pytest.raises(AdmissionRefused) as refused:
                await pool.open(seed=2)  # worker 0 steps 0 sessions, this one 1
            board.seat(0).publish(W(False, 3))
            second = await pool.open(seed=2)  # worker 0 is full
            published.append(board.loads()[1])
            await first.close()
            published.append(board.loads()[1])
            exposition = pool.exposition().decode()
            await second.close()
        published.append(board.loads()[1])
        return published, refused.value, exposition

    published, refused, exposition = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert published == [W(True, 0), W(True, 1), W(True, 2), W(True, 1), W(False, 0)]
    assert (refused.reason, refused.sessions, refused.capacity, refused.slots) == (messages.OTHER_WORKER, 1, 3, 3)
    assert refused.message == (
        "worker 1 of 2 leaves this session to worker 0, which would then step 1 session (this worker would step 2): "
        "connect again"
    )
    assert 'duplexcadence_sessions_refused_total{reason="other-worker"} 1.0' in exposition


def test_admission_counts_the_units_the_other_workers_step_on_the_device():
    rule = AdmissionRule(192, 32, TickModel(0.0005, 0.0033, "group"), 0.08, 0.15)  # one worker's 6 groups
    assert (rule.capacity(), rule.capacity(shared_units=16)) == (192, 128)  # 20 groups fit the 68 ms budget
    assert str(rule.refusal(128, False, shared_units=16)) == (
        "at capacity: 128 of 128 sessions, predicted tick 69.8 ms of 80.0 ms (headroom 15%), the other workers' "
        "16 groups on the device included; one more session would pass the budget of 68.0 ms"
    )
    assert str(rule.refusal(64, False, shared_units=19)) == (  # the others took the room of a group open here
        "at capacity: 64 sessions open (room for 32), predicted tick 73.1 ms of 80.0 ms (headroom 15%), the other "
        "workers' 19 groups on the device included; one more session would pass the budget of 68.0 ms"
    )
    snapshot = rule.snapshot(96, False, 1, shared_units=16)
    assert (snapshot.free, snapshot.shared_units, snapshot.predicted_tick_s) == (
        32,
        16,
        pytest.approx(0.0632),
    )  # 3 + 16 groups


def test_workers_sharing_a_device_admit_what_the_most_lenient_model_keeps_under_the_budget():
    models = [TickModel(0.0005, 0.0033, "group"), TickModel(0.0002, 0.0034, "group")]  # 20 and 19 groups
    assert shared_device_capacity(models, 24, 32, 0.08, 0.15) == 640
    assert shared_device_capacity(models, 12, 32, 0.08, 0.15) == 384  # every group held
    assert shared_device_capacity([TickModel(0.010, 0.020)], 5, None, 0.08, 0.15) == 2
    assert shared_device_capacity([TickModel(0.070, 0.0)], 5, None, 0.08, 0.15) == 0  # fixed cost over budget


def test_a_pool_on_a_board_admits_by_the_device_time_of_every_worker():
    board = PlacementBoard(2, multiprocessing.get_context("spawn"))
    toy = served_tail("toy")

    async def scenario():  # 10 ms + 20 ms a session: 2 sessions fit the 68 ms budget, wherever they are
        async with seated_pool(toy, TickModel(0.010, 0.020), board.seat(0)) as pool:
            board.seat(1).publish(W(True, 1))
            session = await pool.open(seed=1)
            with pytest.raises(AdmissionRefused) as refused:
                await pool.open(seed=2)
            snapshot = pool.capacity()
            published = board.loads()[0]
            await session.close()
        return refused.value, snapshot, published

    refused, snapshot, published = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert (refused.reason, refused.capacity) == (messages.AT_CAPACITY, 1)
    assert refused.message == (
        "at capacity: 1 of 1 sessions, predicted tick 70.0 ms of 80.0 ms (headroom 15%), the other workers' "
        "1 session on the device included; one more session would pass the budget of 68.0 ms"
    )
    assert (snapshot.capacity, snapshot.free, snapshot.shared_units) == (1, 0, 1)
    assert published == W(False, 1)  # full: the other worker's session counts against this one's budget


def test_a_worker_s_word_that_it_admits_is_corrected_when_the_others_fill_the_device():
    """Two pools on one board with their own models (A: 4 ms + 12 ms a session, B: 10 ms + 20 ms; 68 ms of
    budget). B published that it admits while A held nothing; once A steps 2 sessions B cannot take one more,
    and its word is corrected by its own refusal or its periodic publish, so that A is not kept sending
    sessions to B."""
    board = PlacementBoard(2, multiprocessing.get_context("spawn"))
    toy = served_tail("toy")

    async def scenario():
        async with (
            seated_pool(toy, TickModel(0.004, 0.012), board.seat(0)) as a,
            seated_pool(toy, TickModel(0.010, 0.020), board.seat(1)) as b,
        ):
            opened = [await b.open(seed=1), await a.open(seed=2), await a.open(seed=3)]
            tries = []
            for pool in (a, b, a):
                try:
                    opened.append(await pool.open(seed=4))
                    tries.append("admitted")
                    break
                except AdmissionRefused as refused:
                    tries.append(refused.reason)
            held = (len(a.sessions), len(b.sessions))
            await asyncio.sleep(3 * PUBLISH_EVERY_S)
            published = board.loads()
            for session in opened:
                await session.close()
        return tries, held, published

    tries, held, published = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert tries in (["admitted"], [messages.OTHER_WORKER, messages.AT_CAPACITY, "admitted"])
    assert held == (3, 1)
    assert published == [W(False, 3), W(False, 1)]  # A: its 3 slots taken; B: 10 + 20 x 4 = 90 ms with A's 3
