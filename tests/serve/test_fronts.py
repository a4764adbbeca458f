"""`dsl serve --fronts N`: one pool in the engine process behind N websocket front processes.

The link itself (`EngineLink` and `RemotePool` over a socket pair, in one event loop, the toy tail on the CPU):
outputs equal to the pool's own, frame errors at their tick, a front's abort freeing the slot, an idle timeout
and the engine's stop reaching the front with their codes, a lost link on either side. Then the command as a
process of its own with 2 fronts: the start-up lines, sessions over both fronts equal to each session alone
on stock, one pool's admission and metrics whichever front answers, a killed front stopping the server with
exit 1 and a message naming it, an interrupt stopping everything with exit 0, and the options it refuses."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket

import pytest
import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, TickModel
from duplexcadence.interpreter.serve.client import Refused, SessionClient
from duplexcadence.interpreter.serve.fronts import EngineLink, Link, RemotePool, error_words, outcome_error
from duplexcadence.interpreter.serve.loadgen import run_load
from duplexcadence.interpreter.serve.modes import BundleTickError, TickError
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.tail import served_tail

pytestmark = pytest.mark.slow  # most of its tests start server processes, a few seconds each

TOY = served_tail("toy")


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


async def linked(config: PoolConfig) -> tuple[SessionPool, EngineLink, RemotePool, asyncio.Task]:
    """A started toy pool, its engine side of a link and a front's proxy over the other end, in this loop."""
    pool = SessionPool(TOY, config)
    await pool.start()
    engine_end, front_end = socket.socketpair()
    engine = EngineLink(pool, await Link.over(engine_end), 0)
    serving = asyncio.ensure_future(engine.serve())
    remote = RemotePool(front_end)
    await remote.start()
    return pool, engine, remote, serving


async def unlinked(pool: SessionPool, remote: RemotePool, serving: asyncio.Task) -> None:
    await remote.stop()
    await serving
    await pool.stop()


CONFIG = PoolConfig(slots=2, lanes=1, tick_model=TickModel(0.001, 0.001))


def test_a_remote_session_answers_what_the_pool_answers_with_the_ready_fields_of_the_pool():
    async def scenario():
        pool, _, remote, serving = await linked(CONFIG)
        try:
            assert remote.ready_fields() == pool.ready_fields()
            assert remote.describe() == pool.describe()
            session = await remote.open(seed=5)
            local = await pool.open(seed=5)
            assert session.info() == {"session": 1, "seed": 5, "group": None, "row": None}
            for tick in range(4):
                frame = codec.encode(TOY.inputs(5, tick))
                answered = await session.submit_frame(frame)
                expected = await local.submit_frame(frame)
                assert isinstance(answered, bytes)
                decoded = codec.decode(answered).tensors
                assert decoded.keys() == expected.keys()
                assert all(torch.equal(decoded[name], expected[name]) for name in expected)
            await session.close()
            await local.close()
            assert session.close_code == messages.CLIENT_CLOSED
            assert session.stats_json()["ticks"] == 4 and session.stats_json()["errors"] == 0
            assert (await remote.health()) == (200, {"status": "ok", "tail": "toy", "sessions": 0})
            assert (await remote.capacity_json()) == await pool.capacity_json()
        finally:
            await unlinked(pool, remote, serving)

    run(scenario())


def test_a_bad_frame_fails_its_tick_with_its_code_and_leaves_the_session_as_it_was():
    async def scenario():
        pool, _, remote, serving = await linked(CONFIG)
        try:
            session = await remote.open(seed=1)
            with pytest.raises(TickError) as bad:
                await session.submit_frame(b"NOPE" + bytes(8))
            wrong = codec.encode({"codes": torch.zeros(1, 1, dtype=torch.int32)})
            with pytest.raises(TickError) as dtype:
                await session.submit_frame(wrong)
            outputs = await session.submit_frame(codec.encode(TOY.inputs(1, 0)))
            await session.close()
            return bad.value, dtype.value, outputs, session.stats_json(), await pool.metrics_text()
        finally:
            await unlinked(pool, remote, serving)

    bad, dtype, outputs, stats, metrics = run(scenario())
    assert (bad.code, bad.message) == ("bad-magic", messages.bad_magic(b"NOPE", codec.MAGIC))
    assert (dtype.code, dtype.message) == ("wrong-dtype", messages.wrong_dtype("codes", "i32", "i64"))
    assert codec.decode(outputs).tensors.keys() == {"pcm"}
    assert (stats["ticks"], stats["errors"]) == (1, 2)
    assert 'duplexcadence_tick_errors_total{code="bad-magic"} 1.0' in metrics.decode()


