"""The server under hostile and careless clients, beside honest sessions at the cadence (CPU, loopback).

`dsl serve toy` runs in a process of its own, with an API key, one torch thread (`OMP_NUM_THREADS=1`), and
admission on its slots alone (the hostile clients are to be admitted, whatever the host's load does to the
latency guard). Honest sessions stream the toy's seeded codes at
the cadence (one tick every 80 ms) while hostile clients, each in its own task, do what no honest client
would; at the end:

* every honest output is compared with `torch.equal` against that session run alone through the stock loop;
* the honest sessions' p99 tick latency is compared with the tick period;
* the server's resident memory and open file descriptors are read from /proc before and after;
* each hostile client records the error code or close code it got (none is a failure).

The hostile clients: a frame whose empty tensor's dimensions overflow, a frame that is not a frame, JSON
nested too deep, a frame longer than any tick, a seed past 64 bits, a websocket without the key, a web page
of another origin, a client that sends ticks ahead of the cadence, a client that floods frames and never reads
its answers, a client that disconnects mid-stream, and half-sent HTTP requests. The JSON (`--out`) holds the figures;
docs/reliability.md quotes them with this command.

    python scripts/fault_harness.py --out /tmp/fault_harness.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.access import API_KEY_ENV
from duplexcadence.interpreter.serve.tail import served_tail

KEY = "fault-harness-key"
TOY = served_tail("toy")
OVERFLOWING = b"DCTF" + struct.pack("<HHHH", 1, 0, 1, 5) + b"codes" + struct.pack("<BB8I", 5, 8, 0, *[2**32 - 1] * 7)


class Server:
    """`dsl serve toy` in a process of its own; its stderr read on a thread (so the pipe never fills)."""

    def __init__(self, slots: int, header_timeout_s: float, idle_timeout_s: float):
        command = [sys.executable, "-m", "duplexcadence", "serve", "toy", "--device", "cpu", "--port", "0"]
        command += ["--slots", str(slots), "--tick-model", "1+1", "--api-key", KEY]
        command += ["--header-timeout", str(header_timeout_s), "--idle-timeout", str(idle_timeout_s)]
        command += ["--log-level", "info", "--no-latency-guard"]
        # one torch thread: on a few shared cores, intra-op threads that spin for each other stall every round
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=environment)
        self.lines: list[str] = []
        self.port: int | None = None
        self.listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.listening.wait(300) or self.port is None:
            self.process.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines[-40:]))

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                self.listening.set()
        self.listening.set()

    def url(self, path: str = "/v1/session", scheme: str = "ws") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def metrics(self) -> str:
        request = urllib.request.Request(self.url("/metrics", "http"), headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(120)


async def session(url: str, **options):
    connection = await connect(
        url, proxy=None, ping_interval=None, additional_headers={"Authorization": f"Bearer {KEY}"}, **options
    )
    ready = json.loads(await connection.recv())
    assert ready["type"] == "ready", ready
    return connection


async def first_error(connection) -> str:
    """The code of the first error frame, or `close N` when the server closed first."""
    try:
        while True:
            data = await connection.recv()
            if isinstance(data, str) and json.loads(data).get("type") == "error":
                return json.loads(data)["code"]
    except ConnectionClosed as closed:
        return f"close {closed.rcvd.code if closed.rcvd else None}"


async def malformed(server: Server, data: bytes | str) -> str:
    connection = await session(server.url())
    await connection.send(data)
    code = await first_error(connection)
    await connection.close()
    return code


async def refused_seed(server: Server) -> str:
    connection = await connect(
        server.url() + f"?seed={2**64}", proxy=None, additional_headers={"Authorization": f"Bearer {KEY}"}
    )
    code = json.loads(await connection.recv())["code"]
    closed = await first_error(connection)
    return f"{code}, {closed}"


async def refused_handshake(server: Server, **options) -> str:
    try:
        connection = await connect(server.url(), proxy=None, **options)
    except InvalidStatus as refusal:
        return f"HTTP {refusal.response.status_code} {json.loads(refusal.response.body)['code']}"
    await connection.close()
    return "opened"


async def ahead_of_the_cadence(server: Server, ticks: int) -> str:
    """Sends every tick at once, never waiting: the pace holds it to its burst, the queue refuses the rest."""
    connection = await session(server.url() + "?seed=500")
    for tick in range(ticks):
        await connection.send(codec.encode(TOY.inputs(500, tick)))
    codes = set()
    for _ in range(ticks):
        data = await connection.recv()
        if isinstance(data, str):
            codes.add(json.loads(data)["code"])
    await connection.close()
    return ", ".join(sorted(codes)) or "none"


async def never_reads(server: Server) -> str:
    """Floods frames and reads nothing (a small receive window): the server reads its frames at its pace (TCP
    holds the rest back), answers each with an error frame, and closes the session once it has sent nothing
    the pool steps for the idle timeout (or once an answer waits past the answer timeout)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    connection = await connect(
        server.url(), sock=sock, proxy=None, ping_interval=None, additional_headers={"Authorization": f"Bearer {KEY}"}
    )
    await connection.recv()
    connection.transport.pause_reading()
    with contextlib.suppress(TimeoutError, ConnectionClosed, OSError):
        for _ in range(60000):
            await asyncio.wait_for(connection.send(b"JUNK" + bytes(1020)), 2)
    for _ in range(300):
        text = await asyncio.to_thread(server.metrics)
        for reason in (messages.UNREAD_ANSWERS, messages.IDLE_TIMEOUT):
            if f'reason="{reason}"' in text:
                connection.transport.abort()
                return reason
        await asyncio.sleep(0.1)
    connection.transport.abort()
    return "still open"


