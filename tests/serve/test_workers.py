"""`dsl serve --workers N`: the command run as a process of its own (`python -m duplexcadence`) on a free
port with 2 workers of the toy tail on the CPU. Sessions land on both workers and equal each session alone on
stock, `/metrics` on any worker is the sum over both, a slot or lane count that does not split is refused
with its exact text, as is a port another server holds, a killed worker stops the server with exit 1 and a
message naming it, and an interrupt or a hang-up stops everything with exit 0, no traceback and the metrics
folder removed."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket

import pytest

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.client import Refused, SessionClient
from duplexcadence.interpreter.serve.loadgen import run_load
from duplexcadence.interpreter.serve.tail import served_tail
from duplexcadence.interpreter.serve.workers import bind_sockets

pytestmark = pytest.mark.slow  # most of its tests start server processes, a few seconds each

TOY = served_tail("toy")
SERVING_ON = re.compile(r"^serving on 2 worker\(s\) through (ws://127\.0\.0\.1:(\d+)/v1/session)$", re.M)
WORKER = re.compile(r"^worker (\d) \(pid (\d+)\):$", re.M)


def start_workers(
    serve_process, *extra: str, tmp: str | None = None, served: tuple[str, ...] = ("toy", "--slots", "4")
):
    """`dsl serve toy --workers 2 --slots 4` in a process of its own (`conftest.ServeProcess`); `tmp`: the
    server's TMPDIR, where its metrics folder is made; `served`: the tail and its options."""
    argv = [*served, "--workers", "2", "--device", "cpu", "--port", "0", "--log-level", "warning", *extra]
    env = dict(os.environ, **({"TMPDIR": tmp} if tmp else {}))
    return serve_process(argv, SERVING_ON, WORKER, env)


def metrics_folders(tmp) -> list[str]:
    return [path.name for path in tmp.glob("duplexcadence-metrics-*")]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("workers")


@pytest.fixture(scope="module")
def workers(tmp, serve_process):
    server = start_workers(serve_process, tmp=str(tmp))
    yield server
    server.stop()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


def test_the_start_up_lines_say_the_split_and_each_worker(workers):
    text = "".join(workers.lines)
    assert text.startswith("2 workers on one port, each with its own pool of 2 session slots in 1 lane(s)\n")
    assert sorted(workers.pids) == [0, 1] and len(set(workers.pids.values())) == 2
    assert text.count("serving 'toy' on cpu: 2 session slots in 1 lane(s); tick period 80.0 ms") == 2


def test_sessions_open_on_both_workers_and_equal_each_session_alone_on_stock(workers, toy_stock_alone):
    report = run(run_load(workers.url, 4, 5, TOY.inputs, paced=False, record=4, first_seed=20))
    assert (report.opened, report.errors) == (4, {})
    assert sorted(load.worker for load in report.per_session) == [0, 0, 1, 1]  # 2 slots each: both full
    assert toy_stock_alone(report.per_session) == [(5, 0)] * 4


def test_a_ready_frame_names_its_worker_and_a_full_server_refuses(workers):
    async def fill():
        clients = [await SessionClient.connect(workers.url, seed=seed) for seed in range(4)]
        try:
            with pytest.raises(Refused) as refused:
                await SessionClient.connect(workers.url, seed=9, retries=3)
        finally:
            for client in clients:
                await client.close()
        return [(c.ready["worker"], c.ready["workers"]) for c in clients], refused.value

    frames, refusal = run(fill())
    assert sorted(frames) == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert (refusal.code, refusal.close_code, refusal.workers) == ("at-capacity", 1013, 2)
    assert refusal.message.endswith("all 2 session slots are taken")


def test_metrics_on_any_worker_are_the_sum_over_the_workers(workers, tmp, metric):
    before = metric(workers.get("/metrics"), "duplexcadence_sessions_admitted_total")
    report = run(run_load(workers.url, 4, 5, TOY.inputs, paced=False, first_seed=40))
    assert sorted(load.worker for load in report.per_session) == [0, 0, 1, 1]
    for _ in range(6):  # new connections: the kernel spreads them over both workers
        text = workers.get("/metrics")
        assert metric(text, "duplexcadence_session_slots") == 4.0
        assert metric(text, "duplexcadence_sessions_admitted_total") == before + 4.0
        assert metric(text, "duplexcadence_tick_period_seconds") == 0.08
        assert metric(text, "duplexcadence_ticks_total") >= 20.0
    assert len(metrics_folders(tmp)) == 1


def assert_stopped_in_order(server, number: int) -> None:
    """`number` sent to the server: exit 0, no traceback, the stopping line, every worker gone."""
    server.process.send_signal(number)
    code, text = server.finish()
    assert code == 0, text
    assert "Traceback" not in text
    assert text.rstrip().endswith("stopping: 2 worker(s) close their sessions (1001) and exit")
    for pid in server.pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_interrupt_stops_every_worker_without_a_traceback_and_removes_the_metrics_folder(workers, tmp):
    assert_stopped_in_order(workers, signal.SIGINT)
    assert metrics_folders(tmp) == []