def test_a_bundle_through_the_link_answers_what_the_pools_bundle_answers_and_names_a_failed_member():
    def stacked(seeds: list[int], tick: int) -> dict:
        return {"codes": torch.stack([TOY.inputs(seed, tick)["codes"] for seed in seeds])}

    async def scenario():
        pool, _, remote, serving = await linked(PoolConfig(slots=4, lanes=2, tick_model=TickModel(0.001, 0.001)))
        try:
            bundle = await remote.open_bundle(2, seed=5)
            local = await pool.open_bundle(2, seed=5)
            info = bundle.info()
            equal = []
            for tick in range(3):
                frame = codec.encode(stacked([5, 6], tick))
                answered = codec.decode(await bundle.submit_frame(frame)).tensors
                expected = await local.submit_frame(frame)
                equal.append(all(torch.equal(answered[name], expected[name]) for name in expected))
            poisoned = stacked([5, 6], 3)
            poisoned["codes"][1] = 99  # past the embedding: the second session's stage raises
            with pytest.raises(BundleTickError) as failed:
                await bundle.submit_frame(codec.encode(poisoned))
            await bundle.close()
            await local.close()
            return info, equal, failed.value, bundle.stats_json(), await pool.capacity_json()
        finally:
            await unlinked(pool, remote, serving)

    info, equal, failed, stats, capacity = run(scenario())
    assert (info["bundle"], [member["seed"] for member in info["members"]]) == (2, [5, 6])
    assert equal == [True, True, True]
    assert (failed.code, failed.members) == (messages.STAGE_FAILED, [1])
    assert [(member["ticks"], member["errors"]) for member in stats["members"]] == [(4, 0), (3, 1)]
    assert capacity["sessions"] == 0


def test_a_full_pool_refuses_through_the_link_with_its_numbers():
    async def scenario():
        pool, _, remote, serving = await linked(CONFIG)
        try:
            sessions = [await remote.open(seed) for seed in range(2)]
            with pytest.raises(AdmissionRefused) as refused:
                await remote.open(seed=3)
            for session in sessions:
                await session.close()
            return refused.value
        finally:
            await unlinked(pool, remote, serving)

    refusal = run(scenario())
    assert (refusal.reason, refusal.sessions, refusal.slots) == ("at-capacity", 2, 2)
    assert refusal.message.endswith("all 2 session slots are taken")


def test_an_abort_from_the_front_frees_the_slot_in_the_engine():
    async def scenario():
        pool, engine, remote, serving = await linked(CONFIG)
        try:
            session = await remote.open(seed=2)
            await session.submit_frame(codec.encode(TOY.inputs(2, 0)))
            session.abort(messages.DISCONNECTED, messages.disconnected())
            await asyncio.wait_for(session.closed_event.wait(), 10)
            return session.close_code, len(pool.sessions), len(engine.sessions)
        finally:
            await unlinked(pool, remote, serving)

    assert run(scenario()) == ("disconnected", 0, 0)


def test_an_idle_timeout_and_the_engine_stopping_reach_the_front_with_their_codes():
    async def scenario():
        pool, _, remote, serving = await linked(PoolConfig(slots=2, idle_timeout_s=0.3, tick_model=TickModel(0, 0)))
        idle = await remote.open(seed=1)
        await asyncio.wait_for(idle.closed_event.wait(), 10)
        busy = await remote.open(seed=2)
        await pool.stop()
        await asyncio.wait_for(busy.closed_event.wait(), 10)
        with pytest.raises(TickError) as after:
            busy.submit_frame(codec.encode(TOY.inputs(2, 0)))
        await remote.stop()
        await serving
        return (idle.close_code, idle.close_message), (busy.close_code, busy.close_message), after.value

    (idle, busy, after) = run(scenario())
    assert idle == ("idle-timeout", messages.idle_timeout(0.3))
    assert busy == ("shutting-down", messages.shutting_down())
    assert (after.code, after.message) == ("shutting-down", messages.session_closed(messages.shutting_down()))


def test_a_lost_link_ends_the_front_sessions_and_the_engine_sessions():
    async def scenario():
        pool, engine, remote, serving = await linked(CONFIG)
        session = await remote.open(seed=4)
        pending = session.submit_frame(codec.encode(TOY.inputs(4, 0)))
        await pending
        engine.link.close()  # the engine's end goes away: the front hears it as the engine lost
        await asyncio.wait_for(session.closed_event.wait(), 10)
        await asyncio.wait_for(serving, 10)  # and the engine, its front gone, aborts the session
        await asyncio.wait_for(pool.drained(), 10)
        with pytest.raises(RuntimeError) as refused:
            await remote.open(seed=5)
        assert await remote.health() == (503, {"status": "stopping"})
        await remote.stop()
        await pool.stop()
        return (session.close_code, session.close_message), str(refused.value)

    closed, refused = run(scenario())
    assert closed == ("internal", messages.engine_lost())
    assert refused == messages.engine_lost()


# --- the command ----------------------------------------------------------------------------------

SERVING_ON = re.compile(r"^serving on 2 front\(s\) through (ws://127\.0\.0\.1:(\d+)/v1/session)$", re.M)
FRONT = re.compile(r"^front (\d) \(pid (\d+)\) listens$", re.M)


def start_fronts(serve_process):
    """`dsl serve toy --fronts 2 --slots 4` in a process of its own (`conftest.ServeProcess`)."""
    argv = ["toy", "--slots", "4", "--fronts", "2", "--device", "cpu", "--port", "0", "--log-level", "warning"]
    return serve_process(argv, SERVING_ON, FRONT)


