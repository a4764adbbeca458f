"""One engine, several fronts: `dsl serve --fronts N`.

Past a few hundred sessions of an 80 ms frame, one process's event loop, not the device, sets the limit: it
receives, decodes, encodes and sends every frame of every session. `--workers N` splits the sessions over N
full servers, but then N pools take turns on the device, each round smaller and each paying its own fixed
cost. Here the work splits the other way: this process, the engine, holds the one `SessionPool` (its device
thread, its scheduler, its admission and metrics), and N front processes hold the websockets.

    clients ── ws://HOST:PORT/v1/session ──▶ one of N listening sockets (SO_REUSEPORT)
                                               ▼
      front 0: uvicorn + make_app(RemotePool)   front 1: ...   (websocket frames in and out; no device)
                   │  one socket pair each: messages batched into one write an event-loop turn
                   ▼
      engine (this process): EngineLink per front → SessionPool → Runtime (rounds over every session)

A front relays bytes: a tick's binary frame goes to the engine as it came, the engine decodes it, queues the
tick in the pool and sends back the encoded outputs frame (or the error), which the front writes to the
websocket. Every message a side sends within one turn of its event loop goes in one pickled write, so a
round's hundreds of answers cost a front a few reads. Sessions keep every semantics of the single server:
ticks answered in order, refusals with the pool's numbers (they are final: there is one pool), resets,
closes, idle timeouts and disconnects (a front that loses a websocket aborts its session in the engine).

A front that exits unasked takes its websockets with it; the engine aborts their sessions and the server
stops, as with `--workers` (the port would go on hashing connections to its socket). A front whose link to
the engine closes ends its sessions with `internal` and the engine's word (`messages.engine_lost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import struct
import sys
import threading
from typing import TYPE_CHECKING, Any

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused
from duplexcadence.interpreter.serve.bundle import BundleTickError
from duplexcadence.interpreter.serve.scheduler import ClosingState, SessionClosed, TickError
from duplexcadence.interpreter.serve.workers import STOP_TIMEOUT_S, WorkersFailed, bind_sockets, signals_ignored

if TYPE_CHECKING:
    from duplexcadence.interpreter.serve.pool import Bundle, PooledSession, SessionPool

LOG = logging.getLogger("duplexcadence.serve")
LENGTH = struct.Struct("<Q")
"""The prefix of each write on a link: the length of the pickled batch after it."""


class Link:
    """One end of the socket pair between the engine and a front. `send` queues a message (a tuple of plain
    values); the messages queued in one event-loop turn go out as one pickled write. Both ends are this
    package's own processes, so pickle carries nothing a user sent but bytes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.pending: list[tuple] = []
        self.closed = False

    @classmethod
    async def over(cls, sock: socket.socket) -> Link:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: tuple) -> None:
        if self.closed:
            return
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(message)

    def flush(self) -> None:
        if not self.pending or self.closed:
            return
        data = pickle.dumps(self.pending, pickle.HIGHEST_PROTOCOL)
        self.pending = []
        self.writer.writelines((LENGTH.pack(len(data)), data))

    async def receive(self) -> list[tuple] | None:
        """The next batch of messages, in the order sent; None once the other end has closed."""
        try:
            header = await self.reader.readexactly(LENGTH.size)
            data = await self.reader.readexactly(LENGTH.unpack(header)[0])
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return pickle.loads(data)

    def close(self) -> None:
        self.flush()
        self.closed = True
        self.writer.close()


# --- the engine -----------------------------------------------------------------------------------


