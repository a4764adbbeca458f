"""The server against clients that send what no honest client would: each malformed frame is answered with its
error frame and the session goes on; a query that is not valid is refused with its code; a frame longer than
any tick is refused unread; a client that never reads its answers is closed and frees its slot. Each test was
a silent drop, a traceback or a stuck handler before the server was hardened."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
import urllib.request

import pytest
import torch
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.app import FrontLimits, make_app
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ServerThread
from duplexcadence.interpreter.serve.tail import served_tail

TOY = served_tail("toy")
OVERFLOWING = b"DCTF" + struct.pack("<HHHH", 1, 0, 1, 5) + b"codes" + struct.pack("<BB8I", 5, 8, 0, *[2**32 - 1] * 7)
NESTED = "[" * 2000 + "]" * 2000  # within the 4096 characters a control may have
LONG = codec.encode({"codes": torch.zeros(1, 3000, dtype=torch.int64)})


def toy_server(pace: float | None):
    config = PoolConfig(
        slots=3, idle_timeout_s=60, tick_model=TickModel(0.001, 0.001), enforce_tick_budget=False, pace=pace
    )
    return ServerThread(make_app(SessionPool(TOY, config), limits=FrontLimits(answer_timeout_s=1.0)))


@pytest.fixture(scope="module")
def server():
    """A server that does not pace its sessions (nor so their frames): the flood of a client that never reads
    fills the buffers in a few seconds."""
    with toy_server(pace=None) as running:
        yield running


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


def sessions_open(server) -> int:
    with urllib.request.urlopen(server.url("/v1/sessions"), timeout=30) as response:
        return len(json.loads(response.read())["sessions"])


async def opened(url: str):
    connection = await connect(url, compression=None, proxy=None, ping_interval=None)
    ready = json.loads(await connection.recv())
    assert ready["type"] == "ready", ready
    return connection, ready


async def answer(connection):
    data = await connection.recv()
    return json.loads(data) if isinstance(data, str) else codec.decode(data).tensors


@pytest.mark.parametrize("route", ["/v1/session", "/v1/bundle?sessions=2"])
def test_a_frame_that_breaks_the_decoder_and_a_deeply_nested_control_are_answered_and_the_session_goes_on(
    server, route
):
    async def scenario():
        connection, _ = await opened(server.ws_url(route))
        await connection.send(OVERFLOWING)
        overflow = await answer(connection)
        await connection.send(NESTED)
        nested = await answer(connection)
        codes = torch.zeros(2 if "bundle" in route else 1, 1, 1, dtype=torch.int64)
        await connection.send(codec.encode({"codes": codes if "bundle" in route else codes[0]}))
        outputs = await answer(connection)
        await connection.close()
        return overflow, nested, outputs

    overflow, nested, outputs = run(scenario())
    assert (overflow["code"], overflow["tick"]) == (messages.BAD_FRAME, 0)
    assert overflow["message"].startswith("tensor 'codes' has shape [0, 4294967295,")
    assert nested == {
        "type": "error",
        "code": messages.BAD_CONTROL,
        "message": messages.bad_control("the text frame is not JSON"),
    }
    assert sorted(outputs) == ["pcm"]


@pytest.mark.parametrize(
    ("query", "shown"), [(f"seed={2**64}", str(2**64)), ("seed=-1", "-1"), ("seed=" + "9" * 5000, "9" * 40 + "...")]
)
def test_a_seed_out_of_a_generators_range_is_refused_with_its_code(server, query, shown):
    async def scenario():
        connection = await connect(server.ws_url(f"/v1/session?{query}"), proxy=None, ping_interval=None)
        refusal = json.loads(await connection.recv())
        with pytest.raises(ConnectionClosed) as closed:
            await connection.recv()
        return refusal, closed.value.rcvd.code

    refusal, close_code = run(scenario())
    assert (refusal["code"], close_code) == (messages.BAD_CONTROL, messages.CLOSE_POLICY)
    assert refusal["message"] == (
        f"the query parameter seed={shown!r} is not a whole number from 0 to 18446744073709551615; "
        "/v1/session?seed=N seeds the session"
    )


def test_a_frame_longer_than_any_tick_is_refused_unread_and_the_session_goes_on(server):
    async def scenario():
        connection, ready = await opened(server.ws_url())
        await connection.send(LONG)
        refused = await answer(connection)
        await connection.send(codec.encode({"codes": torch.zeros(1, 1, dtype=torch.int64)}))
        outputs = await answer(connection)
        await connection.close()
        return ready, refused, outputs

    ready, refused, outputs = run(scenario())
    most = ready["max_frame_bytes"]
    assert most == 8 + codec.MAX_HEADER_BYTES  # one i64 code a tick, the plan's most
    assert (refused["code"], refused["tick"]) == (messages.FRAME_TOO_LARGE, 0)
    assert refused["message"] == messages.frame_too_large(len(LONG), most)
    assert sorted(outputs) == ["pcm"]


def test_a_client_that_never_reads_its_answers_is_closed_and_frees_its_slot(server, metric):
    """It sends frames (each answered with an error frame) and reads nothing: the server stops reading it once
    its answers wait, gives up on an answer after the answer timeout (1 s here), closes the session with
    `unread-answers` and frees the slot; the handler does not stay behind."""

    async def scenario():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.connect(("127.0.0.1", server.port))
        sock.setblocking(False)
        connection = await connect(server.ws_url(), sock=sock, compression=None, proxy=None, ping_interval=None)
        assert json.loads(await connection.recv())["type"] == "ready"
        connection.transport.pause_reading()  # this client reads nothing more
        garbage = b"JUNK" + bytes(1020)
        sent = 0
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            # until the server stops reading (a send blocks) or closes the session; the kernel's buffers on
            # loopback take a few MB of answers before the server's writes wait
            while sent < 40000 and await asyncio.to_thread(sessions_open, server):
                for _ in range(1000):
                    await asyncio.wait_for(connection.send(garbage), 2)
                    sent += 1
        open_after = 1
        for _ in range(150):
            open_after = await asyncio.to_thread(sessions_open, server)
            if not open_after:
                break
            await asyncio.sleep(0.1)
        connection.transport.abort()
        return sent, open_after

    sent, open_after = run(scenario())
    with urllib.request.urlopen(server.url("/metrics"), timeout=30) as response:
        text = response.read().decode()
    assert open_after == 0, f"the session is still open after {sent} frames"
    assert 'duplexcadence_sessions_closed_total{reason="unread-answers"} 1.0' in text


def test_a_client_that_floods_frames_is_read_at_its_pace():
    """The pool paces 2 ticks a period of 80 ms, so a websocket's frames are read at 4 a period (50 a second)
    after a burst of 32: 82 junk frames sent at once are all answered (`bad-magic`), the last about a second
    after the first (0.9 s at the least: the allowance also fills while the handshake completes). Unpaced, the
    event loop decoded every frame as fast as it came."""

    async def scenario():
        with toy_server(pace=2.0) as paced:
            connection, _ = await opened(paced.ws_url())
            began = time.perf_counter()
            for _ in range(82):
                await connection.send(b"JUNK")
            codes = {(await answer(connection))["code"] for _ in range(82)}
            took = time.perf_counter() - began
            await connection.close()
        return codes, took

    codes, took = run(scenario())
    assert codes == {messages.BAD_MAGIC} and took >= 0.9
