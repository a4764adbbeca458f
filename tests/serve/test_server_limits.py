"""The server's own limits and its shutdown: a half-sent request is cut after the header timeout, repeated log
lines are logged once an interval, `dsl serve` runs on uvloop, and a shutdown (SIGTERM to `dsl serve`, or
`should_exit`) answers every queued tick, then closes each session with `shutting-down` (1001), then exits."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import signal
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from duplexcadence.interpreter.cli import serve as serve_cli
from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.app import make_app
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ConnectionLimits, QuietRepeats, ServerThread
from duplexcadence.interpreter.serve.tail import served_tail

TOY = served_tail("toy")


def toy_pool() -> SessionPool:
    return SessionPool(TOY, PoolConfig(slots=2, tick_model=TickModel(0.001, 0.001), enforce_tick_budget=False))


def test_a_half_sent_request_is_cut_after_the_header_timeout_and_a_whole_one_is_answered():
    with ServerThread(make_app(toy_pool()), limits=ConnectionLimits(header_timeout_s=0.5)) as server:
        half = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the headers' end never comes
        whole = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        whole.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = whole.recv(4096)
        try:
            cut = half.recv(4096)
        except ConnectionResetError:
            cut = b""
        half.close()
        whole.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and cut == b""


def test_a_repeated_log_line_is_logged_once_an_interval_with_the_count_held_back():
    now = [0.0]
    quiet = QuietRepeats(lambda: now[0])
    records = [logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "accept failed", None, None) for _ in range(5)]
    passed = [quiet.filter(record) for record in records[:4]]
    now[0] = QuietRepeats.INTERVAL_S + 1
    assert passed == [True, False, False, False] and quiet.filter(records[4])
    assert records[4].getMessage() == "accept failed (3 more like it in the last 10 s not logged)"


def test_dsl_serve_runs_its_server_on_uvloop(monkeypatch):
    uvloop = pytest.importorskip("uvloop")
    seen = []

    async def serve(args):
        seen.append(type(asyncio.get_running_loop()))
        return 0

    monkeypatch.setattr(serve_cli, "serve", serve)
    args = argparse.Namespace(lanes=1, slots=1, ray=False, ray_address=None, replicas=None, ray_cpus=None)
    assert serve_cli.run(args) == 0 and seen == [uvloop.Loop]


async def queued_then_closed(url: str, ticks: int, stop) -> tuple[list, dict, int | None]:
    """Open a session, send `ticks` ticks at once, call `stop()` once they are sent, then read every answer
    until the close: the answers, the last frame and the close code."""
    connection = await connect(url, proxy=None, ping_interval=None)
    assert json.loads(await connection.recv())["type"] == "ready"
    for tick in range(ticks):
        await connection.send(codec.encode(TOY.inputs(7, tick)))
    await asyncio.to_thread(stop)
    answers, last, code = [], {}, None
    try:
        while True:
            data = await connection.recv()
            if isinstance(data, bytes):
                answers.append(codec.decode(data).tensors)
            else:
                last = json.loads(data)
    except ConnectionClosed as closed:
        code = closed.rcvd.code if closed.rcvd else None
    return answers, last, code


def test_a_shutdown_answers_the_queued_ticks_then_closes_each_session_with_1001():
    server = ServerThread(make_app(toy_pool())).start()
    answers, last, code = asyncio.run(queued_then_closed(server.ws_url(), 3, server.stop))
    assert len(answers) == 3
    assert (last.get("code"), code) == (messages.SHUTTING_DOWN, messages.CLOSE_GOING_AWAY)


@pytest.mark.slow
def test_sigterm_to_dsl_serve_drains_and_exits_0(serve_process):
    server = serve_process(
        ["toy", "--device", "cpu", "--slots", "2", "--port", "0", "--tick-model", "1+1"],
        re.compile(r"Uvicorn running on http://([\d.]+:(\d+))"),
        re.compile(r"$^"),
    )
    url = f"ws://127.0.0.1:{server.port}/v1/session"
    answers, last, code = asyncio.run(queued_then_closed(url, 3, lambda: server.process.send_signal(signal.SIGTERM)))
    exit_code, output = server.finish()
    assert len(answers) == 3 and (last.get("code"), code) == (messages.SHUTTING_DOWN, messages.CLOSE_GOING_AWAY)
    assert exit_code == 0, output
    assert "Traceback" not in output
