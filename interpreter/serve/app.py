"""The network front: an ASGI app (Starlette) over one `SessionPool`.

    app = make_app(pool)      # starts the pool at start-up, stops it at shutdown
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: `GET /healthz`, `GET /v1/capacity` (the pool's `capacity()` as JSON), `GET /v1/sessions` (deadline
accounting per session), `GET /metrics` (Prometheus text), `WS /v1/session?seed=N`: one session per
websocket, and `WS /v1/bundle?sessions=N&seed=S`: N sessions as one bundle (`pool.Bundle`). The server
answers the accept with a JSON `ready` frame (or, when the pool refuses, a JSON `error` frame and close code
1013 with the reason); then every binary frame (`codec`) is one tick, answered in order
by a binary frame of its outputs or a JSON `error` frame; text frames are JSON controls (`reset`, `close`).
docs/serving.md describes the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused
from duplexcadence.interpreter.serve.bundle import BundleTickError
from duplexcadence.interpreter.serve.metrics import CONTENT_TYPE
from duplexcadence.interpreter.serve.scheduler import TickError

PROTOCOL = codec.VERSION
LOG = logging.getLogger("duplexcadence.serve")

CLOSE_CODES = {
    messages.CLIENT_CLOSED: messages.CLOSE_NORMAL,
    messages.IDLE_TIMEOUT: messages.CLOSE_IDLE,
    messages.SHUTTING_DOWN: messages.CLOSE_GOING_AWAY,
    messages.INTERNAL: messages.CLOSE_INTERNAL,
}


class ServingSession(Protocol):
    """What the front needs of a session: a `pool.PooledSession`, or a `bundle.Bundle`."""

    closed_event: asyncio.Event

    @property
    def close_code(self) -> str | None: ...

    @property
    def close_message(self) -> str | None: ...

    def info(self) -> dict: ...

    def submit_frame(self, data: bytes) -> asyncio.Future: ...

    def reset(self) -> asyncio.Future: ...

    async def close(self) -> None: ...

    def abort(self, code: str, message: str) -> None: ...

    def stats_json(self) -> dict: ...


class ServingPool(Protocol):
    """What the front needs of a pool (a `pool.SessionPool`)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def describe(self) -> str: ...

    async def open(self, seed: int = 0) -> Any: ...

    async def open_bundle(self, count: int, seed: int = 0) -> Any: ...

    def ready_fields(self) -> dict: ...

    async def health(self) -> tuple[int, dict]: ...

    async def capacity_json(self) -> dict: ...

    async def deadlines_json(self) -> dict: ...

    async def metrics_text(self) -> bytes: ...


def error_frame(code: str, message: str, tick: int | None = None, members: list[int] | None = None) -> dict:
    """An `error` frame; `members`: a bundle's members whose part of the tick did not run."""
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if tick is not None:
        frame["tick"] = tick
    if members is not None:
        frame["members"] = members
    return frame


def ready_frame(pool: ServingPool, session: ServingSession) -> dict:
    """The `ready` frame."""
    return {"type": "ready", "protocol": PROTOCOL, **session.info(), **pool.ready_fields()}


def make_app(pool: ServingPool, manage_pool: bool = True) -> Starlette:
    """The ASGI app of `pool`. With `manage_pool` the app's lifespan starts the pool (load, warm-up,
    calibration: the server accepts connections once it is ready) and stops it at shutdown; without, the
    caller does both."""

    async def healthz(request: Request) -> Response:
        status, health = await pool.health()
        return JSONResponse(health, status_code=status)

    async def capacity(request: Request) -> Response:
        return JSONResponse(await pool.capacity_json())

    async def sessions(request: Request) -> Response:
        return JSONResponse(await pool.deadlines_json())

    async def metrics(request: Request) -> Response:
        return Response(await pool.metrics_text(), media_type=CONTENT_TYPE)

    async def session_socket(websocket: WebSocket) -> None:
        await SocketSession(pool, websocket).run()

    async def bundle_socket(websocket: WebSocket) -> None:
        await SocketSession(pool, websocket, bundle=True).run()

    routes = [
        Route("/healthz", healthz),
        Route("/v1/capacity", capacity),
        Route("/v1/sessions", sessions),
        Route("/metrics", metrics),
        WebSocketRoute("/v1/session", session_socket),
        WebSocketRoute("/v1/bundle", bundle_socket),
    ]
    app = Starlette(routes=routes, lifespan=lifespan_of(pool, manage_pool))
    app.state.pool = pool
    return app


