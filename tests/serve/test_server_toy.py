"""The toy tail through the websocket server (uvicorn on 127.0.0.1, a free port, started by the test): every
session's outputs equal that session run alone on stock; a full pool refuses with the admission's exact text
and close code 1013; reset, close, a disconnect that frees its slot; each malformed frame gets its error frame
and leaves the session unchanged; the health, capacity and metrics routes; the load generator and its verify."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import urllib.request

import pytest
import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.app import make_app
from duplexcadence.interpreter.serve.client import Refused, ServerError, SessionClient, SessionClosedByServer
from duplexcadence.interpreter.serve.loadgen import SessionLoad, compare_with_stock, run_load, verify
from duplexcadence.interpreter.serve.numerics import Numerics
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ServerThread
from duplexcadence.interpreter.serve.tail import served_tail

TOY = served_tail("toy")
MODEL = TickModel(0.010, 0.020)  # 80 ms period, 15 % headroom: 2 sessions fit the budget of 68 ms
TOY_POOL = PoolConfig(slots=3, lanes=2, tick_model=MODEL, idle_timeout_s=120)


@pytest.fixture(scope="module")
def server(toy_server):
    return toy_server


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


def get(server, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(server.url(path), timeout=30) as response:
        return response.status, response.read().decode()


def wait_for_sessions(server, count: int) -> dict:
    deadline = time.monotonic() + 30
    while True:
        capacity = json.loads(get(server, "/v1/capacity")[1])
        if capacity["sessions"] == count or time.monotonic() > deadline:
            return capacity
        time.sleep(0.02)


def equal_to_stock(seed: int, outputs: list[dict]) -> bool:
    compared, unequal = compare_with_stock(TOY, SessionLoad(seed, len(outputs), (), (), 0, None, tuple(outputs)))
    return compared == len(outputs) and unequal == 0


def test_concurrent_sessions_equal_each_session_alone_on_stock_and_a_full_pool_refuses(server):
    async def scenario():
        a = await SessionClient.connect(server.ws_url(), seed=11)
        b = await SessionClient.connect(server.ws_url(), seed=12)
        with pytest.raises(Refused) as refused:
            await SessionClient.connect(server.ws_url(), seed=13)
        outputs = {11: [], 12: []}

        async def stream(client, seed):
            for tick in range(8):  # pipelined: two ticks in flight
                await client.send(TOY.inputs(seed, tick))
                if tick:
                    outputs[seed].append(await client.receive())
            outputs[seed].append(await client.receive())

        await asyncio.gather(stream(a, 11), stream(b, 12))
        closed = await a.close()
        await b.close()
        return a.ready, refused.value, outputs, closed

    ready, refused, outputs, closed = run(scenario())
    assert ready["inputs"] == [{"name": "codes", "dtype": "i64", "shape": [1, 1], "time_axis": 1}]
    assert ready["outputs"] == [{"name": "pcm", "dtype": "f32", "shape": [1, 4, 2], "time_axis": 2}]
    assert (ready["type"], ready["protocol"], ready["tail"], ready["seed"], ready["tick_period_s"]) == (
        "ready",
        1,
        "toy",
        11,
        0.08,
    )
    assert (refused.code, refused.close_code) == (messages.AT_CAPACITY, messages.CLOSE_TRY_AGAIN_LATER)
    assert refused.message == (
        "at capacity: 2 of 2 sessions, predicted tick 70.0 ms of 80.0 ms (headroom 15%); one more session would pass "
        "the budget of 68.0 ms"
    )
    assert equal_to_stock(11, outputs[11]) and equal_to_stock(12, outputs[12])
    assert (closed["type"], closed["ticks"], closed["errors"]) == ("closed", 8, 0)
    assert wait_for_sessions(server, 0)["free"] == 2


def frame(tensors: dict) -> bytes:
    return codec.encode(tensors)


GOOD = {"codes": torch.tensor([[5]])}
MALFORMED = [
    (b"NOPE" + frame(GOOD)[4:], messages.BAD_MAGIC),
    (frame(GOOD)[:4] + struct.pack("<H", 9) + frame(GOOD)[6:], messages.BAD_VERSION),
    (frame(GOOD)[:17] + bytes([77]) + frame(GOOD)[18:], messages.UNKNOWN_DTYPE),
    (frame(GOOD)[:-3], messages.TRUNCATED),
    (frame({"codes": torch.tensor([[5]], dtype=torch.int32)}), messages.WRONG_DTYPE),
    (frame({"codes": torch.tensor([[5, 6], [7, 8]])}), messages.WRONG_SHAPE),
    (frame({"code": torch.tensor([[5]])}), messages.UNKNOWN_INPUT),
    (frame({}), messages.MISSING_INPUT),
    (frame({"codes": torch.tensor([[5, 6, 7]])}), messages.BAD_INPUT),  # 3 frames where the plan feeds 1
]


def test_each_malformed_frame_gets_its_error_and_leaves_the_session_unchanged(server):
    async def scenario():
        client = await SessionClient.connect(server.ws_url(), seed=21)
        outputs, errors = [], []
        for tick in range(3):
            outputs.append(await client.step(TOY.inputs(21, tick)))
        for data, _ in MALFORMED:
            await client.send_raw(data)
            with pytest.raises(ServerError) as raised:
                await client.receive()
            errors.append((raised.value.code, raised.value.tick))
            outputs.append(await client.step(TOY.inputs(21, len(outputs))))  # the next valid frame
        await client.send_raw("not json")
        with pytest.raises(ServerError) as control:
            await client.receive()
        await client.send_raw(json.dumps({"type": "rewind"}))
        with pytest.raises(ServerError) as unknown:
            await client.receive()
        closed = await client.close()
        return outputs, errors, control.value, unknown.value, closed

    outputs, errors, control, unknown, closed = run(scenario())
    assert [code for code, _ in errors] == [code for _, code in MALFORMED]
    assert [tick for _, tick in errors] == [3 + 2 * i for i in range(len(MALFORMED))]  # the frame each answers
    assert equal_to_stock(21, outputs)
    assert (control.code, control.message) == (
        messages.BAD_CONTROL,
        'the text frame is not JSON; control frames are JSON objects: {"type": "reset"} or {"type": "close"}',
    )
    assert unknown.message.startswith("unknown control type 'rewind'")
    assert (closed["ticks"], closed["errors"]) == (3 + len(MALFORMED), len(MALFORMED))


def test_reset_a_stage_failure_and_its_recovery_over_the_socket(server):
    async def scenario():
        client = await SessionClient.connect(server.ws_url(), seed=31)
        first = [await client.step(TOY.inputs(31, tick)) for tick in range(3)]
        await client.reset()
        again = [await client.step(TOY.inputs(31, tick)) for tick in range(2)]
        with pytest.raises(ServerError) as failed:
            await client.step(codes=torch.tensor([[99]]))  # past the embedding: the stage raises
        with pytest.raises(ServerError) as refused:
            await client.step(TOY.inputs(31, 2))
        await client.reset()
        recovered = [await client.step(TOY.inputs(31, tick)) for tick in range(2)]
        await client.close()
        return first, again, failed.value, refused.value, recovered

    first, again, failed, refused, recovered = run(scenario())
    assert equal_to_stock(31, first) and equal_to_stock(31, again) and equal_to_stock(31, recovered)
    assert failed.code == messages.STAGE_FAILED and "IndexError" in failed.message
    assert refused.code == messages.SESSION_FAILED


def test_a_client_that_disconnects_mid_session_frees_its_slot(server):
    async def scenario():
        client = await SessionClient.connect(server.ws_url(), seed=41)
        await client.step(TOY.inputs(41, 0))
        await client.send(TOY.inputs(41, 1))  # in flight or queued when it goes
        client.connection.transport.abort()  # no close frame: the connection drops

    assert wait_for_sessions(server, 0)["sessions"] == 0
    run(scenario())
    capacity = wait_for_sessions(server, 0)
    assert (capacity["sessions"], capacity["free"]) == (0, 2)
    assert 'duplexcadence_sessions_closed_total{reason="disconnected"}' in get(server, "/metrics")[1]


def test_the_health_capacity_sessions_and_metrics_routes(server):
    async def scenario():
        client = await SessionClient.connect(server.ws_url(), seed=51)
        for tick in range(4):
            await client.step(TOY.inputs(51, tick))
        sessions = json.loads(get(server, "/v1/sessions")[1])
        await client.close()
        return sessions

    before = get(server, "/metrics")[1]
    sessions = run(scenario())
    status, health = get(server, "/healthz")
    assert (status, json.loads(health)) == (200, {"status": "ok", "tail": "toy", "sessions": 0})
    capacity = json.loads(get(server, "/v1/capacity")[1])
    assert {key: capacity[key] for key in ("slots", "capacity", "tick_period_s", "headroom", "draining", "lanes")} == {
        "slots": 3,
        "capacity": 2,
        "tick_period_s": 0.08,
        "headroom": 0.15,
        "draining": False,
        "lanes": 2,
    }
    assert capacity["model"] == {"fixed_s": 0.01, "per_unit_s": 0.02, "unit": "session", "points": []}
    (mine,) = [s for s in sessions["sessions"] if s["seed"] == 51]
    assert (mine["ticks"], mine["errors"]) == (4, 0)
    after = get(server, "/metrics")[1]

    def value(text: str, name: str) -> float:
        return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    assert value(after, "duplexcadence_ticks_total") - value(before, "duplexcadence_ticks_total") == 4
    for name in (
        "duplexcadence_sessions_active",
        "duplexcadence_tick_latency_seconds_bucket",
        "duplexcadence_round_seconds_count",
        "duplexcadence_ticks_missed_total",
        "duplexcadence_arena_bytes",
        "duplexcadence_graph_replays_total",
        'duplexcadence_eager_firings_total{kind="off_plan"}',
        "duplexcadence_capacity_sessions 2.0",
        "duplexcadence_predicted_tick_seconds",
    ):
        assert name in after, name


def test_the_load_generator_drives_sessions_and_verifies_them_against_stock(server):
    report = run(run_load(server.ws_url(), 2, 6, TOY.inputs, paced=False, record=2, first_seed=60))
    report = verify(TOY, report)
    assert (report.opened, report.ticks, report.errors, report.refused) == (2, 12, {}, {})
    assert (report.verified_sessions, report.verified_ticks, report.unequal_ticks) == (2, 12, 0)
    crowded = run(run_load(server.ws_url(), 3, 2, TOY.inputs, paced=True))
    assert (crowded.opened, crowded.refused) == (2, {messages.AT_CAPACITY: 1})
    lines = crowded.lines()
    assert lines[0] == "sessions: 2 of 3 opened; refused: 1 at-capacity"


def test_an_idle_session_is_closed_with_its_code():
    pool = SessionPool(TOY, PoolConfig(slots=1, tick_model=MODEL, idle_timeout_s=0.3))

    async def scenario():
        client = await SessionClient.connect(running.ws_url(), seed=0)
        with pytest.raises(SessionClosedByServer) as closed:
            await client.receive()
        return closed.value

    with ServerThread(make_app(pool)) as running:
        closed = run(scenario())
    assert (closed.code, closed.close_code) == (messages.IDLE_TIMEOUT, messages.CLOSE_IDLE)
    assert (
        closed.message
        == "the session sent nothing for 0.3 s (the pool's idle timeout) and was closed; its slot is free"
    )


def test_verify_compares_at_the_servers_numeric_settings_and_names_those_it_cannot_take(server):
    """The checker takes the server's settings from its `ready` frame: at them every tick is equal; at one
    torch thread where the server ran more (what a Ray replica with fewer CPUs does the other way round), the
    toy's sums come out in another order, which is why `--verify` applies them; they are put back after. A
    server of another torch is named as such rather than shown as outputs that differ."""
    threads = torch.get_num_threads()
    if threads < 2:
        pytest.skip("needs more than one torch thread to change the order of the sums")
    report = run(run_load(server.ws_url(), 1, 3, TOY.inputs, paced=False, record=1, first_seed=70))
    settings = Numerics.current("cpu").to_json()  # the server runs in this process
    same = verify(TOY, report, None, settings)
    one = verify(TOY, report, None, {**settings, "threads": 1})
    other = verify(TOY, report, None, {**settings, "torch": "0.0"})
    assert (same.verified_ticks, same.unequal_ticks, torch.get_num_threads()) == (3, 0, threads)
    assert one.unequal_ticks > 0 and one.verified_settings.endswith(", 1 torch thread, deterministic algorithms off")
    assert same.unmatched_settings == () and other.lines()[-1] == (
        f"verify: the server ran torch 0.0, this checker torch {torch.__version__}: ticks that differ may differ by "
        "these settings, not by the server"
    )