async def disconnects(server: Server) -> str:
    connection = await session(server.url() + "?seed=600")
    for tick in range(3):
        await connection.send(codec.encode(TOY.inputs(600, tick)))
    connection.transport.abort()
    for _ in range(100):
        if 'reason="disconnected"' in await asyncio.to_thread(server.metrics):
            return messages.DISCONNECTED
        await asyncio.sleep(0.1)
    return "still open"


async def half_sent(server: Server, count: int) -> str:
    """`count` requests whose headers never end: each is cut by the header timeout."""
    writers = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        writers.append((reader, writer))
    cut = 0
    for reader, writer in writers:
        with contextlib.suppress(ConnectionError, TimeoutError):
            if await asyncio.wait_for(reader.read(), 30) == b"":
                cut += 1
        writer.close()
    return "every one cut" if cut == count else f"{cut} of {count} cut"


HOSTILE = {
    "overflowing dimensions": (lambda s, a: malformed(s, OVERFLOWING), messages.BAD_FRAME),
    "not a frame": (lambda s, a: malformed(s, b"RIFF" + bytes(64)), messages.BAD_MAGIC),
    "JSON nested too deep": (lambda s, a: malformed(s, "[" * 2000 + "]" * 2000), messages.BAD_CONTROL),
    "a frame longer than any tick": (lambda s, a: malformed(s, b"DCTF" + bytes(8 * 2**20)), messages.FRAME_TOO_LARGE),
    "a seed past 64 bits": (lambda s, a: refused_seed(s), f"{messages.BAD_CONTROL}, close {messages.CLOSE_POLICY}"),
    "no API key": (lambda s, a: refused_handshake(s), f"HTTP 401 {messages.UNAUTHORIZED}"),
    "another origin's page": (
        lambda s, a: refused_handshake(
            s, origin="http://evil.example", additional_headers={"Authorization": f"Bearer {KEY}"}
        ),
        f"HTTP 403 {messages.FORBIDDEN_ORIGIN}",
    ),
    "ahead of the cadence": (lambda s, a: ahead_of_the_cadence(s, 40), messages.QUEUE_FULL),
    "floods frames, never reads": (lambda s, a: never_reads(s), messages.IDLE_TIMEOUT),
    "disconnects mid-stream": (lambda s, a: disconnects(s), messages.DISCONNECTED),
    "half-sent requests": (lambda s, a: half_sent(s, a.half_sent), "every one cut"),
}