def test_a_hang_up_stops_every_worker_like_an_interrupt(tmp_path, serve_process):
    server = start_workers(serve_process, tmp=str(tmp_path))
    assert len(metrics_folders(tmp_path)) == 1
    assert_stopped_in_order(server, signal.SIGHUP)
    assert metrics_folders(tmp_path) == []


def test_a_killed_worker_stops_the_server_with_exit_1_naming_it(serve_process):
    server = start_workers(serve_process)
    os.kill(server.pids[1], signal.SIGKILL)
    code, text = server.finish()
    assert code == 1
    assert text.rstrip().endswith(
        f"dsl serve: error: worker 1 (pid {server.pids[1]}) was ended by signal 9 (SIGKILL) while serving; its "
        "sessions are lost and the server stops its other workers rather than serve with fewer"
    )
    with pytest.raises(ProcessLookupError):
        os.kill(server.pids[0], 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--workers", "2", "--slots", "3"],
            "--slots 3 does not split evenly over --workers 2: give a multiple of 2 (2 or 4: 1 or 2 a worker)",
        ),
        (
            ["--workers", "4", "--slots", "2"],
            "--slots 2 does not split evenly over --workers 4: give a multiple of 4 (4: 1 a worker)",
        ),
        (
            ["--workers", "2", "--slots", "4", "--lanes", "3"],
            "--lanes 3 does not split evenly over --workers 2: give a multiple of 2 (2 or 4: 1 or 2 a worker)",
        ),
        (
            ["--workers", "2", "--slots", "2", "--ray"],
            "--workers runs several server processes on this host and port; with --ray each replica is one server "
            "process: give --replicas instead",
        ),
        (["--workers", "0"], "argument --workers: must be >= 1, not 0"),
    ],
)
def test_workers_that_do_not_split_the_slots_or_lanes_are_refused(argv, says, dsl):
    code, out, err = dsl("serve", "toy", "--device", "cpu", *argv)
    assert (code, out) == (2, "")
    assert err.endswith(f"dsl serve: error: {says}\n") and err.count("error:") == 1


def test_a_port_another_server_holds_is_refused_not_shared(dsl):
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, out, err = dsl("serve", "toy", "--device", "cpu", "--workers", "2", "--slots", "2", "--port", str(port))
    assert (code, out) == (2, "")
    assert err.endswith(
        f"dsl serve: error: the workers cannot listen on 127.0.0.1:{port}: the port is in use (another port, or 0 "
        "for a free one)\n"
    )


def test_port_0_binds_every_worker_to_one_free_port():
    sockets = bind_sockets("127.0.0.1", 0, 3)
    try:
        assert len({sock.getsockname()[1] for sock in sockets}) == 1
    finally:
        for sock in sockets:
            sock.close()


def test_a_worker_that_dies_while_starting_has_no_sessions_to_lose():
    assert messages.worker_died(1, 42, -9, starting=True) == (
        "worker 1 (pid 42) was ended by signal 9 (SIGKILL) while starting; the server stops its other workers and "
        "does not serve"
    )
    assert messages.worker_died(0, 7, 3, starting=False).startswith(
        "worker 0 (pid 7) exited with code 3 while serving; its sessions are lost"
    )


def test_a_worker_that_cannot_start_its_pool_is_a_usage_error_worded_as_one_server(dsl):
    code, out, err = dsl(
        "serve", "toy", "--device", "cpu", "--workers", "2", "--slots", "2", "--lockstep", "2", "--port", "0"
    )
    assert (code, out) == (2, "")
    assert "dsl serve: error: --lockstep 2: this plan cannot take a session into a running group: " in err
    assert err.count("error:") == 1


@pytest.mark.models
def test_lockstep_sessions_fill_a_running_group_before_a_worker_starts_another(metric, serve_process):
    """Moshi's Mimi decoder in groups of 2 rows, 2 groups a worker: whichever worker each connection reaches,
    the second session joins the first one's group, the third starts a group on the other worker, and a
    session that comes after a close takes the freed row."""
    pytest.importorskip("moshi")
    # a Mimi frame on the CPU takes longer than the period: admission by the model alone
    server = start_workers(
        serve_process, "--tick-model", "1+1", "--no-latency-guard", served=("moshi", "--slots", "4", "--lockstep", "2")
    )

    async def scenario():
        clients = [await SessionClient.connect(server.url, seed=seed) for seed in range(4)]
        placed = [(c.ready["worker"], c.ready["group"]) for c in clients]
        await clients[0].close()
        clients[0] = await SessionClient.connect(server.url, seed=9)
        again = (clients[0].ready["worker"], clients[0].ready["group"])
        for client in clients:
            await client.close()
        return placed, again

    try:
        placed, again = run(scenario())
        metrics = server.get("/metrics")
    finally:
        server.stop()
    first, third = placed[0][0], placed[2][0]
    assert placed == [(first, 0), (first, 0), (third, 0), (third, 0)] and first != third
    assert again == (first, 0)
    assert metric(metrics, "duplexcadence_sessions_admitted_total") == 5
