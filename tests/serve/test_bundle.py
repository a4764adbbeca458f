"""Bundles (`WS /v1/bundle?sessions=N`): N sessions of the pool over one websocket, a tick's tensors stacking the
members' on a leading axis. Every member's outputs equal that session alone on stock; a bundle that does not fit
is refused whole with the admission's numbers and keeps no slot; a malformed frame gets its error and leaves
every member unchanged; a stage failure names its members; reset, close, a disconnect and an idle timeout reach
every member; the load generator drives bundles and verifies them."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import pytest
import torch

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, TickModel
from duplexcadence.interpreter.serve.bundle import BundleTickError
from duplexcadence.interpreter.serve.client import Refused, ServerError, SessionClient, bundle_url
from duplexcadence.interpreter.serve.loadgen import SessionLoad, compare_with_stock, run_load, verify
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.scheduler import TickError
from duplexcadence.interpreter.serve.tail import served_tail

TOY = served_tail("toy")
MODEL = TickModel(0.010, 0.010)  # 80 ms period, 15 % headroom: the 4 slots fit the budget of 68 ms
TOY_POOL = PoolConfig(slots=4, lanes=2, tick_model=MODEL, idle_timeout_s=120)  # the `toy_server` fixture's


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


def sessions_open(toy_server, count: int) -> int:
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(toy_server.url("/v1/capacity"), timeout=30) as response:
            sessions = json.loads(response.read())["sessions"]
        if sessions == count or time.monotonic() > deadline:
            return sessions
        time.sleep(0.02)


def stacked(seeds: list[int], tick: int) -> dict[str, torch.Tensor]:
    rows = [TOY.inputs(seed, tick) for seed in seeds]
    return {name: torch.stack([row[name] for row in rows]) for name in rows[0]}


def members_equal_stock(seeds: list[int], answers: list[dict]) -> bool:
    for index, seed in enumerate(seeds):
        outputs = tuple({name: tensor[index] for name, tensor in answer.items()} for answer in answers)
        load = SessionLoad(seed, len(outputs), (), (), 0, None, outputs)
        if compare_with_stock(TOY, load) != (len(outputs), 0):
            return False
    return True


def test_a_bundles_members_equal_each_session_alone_on_stock(toy_server):
    seeds = [5, 6, 7]

    async def scenario():
        client = await SessionClient.connect(bundle_url(toy_server.ws_url(), 3), seed=5)
        answers = []
        for tick in range(5):  # pipelined: two ticks in flight
            await client.send(stacked(seeds, tick))
            if tick:
                answers.append(await client.receive())
        answers.append(await client.receive())
        open_then = sessions_open(toy_server, 3)
        closed = await client.close()
        return client, answers, open_then, closed

    client, answers, open_then, closed = run(scenario())
    assert client.bundle == 3
    assert [(member["seed"], member["group"]) for member in client.ready["members"]] == [
        (5, None),
        (6, None),
        (7, None),
    ]
    assert client.ready["inputs"] == [{"name": "codes", "dtype": "i64", "shape": [1, 1], "time_axis": 1}]
    assert [tuple(answer["pcm"].shape) for answer in answers] == [(3, 1, 4, 2)] * 5
    assert members_equal_stock(seeds, answers)
    assert open_then == 3
    assert [(member["seed"], member["ticks"], member["errors"]) for member in closed["members"]] == [
        (5, 5, 0),
        (6, 5, 0),
        (7, 5, 0),
    ]
    assert sessions_open(toy_server, 0) == 0


def test_a_bundle_the_tick_budget_does_not_fit_is_refused_whole_and_keeps_no_slot():
    async def scenario():
        pool = SessionPool(TOY, PoolConfig(slots=4, tick_model=TickModel(0.010, 0.020)))  # the budget keeps 2
        await pool.start()
        with pytest.raises(AdmissionRefused) as refused:
            await pool.open_bundle(3, seed=1)
        capacity = pool.capacity()
        await pool.stop()
        return refused.value, capacity

    refused, capacity = run(scenario())
    assert refused.reason == messages.AT_CAPACITY
    assert str(refused) == (
        "a bundle of 3 sessions does not fit (2 fitted, none is kept): the next one was refused: at capacity: 2 of 2 "
        "sessions, predicted tick 70.0 ms of 80.0 ms (headroom 15%); one more session would pass the budget of 68.0 ms"
    )
    assert (capacity.sessions, capacity.free) == (0, 2)


def admitted_so_far(toy_server) -> float:
    with urllib.request.urlopen(toy_server.url("/metrics"), timeout=30) as response:
        found = re.search(r"^duplexcadence_sessions_admitted_total (\S+)$", response.read().decode(), re.M)
    assert found is not None
    return float(found.group(1))


def test_a_bundle_larger_than_the_free_slots_is_refused_before_any_session_opens(toy_server):
    async def scenario():
        held = await SessionClient.connect(toy_server.ws_url(), seed=1)
        before = admitted_so_far(toy_server)
        with pytest.raises(Refused) as refused:
            await SessionClient.connect(bundle_url(toy_server.ws_url(), 9), seed=10)
        after = admitted_so_far(toy_server)
        await held.close()
        return refused.value, after - before

    refused, admitted = run(scenario())
    assert (refused.code, refused.close_code) == (messages.AT_CAPACITY, messages.CLOSE_TRY_AGAIN_LATER)
    assert refused.message == "a bundle of 9 sessions does not fit: 3 of the pool's 4 session slots are free"
    assert admitted == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0", "the query parameter sessions='0' is not a whole number of 1 or more"),
        ("two", "the query parameter sessions='two' is not a whole number of 1 or more"),
    ],
)
def test_a_bundle_size_that_is_not_a_count_is_refused(toy_server, text, expected):
    async def scenario():
        with pytest.raises(Refused) as refused:
            await SessionClient.connect(toy_server.ws_url().replace("/v1/session", f"/v1/bundle?sessions={text}"))
        return refused.value

    refused = run(scenario())
    assert (refused.code, refused.close_code) == (messages.BAD_CONTROL, messages.CLOSE_POLICY)
    assert refused.message == f"{expected}; /v1/bundle?sessions=N opens N sessions as one bundle"


def test_a_malformed_bundle_frame_gets_its_error_and_leaves_every_member_unchanged(toy_server):
    seeds = [40, 41]

    async def scenario():
        client = await SessionClient.connect(bundle_url(toy_server.ws_url(), 2), seed=40)
        answers = [await client.step(stacked(seeds, 0))]
        errors = []
        for bad in (
            {"codes": stacked(seeds, 1)["codes"][:1]},  # one row for two members
            {"codes": stacked(seeds, 1)["codes"].to(torch.int32)},
            {"codes": torch.tensor(3)},  # no leading axis at all
        ):
            with pytest.raises(ServerError) as raised:
                await client.step(bad)
            errors.append(raised.value)
        answers += [await client.step(stacked(seeds, tick)) for tick in (1, 2)]
        await client.close()
        return answers, errors

    answers, errors = run(scenario())
    assert [(error.code, error.tick, error.members) for error in errors] == [
        (messages.WRONG_SHAPE, 1, None),
        (messages.WRONG_DTYPE, 2, None),
        (messages.WRONG_SHAPE, 3, None),
    ]
    assert errors[0].message == (
        "input 'codes' of a bundle of 2 sessions has shape [1, 1, 1]; a bundle's inputs stack its sessions' on a "
        "leading axis of 2"
    )
    assert errors[2].message.startswith("input 'codes' of a bundle of 2 sessions has shape []")
    assert members_equal_stock(seeds, answers)


def test_a_stage_failure_names_its_members_delivers_the_others_outputs_and_a_reset_recovers_every_member(toy_server):
    seeds = [60, 61]

    async def scenario():
        client = await SessionClient.connect(bundle_url(toy_server.ws_url(), 2), seed=60)
        first = [await client.step(stacked(seeds, tick)) for tick in range(2)]
        poisoned = stacked(seeds, 2)
        poisoned["codes"][1] = 99  # past the embedding: member 1's stage raises
        with pytest.raises(ServerError) as failed:
            await client.step(poisoned)
        with pytest.raises(ServerError) as refused:
            await client.step(stacked(seeds, 3))
        await client.reset()
        recovered = [await client.step(stacked(seeds, tick)) for tick in range(3)]
        await client.close()
        return first, failed.value, refused.value, recovered

    first, failed, refused, recovered = run(scenario())
    assert (failed.code, failed.tick, failed.members) == (messages.STAGE_FAILED, 2, [1])
    assert "IndexError" in failed.message
    # the healthy member's outputs of that tick are delivered (its row), the failed member's row is zeros
    assert members_equal_stock([60], [*first, failed.outputs]) and not failed.outputs["pcm"][1].any()
    assert (refused.code, refused.members) == (messages.SESSION_FAILED, [1])
    assert members_equal_stock(seeds, first) and members_equal_stock(seeds, recovered)


def test_a_bundle_whose_client_disconnects_frees_every_slot(toy_server):
    async def scenario():
        client = await SessionClient.connect(bundle_url(toy_server.ws_url(), 3), seed=70)
        await client.step(stacked([70, 71, 72], 0))
        await client.send(stacked([70, 71, 72], 1))  # in flight or queued when it goes
        client.connection.transport.abort()

    run(scenario())
    assert sessions_open(toy_server, 0) == 0


def test_the_load_generator_drives_bundles_and_verifies_them(toy_server):
    report = run(run_load(toy_server.ws_url(), 4, 6, TOY.inputs, paced=False, record=4, first_seed=80, bundle=3))
    checked = verify(TOY, report)
    assert (report.opened, report.ticks, report.errors) == (4, 24, {})
    assert (checked.verified_sessions, checked.verified_ticks, checked.unequal_ticks) == (4, 24, 0)


def test_a_member_that_times_out_closes_its_bundle_with_the_code():
    async def scenario():
        pool = SessionPool(TOY, PoolConfig(slots=2, tick_model=MODEL, idle_timeout_s=0.2))
        await pool.start()
        bundle = await pool.open_bundle(2, seed=3)
        outputs = await bundle.submit(stacked([3, 4], 0))
        await asyncio.wait_for(bundle.closed_event.wait(), 10)
        with pytest.raises(TickError) as late:
            bundle.submit(stacked([3, 4], 1))
        free = pool.capacity().free
        await pool.stop()
        return bundle, outputs, late.value, free

    bundle, outputs, late, free = run(scenario())
    assert tuple(outputs["pcm"].shape) == (2, 1, 4, 2)
    assert bundle.close_code == messages.IDLE_TIMEOUT
    assert [member.close_code for member in bundle.members] == [messages.IDLE_TIMEOUT] * 2
    assert late.code == messages.IDLE_TIMEOUT and not isinstance(late, BundleTickError)
    assert free == 2