class EngineLink:
    """The engine's side of one front: the front's requests run on the pool; answers go back in order."""

    def __init__(self, pool: SessionPool, link: Link, index: int):
        self.pool = pool
        self.link = link
        self.index = index
        self.sessions: dict[int, PooledSession | Bundle] = {}
        self.tasks: set[asyncio.Task] = set()

    async def serve(self) -> None:
        """Say hello (what every `ready` frame says of the pool, its start-up lines), then answer the front
        until its link closes; its sessions are then aborted (`disconnected`)."""
        self.link.send(("hello", self.pool.ready_fields(), self.pool.describe()))
        try:
            while (batch := await self.link.receive()) is not None:
                for message in batch:
                    self.handle(message)
        finally:
            for session in list(self.sessions.values()):
                session.abort(messages.DISCONNECTED, messages.front_lost(self.index))
            self.link.closed = True

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "tick":
            self._tick(*message[1:])
        elif kind == "open":
            self._spawn(self._open(*message[1:]))
        elif kind == "reset":
            self._reset(*message[1:])
        elif kind == "close":
            session = self.sessions.get(message[1])
            if session is not None:
                self._spawn(session.close())
        elif kind == "abort":
            session = self.sessions.get(message[1])
            if session is not None:
                session.abort(message[2], message[3])
        elif kind == "query":
            self._spawn(self._query(*message[1:]))
        else:
            LOG.error("front %d sent an unknown message %r", self.index, kind)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _open(self, request: int, asked: tuple[int, int | None]) -> None:
        """Open a session (or, with a count, a bundle of them) for the front, then watch it: once it closes
        (asked to, idle, aborted, the pool stopping), the front hears why and its numbers."""
        seed, bundle = asked
        session: PooledSession | Bundle
        try:
            session = await (self.pool.open(seed) if bundle is None else self.pool.open_bundle(bundle, seed))
        except AdmissionRefused as refusal:
            self.link.send(("refused", request, refusal_fields(refusal)))
            return
        except Exception as error:  # a fault of the pool (a bug): the front says so to its client
            LOG.exception("opening a session for front %d failed", self.index)
            self.link.send(("failed", request, messages.internal(error)))
            return
        self.sessions[session.id] = session
        self.link.send(("opened", request, session.id, session.info()))
        await session.closed_event.wait()
        self.sessions.pop(session.id, None)
        self.link.send(("ended", session.id, session.close_code, session.close_message, session.stats_json()))

    def _tick(self, session_id: int, tick: int, data: bytes) -> None:
        session = self.sessions.get(session_id)
        if session is None:  # it closed here; the front fails the tick when the `ended` word arrives
            return
        try:
            future = session.submit_frame(data)
        except (codec.FrameError, TickError) as error:
            self.link.send(("tick-error", session_id, tick, error.code, error.message, None))
            return
        future.add_done_callback(functools.partial(self._answered, session_id, tick))

    def _answered(self, session_id: int, tick: int, future: asyncio.Future) -> None:
        error = outcome_error(future)
        if error is None:
            self.link.send(("tick-out", session_id, tick, codec.encode(future.result())))
        else:
            members = error.members if isinstance(error, BundleTickError) else None
            self.link.send(("tick-error", session_id, tick, *error_words(error), members))

    def _reset(self, session_id: int, number: int) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            return
        try:
            future = session.reset()
        except TickError as error:
            self.link.send(("reset-done", session_id, number, (error.code, error.message)))
            return

        def done(future: asyncio.Future) -> None:
            error = outcome_error(future)
            self.link.send(("reset-done", session_id, number, None if error is None else error_words(error)))

        future.add_done_callback(done)

    async def _query(self, request: int, what: str) -> None:
        pool = self.pool
        answer: Any
        if what == "health":
            answer = await pool.health()
        elif what == "capacity":
            answer = await pool.capacity_json()
        elif what == "deadlines":
            answer = await pool.deadlines_json()
        else:
            answer = await pool.metrics_text()
        self.link.send(("answer", request, answer))


def outcome_error(future: asyncio.Future) -> BaseException | None:
    """The error a done future ended with (a cancelled one: the CancelledError), None for a result."""
    if future.cancelled():
        return asyncio.CancelledError("the pool cancelled the item")
    return future.exception()


def error_words(error: BaseException) -> tuple[str, str]:
    """(code, message) of a tick's or reset's error, as the front turns it back into a TickError."""
    if isinstance(error, TickError):
        return error.code, error.message
    return messages.INTERNAL, messages.internal(error)


