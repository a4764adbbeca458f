"""uvicorn around the app: the configuration `dsl serve` runs, how it starts its pool and serves it, and a server
on a thread of its own (its own event loop) for tests and benchmarks that drive it from the same process."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvicorn

from duplexcadence.interpreter.serve import messages

T = TypeVar("T")

MAX_FRAME_BYTES = 64 * 2**20
"""The largest websocket message the server reads (a tick's tensors)."""


def server_config(
    app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", loop: str = "auto"
) -> uvicorn.Config:
    """uvicorn's configuration for `app`: the lifespan on (the pool starts before the first connection),
    no per-message compression (tensors do not compress; it would cost CPU on every frame). `loop`: uvicorn's
    event loop, "auto" (uvloop where it is installed), "asyncio" or "uvloop"."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        ws="auto",
        loop=loop,
        ws_per_message_deflate=False,
        ws_max_size=MAX_FRAME_BYTES,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
    )


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
        self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", loop: str = "auto"
    ):
        self.server = uvicorn.Server(server_config(app, host, port, log_level, loop))
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