async def exercise(server: Server, args: argparse.Namespace, report_path: Path) -> tuple[dict, dict]:
    """The honest sessions from `dsl loadgen --verify` in a process of their own (their latency is theirs,
    not this process's event loop's), the hostile clients from here once they stream."""
    command = [sys.executable, "-m", "duplexcadence", "loadgen", server.url(), "--sessions", str(args.sessions)]
    command += ["--ticks", str(args.ticks), "--seed", "100", "--verify", "--json", str(report_path)]
    honest = await asyncio.create_subprocess_exec(
        *command, env={**os.environ, API_KEY_ENV: KEY}, stdout=asyncio.subprocess.DEVNULL
    )
    await asyncio.sleep(2.0)  # the honest sessions are streaming before the first hostile client
    names = list(HOSTILE)
    outcomes = await asyncio.gather(*(HOSTILE[name][0](server, args) for name in names), return_exceptions=True)
    await honest.wait()
    return json.loads(report_path.read_text()), dict(zip(names, outcomes, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=3, help="honest sessions (3)")
    parser.add_argument("--ticks", type=int, default=100, help="ticks per honest session, 80 ms each (100)")
    parser.add_argument("--half-sent", type=int, default=50, help="half-sent HTTP requests (50)")
    parser.add_argument("--header-timeout", type=float, default=2.0, help="the server's header timeout (2 s)")
    parser.add_argument("--idle-timeout", type=float, default=3.0, help="the server's idle timeout (3 s)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    server = Server(args.sessions + len(HOSTILE) + 4, args.header_timeout, args.idle_timeout)
    try:
        time.sleep(1.0)
        rss_before, fds_before = server.rss_mib(), server.fds()
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            report, outcomes = asyncio.run(exercise(server, args, Path(folder) / "honest.json"))
        wall = time.perf_counter() - began
        time.sleep(2 * args.header_timeout)  # the last cut connections' descriptors are closed
        rss_after, fds_after = server.rss_mib(), server.fds()
    finally:
        exit_code = server.stop()
    compared, unequal = report["verified_ticks"] or 0, report["unequal_ticks"] or 0
    hostile = {
        name: {"outcome": str(outcome), "expected": HOSTILE[name][1], "ok": str(outcome) == HOSTILE[name][1]}
        for name, outcome in outcomes.items()
    }
    figures = {
        "command": " ".join(["python", "scripts/fault_harness.py", *sys.argv[1:]]),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "honest_sessions": report["opened"],
        "honest_ticks": report["ticks"],
        "honest_errors": report["errors"],
        "honest_ticks_compared": compared,
        "honest_ticks_unequal": unequal,
        "honest_verified_at": report["verified_settings"],
        "honest_latency_p50_s": report["latency_p50_s"],
        "honest_latency_p99_s": report["latency_p99_s"],
        "tick_period_s": report["tick_period_s"],
        "server_rss_mib_before": rss_before,
        "server_rss_mib_after": rss_after,
        "server_fds_before": fds_before,
        "server_fds_after": fds_after,
        "server_exit_code": exit_code,
        "wall_s": wall,
        "hostile": hostile,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))
    print(
        f"honest: {report['ticks']} ticks of {report['opened']} sessions, errors {report['errors'] or 'none'}, "
        f"{unequal} of {compared} not torch.equal to stock alone; p50 {1000 * report['latency_p50_s']:.1f} ms, "
        f"p99 {1000 * report['latency_p99_s']:.1f} ms of the {1000 * report['tick_period_s']:.0f} ms period"
    )
    print(
        f"server: {rss_before:.0f} -> {rss_after:.0f} MiB resident, {fds_before} -> {fds_after} open files, "
        f"exit {exit_code}"
    )
    print("| hostile client | what it got | expected |")
    print("| --- | --- | --- |")
    for name, row in hostile.items():
        print(f"| {name} | {row['outcome']} | {row['expected']} |")
    honest_ok = report["opened"] == args.sessions and not report["errors"] and compared and not unequal
    return 0 if honest_ok and all(row["ok"] for row in hostile.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