def refusal_fields(refusal: AdmissionRefused) -> tuple:
    return (
        refusal.reason,
        refusal.message,
        refusal.sessions,
        refusal.capacity,
        refusal.slots,
        refusal.predicted_tick_s,
        refusal.tick_period_s,
        refusal.headroom,
    )


class FrontGroup:
    """The engine's side of `--fronts N`: over a started `pool` in this process, `await start()` binds the
    port and starts N front processes (multiprocessing's `spawn`), each with one socket of the port and a
    link to this process; `await wait(stop)` while they serve; `await stop()`."""

    def __init__(
        self, pool: SessionPool, fronts: int, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info"
    ):
        if fronts < 1:
            raise WorkersFailed(messages.too_few_workers(fronts), usage=True)
        self.pool = pool
        self.fronts = fronts
        self.host = host
        self.port = port
        self.log_level = log_level
        self.processes: list[Any] = []
        self.links: list[EngineLink] = []
        self.serving: list[asyncio.Task] = []
        self.pids: list[int] = []

    @property
    def ws_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}/v1/session"

    async def start(self) -> None:
        """Start every front and wait until all listen. WorkersFailed when one cannot (its exit said)."""
        sockets = bind_sockets(self.host, self.port, self.fronts, "--fronts")
        self.port = sockets[0].getsockname()[1]
        context = multiprocessing.get_context("spawn")
        receivers = []
        try:
            for index, sock in enumerate(sockets):
                engine_end, front_end = socket.socketpair()
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(
                    target=front_main,
                    args=(index, sock, front_end, sender, self.log_level),
                    name=f"duplexcadence-front-{index}",
                )
                with signals_ignored((signal.SIGINT, signal.SIGHUP)):
                    process.start()
                self.processes.append(process)
                front_end.close()
                sender.close()
                receivers.append(receiver)
                link = EngineLink(self.pool, await Link.over(engine_end), index)
                self.links.append(link)
                self.serving.append(asyncio.ensure_future(link.serve()))
        finally:
            for sock in sockets:
                sock.close()
        loop = asyncio.get_running_loop()
        waiting = dict(enumerate(receivers))
        pids: dict[int, int] = {}
        while waiting:
            sentinels = {self.processes[index].sentinel: index for index in waiting}
            ready = await loop.run_in_executor(
                None, functools.partial(multiprocessing.connection.wait, [*waiting.values(), *sentinels], 0.2)
            )
            for index, receiver in list(waiting.items()):
                if receiver in ready:
                    try:
                        pids[index] = receiver.recv()
                    except EOFError:  # ended without a word: its exit says how
                        await self.joined(index)
                        raise WorkersFailed(self.died(index, starting=True)) from None
                    del waiting[index]
            for sentinel, index in sentinels.items():
                if sentinel in ready and index in waiting and not waiting[index].poll():
                    await self.joined(index)
                    raise WorkersFailed(self.died(index, starting=True))
        self.pids = [pids[index] for index in range(self.fronts)]

    async def joined(self, index: int, timeout: float = 5.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.processes[index].join, timeout)

    def died(self, index: int, starting: bool) -> str:
        process = self.processes[index]
        return messages.front_died(index, process.pid, process.exitcode, starting)

    async def wait(self, stop: asyncio.Event) -> str | None:
        """Until `stop` is set (None), or a front exits unasked (what to say about it)."""
        loop = asyncio.get_running_loop()
        sentinels = {process.sentinel: index for index, process in enumerate(self.processes)}
        while not stop.is_set():
            ended = await loop.run_in_executor(
                None, functools.partial(multiprocessing.connection.wait, list(sentinels), 0.2)
            )
            if ended and not stop.is_set():
                index = sentinels[ended[0]]
                await self.joined(index)
                return self.died(index, starting=False)
        return None

    async def stop(self) -> None:
        """SIGTERM to every front (each stops listening, lets its websockets close and exits), killed when not
        gone within `STOP_TIMEOUT_S`; then the links close. Stop the pool first, so that every session's
        client hears why its session ended."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for index, process in enumerate(self.processes):
            await self.joined(index, STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                await self.joined(index)
        for link in self.links:
            link.link.close()
        for task in self.serving:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# --- a front --------------------------------------------------------------------------------------


class RemoteSession(ClosingState):
    """A front's proxy of one engine session (the `app.ServingSession` the websocket drives)."""

    def __init__(self, pool: RemotePool, session_id: int, info: dict):
        self.pool = pool
        self.id = session_id
        self._info = info
        self.closed_event = asyncio.Event()
        self.closing = None
        self.closed = False
        self.stats: dict = {}
        self.ticks: dict[int, asyncio.Future] = {}
        self.resets: dict[int, asyncio.Future] = {}
        self._tick_numbers = itertools.count()
        self._reset_numbers = itertools.count()

    def info(self) -> dict:
        return dict(self._info)

    def submit_frame(self, data: bytes) -> asyncio.Future:
        self.check_open()
        number = next(self._tick_numbers)
        future = self.ticks[number] = self.pool.loop.create_future()
        self.pool.link.send(("tick", self.id, number, data))
        return future

    def reset(self) -> asyncio.Future:
        self.check_open()
        number = next(self._reset_numbers)
        future = self.resets[number] = self.pool.loop.create_future()
        self.pool.link.send(("reset", self.id, number))
        return future

    async def close(self) -> None:
        if self.closed:
            return
        if self.closing is None:
            self.closing = (messages.CLIENT_CLOSED, "closed by the client")
            self.pool.link.send(("close", self.id))
        await self.closed_event.wait()

    def abort(self, code: str, message: str) -> None:
        if self.closed:
            return
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        self.pool.link.send(("abort", self.id, code, message))

    def stats_json(self) -> dict:
        return dict(self.stats)

    def answer_tick(
        self,
        number: int,
        outputs: bytes | None,
        error: tuple[str, str] | None = None,
        members: list[int] | None = None,
    ) -> None:
        settle(self.ticks.pop(number, None), outputs, error, members)

    def answer_reset(self, number: int, error: tuple[str, str] | None) -> None:
        settle(self.resets.pop(number, None), None, error)

    def ended(self, code: str | None, message: str | None, stats: dict) -> None:
        """The engine's word that the session closed: why, and its numbers; what is still unanswered fails."""
        self.closing = (code or messages.CLIENT_CLOSED, message or "closed by the client")
        self.stats = stats
        self.closed = True
        error = SessionClosed(*self.closing)
        for future in [*self.ticks.values(), *self.resets.values()]:
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: the socket may be gone
        self.ticks.clear()
        self.resets.clear()
        self.closed_event.set()


