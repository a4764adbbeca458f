"""uvicorn around the app: the configuration `dsl serve` runs, how it starts its pool and serves it, and a server
on a thread of its own (its own event loop) for tests and benchmarks that drive it from the same process.

What a connection may hold of the server, before any route sees it (`ConnectionLimits`): the HTTP request's
headers must arrive within `header_timeout_s` (a half-sent request is cut, `HeaderTimeout`), at most
`max_connections` are served at once (uvicorn's `limit_concurrency`: 503 past it; never above the process's
open-file limit less a reserve), and repeated log lines (an accept that fails for want of file descriptors, one
client's faults) are logged once per `QuietRepeats.INTERVAL_S`. On SIGTERM or SIGINT (`should_exit`) the
server drains (`DrainingServer`): it stops listening, every scheduler of the app (`app.state.schedulers`)
answers the ticks already queued and closes its sessions with `shutting-down` (1001), for up to
`drain_timeout_s`, and only then does uvicorn close what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import attrs
import uvicorn

from duplexcadence.interpreter.serve import messages

T = TypeVar("T")

MAX_FRAME_BYTES = 64 * 2**20
"""The largest websocket message the server reads (a tick's tensors)."""
RESERVED_FILES = 64
"""File descriptors kept free of connections (the model's files, the logs, the device)."""
LOG = logging.getLogger("duplexcadence.serve")


@attrs.frozen
class ConnectionLimits:
    """What connections may hold of the server (see the module docstring)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    drain_timeout_s: float = 30.0


def connection_limit(wanted: int) -> int:
    """`wanted` connections, at most the process's open-file limit less `RESERVED_FILES`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FILES))


def http_protocol(header_timeout_s: float) -> type:
    """uvicorn's HTTP protocol (httptools where it is installed, else h11) with a header timeout: a connection
    whose request's headers have not all arrived `header_timeout_s` after it opened, or after its last response,
    is cut (a websocket handshake is a request like another; once upgraded, the timer leaves it)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]

    class HeaderTimeout(base):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.arm_header_timer()

        def arm_header_timer(self) -> None:
            self.loop.call_later(header_timeout_s, self.headers_overdue, self.cycle)

        def headers_overdue(self, cycle: Any) -> None:
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self or self.cycle is not cycle:
                return  # closed, upgraded to a websocket, or a new request's headers arrived
            if cycle is None or cycle.response_complete:
                LOG.warning("%s", messages.header_timeout(header_timeout_s))
                transport.abort()

    return HeaderTimeout


class QuietRepeats(logging.Filter):
    """Lets a log message through once per `INTERVAL_S` (by logger and message template), with the count of
    those held back since; the traceback of a repeat is dropped with it."""

    INTERVAL_S = 10.0

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.clock = clock
        self.seen: dict[tuple[str, object], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = self.clock()
        last = self.seen.get(key)
        if last is not None and now - last[0] < self.INTERVAL_S:
            self.seen[key] = (last[0], last[1] + 1)
            return False
        if len(self.seen) > 1024:
            self.seen.clear()
        held = last[1] if last is not None else 0
        self.seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({messages.repeats_held(held, self.INTERVAL_S)})"
        return True


QUIET_LOGGERS = ("duplexcadence.serve", "uvicorn.error", "asyncio")


def quiet_repeats() -> None:
    """Put one `QuietRepeats` on the server's loggers (once per process)."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, QuietRepeats) for existing in logger.filters):
            logger.addFilter(QuietRepeats())


def server_config(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    loop: str = "auto",
    limits: ConnectionLimits | None = None,
) -> uvicorn.Config:
    """uvicorn's configuration for `app`: the lifespan on (the pool starts before the first connection),
    no per-message compression (tensors do not compress; it would cost CPU on every frame), `limits` (the
    header timeout, the connection limit). `loop`: uvicorn's event loop, "auto" (uvloop where it is
    installed), "asyncio" or "uvloop"."""
    limits = limits or ConnectionLimits()
    quiet_repeats()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        ws="auto",
        http=http_protocol(limits.header_timeout_s),
        loop=loop,
        ws_per_message_deflate=False,
        ws_max_size=MAX_FRAME_BYTES,
        limit_concurrency=connection_limit(limits.max_connections),
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn that drains its app's schedulers before it closes the connections (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float = ConnectionLimits.drain_timeout_s):
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM set `should_exit` (a second SIGINT forces the exit) while the server runs; once
        it has drained and stopped, the process goes on to stop its pool and exit 0 (uvicorn's own raises the
        signal again, which ends the process before the pool stops)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {number: signal.signal(number, self.handle_exit) for number in handled}
        try:
            yield
        finally:
            for number, handler in original.items():
                signal.signal(number, handler)

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connection while the sessions drain
        state = getattr(self.config.app, "state", None)
        schedulers = getattr(state, "schedulers", [])
        if schedulers and not self.force_exit:
            await asyncio.gather(*(scheduler.shut_down(self.drain_timeout_s) for scheduler in schedulers))
        await super().shutdown(sockets)


def run_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end on a new event loop: uvloop's where it is installed (as uvicorn's "auto"
    takes), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def start_problem(target: str, error: Exception) -> str | None:
    """A pool's start-up `error` as `dsl serve` words a command line it cannot serve: a `.clock` problem
    (ClockError) naming the file `target`, a lockstep the plan refuses or a bad tail option (ValueError).
    None: another error, a fault."""
    diagnostics = getattr(error, "diagnostics", None)
    if diagnostics:
        return messages.clock_problem(target, diagnostics[0].message)
    if isinstance(error, ValueError):
        return str(error)
    return None


async def serve_pool(
    pool: Any, server: uvicorn.Server, started: Callable[[uvicorn.Server], None] | None = None
) -> None:
    """Serve the started `pool` with `server` (its app made with `manage_pool=False`) until the server exits;
    `started(server)` once it listens. The pool is stopped at the end."""
    try:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and started is not None:
            started(server)
        await task
    finally:
        await pool.stop()


class ServerThread:
    """`app` served by uvicorn on 127.0.0.1 (a free port unless given) from a daemon thread.

    with ServerThread(make_app(pool)) as server:
        ... server.url("/v1/session") ...
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        loop: str = "auto",
        limits: ConnectionLimits | None = None,
    ):
        limits = limits or ConnectionLimits()
        self.server = DrainingServer(server_config(app, host, port, log_level, loop, limits), limits.drain_timeout_s)
        self.host = host
        self.thread = threading.Thread(target=self.server.run, name="duplexcadence-uvicorn", daemon=True)

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    def url(self, path: str = "", scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}{path}"

    def ws_url(self, path: str = "/v1/session") -> str:
        return self.url(path, "ws")

    def start(self, timeout: float = 600.0) -> ServerThread:
        """Start and wait until the app's start-up (the pool's load and calibration) is done."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server stopped during its start-up (see its log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout:g} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Ask uvicorn to exit (the app's shutdown stops the pool) and wait for the thread; TimeoutError when
        it is still running after `timeout` seconds (its sessions would go on being stepped)."""
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"the server thread did not stop within {timeout:g} s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