@pytest.fixture(scope="module")
def fronts(serve_process):
    server = start_fronts(serve_process)
    yield server
    server.stop()


def test_the_start_up_lines_say_the_engine_its_pool_and_each_front(fronts):
    text = "".join(fronts.lines)
    assert re.match(r"2 front processes on one port, one pool in the engine process \(pid \d+\)\n", text)
    assert "serving 'toy' on cpu: 4 session slots in 1 lane(s); tick period 80.0 ms\n" in text
    assert sorted(fronts.pids) == [0, 1] and len(set(fronts.pids.values())) == 2
    assert fronts.process.pid not in fronts.pids.values()


def test_sessions_over_both_fronts_equal_each_session_alone_on_stock(fronts, toy_stock_alone):
    report = run(run_load(fronts.url, 4, 5, TOY.inputs, paced=False, record=4, first_seed=20))
    assert (report.opened, report.errors) == (4, {})
    assert toy_stock_alone(report.per_session) == [(5, 0)] * 4


def test_one_pool_admits_and_counts_whichever_front_answers(fronts, metric):
    async def fill():
        clients = [await SessionClient.connect(fronts.url, seed=seed) for seed in range(4)]
        try:
            for client in clients:
                await client.step(TOY.inputs(client.ready["seed"], 0))
            with pytest.raises(Refused) as refused:
                await SessionClient.connect(fronts.url, seed=9)
            texts = [fronts.get("/metrics") for _ in range(6)]  # new connections: both fronts answer
            health = [fronts.get("/healthz") for _ in range(4)]
        finally:
            for client in clients:
                await client.close()
        return sorted(c.ready["session"] for c in clients), refused.value, texts, health

    ids, refusal, texts, health = run(fill())
    assert len(set(ids)) == 4  # one pool numbers them
    assert (refusal.code, refusal.close_code, refusal.workers) == ("at-capacity", 1013, None)
    assert refusal.message.endswith("all 4 session slots are taken")
    assert all(metric(text, "duplexcadence_sessions_active") == 4.0 for text in texts)
    assert all(metric(text, "duplexcadence_session_slots") == 4.0 for text in texts)
    assert all('"sessions":4' in body for body in health)


def test_an_interrupt_stops_the_engine_and_every_front_without_a_traceback(fronts):
    fronts.process.send_signal(signal.SIGINT)
    code, text = fronts.finish()
    assert code == 0, text
    assert "Traceback" not in text
    assert text.rstrip().endswith("stopping: the sessions close (1001) and 2 front(s) exit")
    for pid in fronts.pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_killed_front_stops_the_server_with_exit_1_naming_it(serve_process):
    server = start_fronts(serve_process)

    async def open_one():
        return await SessionClient.connect(server.url, seed=1)

    client = run(open_one())
    os.kill(server.pids[1], signal.SIGKILL)
    code, text = server.finish()
    assert code == 1
    assert text.rstrip().endswith(
        f"dsl serve: error: front 1 (pid {server.pids[1]}) was ended by signal 9 (SIGKILL) while serving; its "
        "sessions are lost and the server stops rather than serve with fewer fronts (the port would keep "
        "sending connections to its socket)"
    )
    with pytest.raises(ProcessLookupError):
        os.kill(server.pids[0], 0)
    del client


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--fronts", "2", "--workers", "2", "--slots", "2"],
            "--fronts runs one pool in this process behind several websocket front processes; --workers runs a "
            "pool in each of its processes: give one of them",
        ),
        (
            ["--fronts", "2", "--ray"],
            "--fronts runs one pool in this process behind several websocket front processes; --ray runs a pool "
            "in each of its processes: give one of them",
        ),
        (["--fronts", "0"], "argument --fronts: must be >= 1, not 0"),
    ],
)
def test_fronts_beside_workers_or_ray_are_refused(argv, says, dsl):
    code, out, err = dsl("serve", "toy", "--device", "cpu", *argv)
    assert (code, out) == (2, "")
    assert err.endswith(f"dsl serve: error: {says}\n") and err.count("error:") == 1


def test_a_port_another_server_holds_is_refused_naming_the_fronts(dsl):
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, out, err = dsl("serve", "toy", "--device", "cpu", "--fronts", "2", "--port", str(port))
    assert (code, out) == (2, "")
    assert err.endswith(
        f"dsl serve: error: the fronts cannot listen on 127.0.0.1:{port}: the port is in use (another port, or 0 "
        "for a free one)\n"
    )


def test_an_item_the_pool_cancels_is_answered_as_a_server_fault():
    async def scenario():
        loop = asyncio.get_running_loop()
        cancelled = loop.create_future()
        cancelled.cancel()
        finished = loop.create_future()
        finished.set_result({"pcm": torch.zeros(1)})
        return outcome_error(cancelled), outcome_error(finished)

    cancelled, finished = run(scenario())
    assert finished is None
    assert error_words(cancelled) == (
        "internal",
        "a server fault: CancelledError: the pool cancelled the item; this is a bug in DuplexCadence",
    )