def settle(
    future: asyncio.Future | None, value: Any, error: tuple[str, str] | None, members: list[int] | None = None
) -> None:
    """Answer a proxied tick or reset: `value`, or a TickError of `error` (code, message); for a bundle's
    tick that failed for some of its sessions, a BundleTickError naming them (`members`)."""
    if future is None or future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(TickError(*error) if members is None else BundleTickError(*error, members))


class RemotePool:
    """A front's proxy of the engine's pool (the `app.ServingPool` its app serves), over the link `sock`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sessions: dict[int, RemoteSession] = {}
        self.requests: dict[int, asyncio.Future] = {}
        self.stopping = False
        self._ids = itertools.count()
        self._link: Link | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task | None = None
        self._ready_fields: dict = {}
        self._describe = ""

    @property
    def link(self) -> Link:
        assert self._link is not None, "start() the remote pool first"
        return self._link

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() the remote pool first"
        return self._loop

    async def start(self) -> None:
        """Connect and read the engine's hello; RuntimeError when the engine is gone."""
        self._loop = asyncio.get_running_loop()
        self._link = await Link.over(self.sock)
        hello = await self._link.receive()
        if not hello or hello[0][0] != "hello":
            raise RuntimeError(messages.engine_lost())
        _, self._ready_fields, self._describe = hello[0]
        for message in hello[1:]:
            self._handle(message)
        self._reader = self.loop.create_task(self._read(), name="duplexcadence-engine-link")

    async def stop(self) -> None:
        self.stopping = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._link is not None:
            self._link.close()
        self._lost(messages.SHUTTING_DOWN, messages.shutting_down())

    def describe(self) -> str:
        return self._describe

    def ready_fields(self) -> dict:
        return dict(self._ready_fields)

    async def open_bundle(self, count: int, seed: int = 0) -> RemoteSession:
        """A bundle of `count` sessions of the engine's pool (`pool.Bundle`), proxied as one session."""
        return self._opened(await self._request("open", (seed, count)))

    async def open(self, seed: int = 0) -> RemoteSession:
        return self._opened(await self._request("open", (seed, None)))

    def _opened(self, reply: tuple) -> RemoteSession:
        if reply[0] == "refused":
            raise AdmissionRefused(*reply[2])
        if reply[0] == "failed":
            raise RuntimeError(reply[2])
        session = RemoteSession(self, reply[2], reply[3])
        self.sessions[session.id] = session
        return session

    async def health(self) -> tuple[int, dict]:
        if self.stopping or self.link.closed:
            return 503, {"status": "stopping"}
        return await self._query("health")

    async def capacity_json(self) -> dict:
        return await self._query("capacity")

    async def deadlines_json(self) -> dict:
        return await self._query("deadlines")

    async def metrics_text(self) -> bytes:
        return await self._query("metrics")

    async def _query(self, what: str) -> Any:
        return (await self._request("query", what))[2]

    async def _request(self, kind: str, argument: Any) -> tuple:
        if self.link.closed:
            raise RuntimeError(messages.engine_lost())
        number = next(self._ids)
        future = self.requests[number] = self.loop.create_future()
        self.link.send((kind, number, argument))
        return await future

    async def _read(self) -> None:
        while (batch := await self.link.receive()) is not None:
            for message in batch:
                self._handle(message)
        self.link.closed = True
        if not self.stopping:
            LOG.error("%s", messages.engine_lost())
        self._lost(messages.INTERNAL, messages.engine_lost())

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind in ("tick-out", "tick-error"):
            session = self.sessions.get(message[1])
            if session is not None:
                if kind == "tick-out":
                    session.answer_tick(message[2], message[3])
                else:
                    session.answer_tick(message[2], None, (message[3], message[4]), message[5])
        elif kind == "reset-done":
            session = self.sessions.get(message[1])
            if session is not None:
                session.answer_reset(message[2], message[3])
        elif kind == "ended":
            session = self.sessions.pop(message[1], None)
            if session is not None:
                session.ended(*message[2:])
        else:  # opened, refused, failed, answer
            future = self.requests.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result(message)

    def _lost(self, code: str, message: str) -> None:
        for session in list(self.sessions.values()):
            session.ended(code, message, session.stats)
        self.sessions.clear()
        for future in self.requests.values():
            if not future.done():
                future.set_exception(RuntimeError(message))
        self.requests.clear()


def front_main(index: int, listen: socket.socket, link: socket.socket, parent: Any, log_level: str) -> None:
    """A front process: its proxy of the engine's pool, then uvicorn on `listen` until SIGTERM."""
    threading.Thread(target=exit_with_engine, name="duplexcadence-engine-watch", daemon=True).start()
    asyncio.run(serve_front(index, listen, link, parent, log_level))
    sys.exit(0)


def exit_with_engine() -> None:
    """A front's watch: when the engine process is gone (killed), the front stops too."""
    engine = multiprocessing.parent_process()
    if engine is not None:
        engine.join()
        os.kill(os.getpid(), signal.SIGTERM)


async def serve_front(index: int, listen: socket.socket, link: socket.socket, parent: Any, log_level: str) -> None:
    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.server import ChildServer, serve_pool, server_config

    pool = RemotePool(link)
    await pool.start()
    gc.collect()  # the front's imports out of the collector's walk while it serves (see PoolConfig.freeze_gc)
    gc.freeze()
    server = ChildServer(server_config(make_app(pool, manage_pool=False), log_level=log_level))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    await serve_pool(pool, server, lambda _: parent.send(os.getpid()), [listen])