def lifespan_of(pool: Any, manage_pool: bool) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """An app's lifespan over `pool` (a tail's or a conversation pool): with `manage_pool` it starts the pool and
    logs its start-up lines before the server accepts connections, and stops it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_pool:
            await pool.start()
            LOG.info("%s", pool.describe())
        try:
            yield
        finally:
            if manage_pool:
                await pool.stop()

    return lifespan


async def pump(
    closed: asyncio.Event,
    receive: Callable[[], Coroutine[Any, Any, None]],
    send: Callable[[], Coroutine[Any, Any, None]],
    answers: asyncio.Queue,
) -> None:
    """A websocket's receiver and sender, until its client (session, conversation) is `closed`: then the receiver
    stops and the sender answers what is queued in `answers` (a None ends it)."""
    receiver = asyncio.create_task(receive())
    sender = asyncio.create_task(send())
    try:
        await closed.wait()
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
        await answers.put(None)
        await sender


def drain_quietly(answers: asyncio.Queue) -> None:
    """The answers left once the socket is gone: nobody will send them, but their futures' errors are retrieved
    (an entry is a tuple whose second item may be a future)."""
    while not answers.empty():
        entry = answers.get_nowait()
        if entry is not None and isinstance(entry[1], asyncio.Future):
            entry[1].add_done_callback(lambda future: future.cancelled() or future.exception())


class SocketSession:
    """One websocket's session: a receiver queues each frame's tick or control, a sender answers them in
    order; when the pool closes the session (asked to, idle, shutting down) the socket closes after the
    answers. With `bundle`, the websocket's session is a bundle of the query's `sessions` (`pool.Bundle`)."""

    def __init__(self, pool: ServingPool, websocket: WebSocket, bundle: bool = False):
        self.pool = pool
        self.websocket = websocket
        self.bundle = bundle
        self.answers: asyncio.Queue = asyncio.Queue()
        self.session: ServingSession | None = None
        self.frames = 0

    async def run(self) -> None:
        websocket = self.websocket
        await websocket.accept()
        seed_text = websocket.query_params.get("seed", "0")
        try:
            seed = int(seed_text)
        except ValueError:
            await self._refuse(messages.BAD_CONTROL, messages.bad_seed(seed_text), messages.CLOSE_POLICY)
            return
        count = 0
        if self.bundle:
            count_text = websocket.query_params.get("sessions", "")
            try:
                count = int(count_text)
            except ValueError:
                count = 0
            if count < 1:
                await self._refuse(messages.BAD_CONTROL, messages.bad_bundle_size(count_text), messages.CLOSE_POLICY)
                return
        try:
            session = await (self.pool.open_bundle(count, seed) if self.bundle else self.pool.open(seed))
        except AdmissionRefused as refusal:
            await self._refuse(refusal.reason, refusal.message, messages.CLOSE_TRY_AGAIN_LATER)
            return
        except Exception as error:  # a fault of the pool (a bug): say so, never a silent drop
            LOG.exception("opening a session failed")
            await self._refuse(messages.INTERNAL, messages.internal(error), messages.CLOSE_INTERNAL)
            return
        self.session = session
        try:
            await websocket.send_json(ready_frame(self.pool, session))
        except (WebSocketDisconnect, RuntimeError, OSError):
            session.abort(messages.DISCONNECTED, messages.disconnected())
            return
        await pump(session.closed_event, self._receive, self._send, self.answers)
        await self._close(session)

    async def _refuse(self, code: str, message: str, close_code: int) -> None:
        """Send the error frame and close."""
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.websocket.send_json(error_frame(code, message))
            await self.websocket.close(close_code, messages.close_reason(message))

    async def _receive(self) -> None:
        session = self.session
        assert session is not None
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    session.abort(messages.DISCONNECTED, messages.disconnected())
                    return
                if message.get("bytes") is not None:
                    self._tick(message["bytes"])
                elif message.get("text") is not None and self._control(message["text"]) == "close":
                    return
        except (WebSocketDisconnect, RuntimeError, OSError):
            session.abort(messages.DISCONNECTED, messages.disconnected())
        except Exception as error:  # a fault of the server: never a silent hang
            LOG.exception("websocket receive failed")
            session.abort(messages.INTERNAL, messages.internal(error))

    def _tick(self, data: bytes) -> None:
        session = self.session
        assert session is not None
        tick = self.frames
        self.frames += 1
        try:
            future = session.submit_frame(data)
        except (codec.FrameError, TickError) as error:
            self.answers.put_nowait(("error", error_frame(error.code, error.message, tick)))
            return
        self.answers.put_nowait(("tick", future, tick))

    def _control(self, text: str) -> str | None:
        session = self.session
        assert session is not None
        try:
            control = json.loads(text)
        except ValueError:
            control = None
        kind = control.get("type") if isinstance(control, dict) else None
        if kind == "reset":
            try:
                self.answers.put_nowait(("reset", session.reset()))
            except TickError as error:
                self.answers.put_nowait(("error", error_frame(error.code, error.message)))
            return kind
        if kind == "close":
            self.answers.put_nowait(("closing", asyncio.ensure_future(session.close())))
            return kind
        problem = "the text frame is not JSON" if control is None and kind is None else f"unknown control {text[:80]!r}"
        if isinstance(control, dict) and kind is not None:
            problem = f"unknown control type {kind!r}"
        self.answers.put_nowait(("error", error_frame(messages.BAD_CONTROL, messages.bad_control(problem))))
        return None

    async def _send(self) -> None:
        """Answer the queued frames in order; after the socket is gone, only wait for them."""
        while True:
            entry = await self.answers.get()
            if entry is None:
                return
            kind = entry[0]
            try:
                if kind == "error":
                    await self.websocket.send_json(entry[1])
                elif kind == "tick":
                    try:
                        outputs = await entry[1]
                    except TickError as error:
                        if error.code in (messages.CLIENT_CLOSED, messages.DISCONNECTED):
                            continue
                        members = error.members if isinstance(error, BundleTickError) else None
                        await self.websocket.send_json(error_frame(error.code, error.message, entry[2], members))
                        continue
                    await self.websocket.send_bytes(codec.encode(outputs))
                elif kind == "reset":
                    try:
                        await entry[1]
                    except TickError as error:
                        await self.websocket.send_json(error_frame(error.code, error.message))
                        continue
                    await self.websocket.send_json({"type": "reset"})
                elif kind == "closing":
                    await entry[1]
            except (WebSocketDisconnect, RuntimeError, OSError):
                if self.session is not None:
                    self.session.abort(messages.DISCONNECTED, messages.disconnected())
                drain_quietly(self.answers)
                return

    async def _close(self, session: ServingSession) -> None:
        websocket = self.websocket
        if websocket.client_state != WebSocketState.CONNECTED or session.close_code == messages.DISCONNECTED:
            return
        code = session.close_code or messages.CLIENT_CLOSED
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            if code == messages.CLIENT_CLOSED:
                await websocket.send_json({"type": "closed", **session.stats_json()})
                await websocket.close(messages.CLOSE_NORMAL)
            else:
                message = session.close_message or code
                await websocket.send_json(error_frame(code, message))
                await websocket.close(CLOSE_CODES.get(code, messages.CLOSE_INTERNAL), messages.close_reason(message))
