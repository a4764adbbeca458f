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
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Protocol

import attrs
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.access import AccessMiddleware, AccessPolicy
from duplexcadence.interpreter.serve.admission import AdmissionRefused
from duplexcadence.interpreter.serve.bundle import BundleTickError
from duplexcadence.interpreter.serve.metrics import CONTENT_TYPE
from duplexcadence.interpreter.serve.scheduler import TickError

PROTOCOL = codec.VERSION
LOG = logging.getLogger("duplexcadence.serve")

SEED_LIMIT = 2**64
"""Seeds are whole numbers from 0 to 2^64 - 1 (a torch generator's)."""

CLOSE_CODES = {
    messages.CLIENT_CLOSED: messages.CLOSE_NORMAL,
    messages.IDLE_TIMEOUT: messages.CLOSE_IDLE,
    messages.UNREAD_ANSWERS: messages.CLOSE_UNREAD_ANSWERS,
    messages.TOO_SLOW: messages.CLOSE_TOO_SLOW,
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

    def max_frame_bytes(self, sessions: int) -> int: ...

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


def make_app(
    pool: ServingPool,
    manage_pool: bool = True,
    limits: FrontLimits | None = None,
    access: AccessPolicy | None = None,
) -> Starlette:
    """The ASGI app of `pool`. With `manage_pool` the app's lifespan starts the pool (load, warm-up,
    calibration: the server accepts connections once it is ready) and stops it at shutdown; without, the
    caller does both. `limits`: what one websocket may hold (`FrontLimits()` unless given). `access`: who may
    use it, checked before every route, a route added later included (`AccessPolicy()` unless given: no key,
    every host, cross-site browsers refused)."""
    limits = limits or FrontLimits()

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
        await SocketSession(pool, websocket, limits).run()

    async def bundle_socket(websocket: WebSocket) -> None:
        await SocketSession(pool, websocket, limits, bundle=True).run()

    routes = [
        Route("/healthz", healthz),
        Route("/v1/capacity", capacity),
        Route("/v1/sessions", sessions),
        Route("/metrics", metrics),
        WebSocketRoute("/v1/session", session_socket),
        WebSocketRoute("/v1/bundle", bundle_socket),
    ]
    middleware = [Middleware(AccessMiddleware, policy=access or AccessPolicy())]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.pool = pool
    app.state.schedulers = [pool]  # drained by the server on SIGTERM (server.DrainingServer); a route of
    # another scheduler adds its own
    return app


@attrs.frozen
class FrontLimits:
    """What one websocket may hold of the server: `answers_waiting` answers queued to be sent (past them the
    server stops reading the socket, so TCP holds the client back); `answer_timeout_s`, how long one answer may
    wait to be written before the session is closed (`unread-answers`, close 4429: a client that does not read
    its answers); `control_bytes`, the longest text frame read as a control."""

    answers_waiting: int = 32
    answer_timeout_s: float = 5.0
    control_bytes: int = 4096
    frames_per_tick: float = 2.0
    """With a pool that paces its sessions (`pace` ticks a period), a websocket's frames are read at most
    `frames_per_tick` x `pace` a tick period on average, after a burst of `answers_waiting`: a client that
    floods frames (valid or not) is held back by TCP instead of costing the event loop a decode each."""


class SocketSession:
    """One websocket's session: a receiver queues each frame's tick or control, a sender answers them in
    order; when the pool closes the session (asked to, idle, shutting down) the socket closes after the
    answers. With `bundle`, the websocket's session is a bundle of the query's `sessions` (`bundle.Bundle`).

    A fault in one frame's handling (a bug) answers that frame with an `internal` error frame, logged; the
    session goes on. The answers waiting to be sent are bounded (`FrontLimits`)."""

    def __init__(self, pool: ServingPool, websocket: WebSocket, limits: FrontLimits, bundle: bool = False):
        self.pool = pool
        self.websocket = websocket
        self.limits = limits
        self.bundle = bundle
        self.answers: asyncio.Queue = asyncio.Queue(limits.answers_waiting)
        self.session: ServingSession | None = None
        self.frames = 0
        self.frame_limit = 0
        self.unread = False
        self.read_interval_s = 0.0
        self.read_due = 0.0

    async def run(self) -> None:
        websocket = self.websocket
        await websocket.accept()
        seed_text = websocket.query_params.get("seed", "0")
        seed = whole_number(seed_text, 0, SEED_LIMIT)
        if seed is None:
            await self._refuse(messages.BAD_CONTROL, messages.bad_seed(seed_text, SEED_LIMIT), messages.CLOSE_POLICY)
            return
        count = 1
        if self.bundle:
            count_text = websocket.query_params.get("sessions", "")
            count = whole_number(count_text, 1, None) or 0
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
        self.frame_limit = self.pool.max_frame_bytes(count)
        fields = self.pool.ready_fields()
        if fields.get("pace"):
            self.read_interval_s = fields["tick_period_s"] / (fields["pace"] * self.limits.frames_per_tick)
        try:
            await websocket.send_json(ready_frame(self.pool, session))
        except (WebSocketDisconnect, RuntimeError, OSError):
            session.abort(messages.DISCONNECTED, messages.disconnected())
            return
        await serve_until_closed(session.closed_event, self._receive(), self._send(), self.answers)
        await self._close(session)

    async def _refuse(self, code: str, message: str, close_code: int) -> None:
        """Send the error frame and close."""
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.websocket.send_json(error_frame(code, message))
            await self.websocket.close(close_code, messages.close_reason(message))

    async def _receive(self) -> None:
        session = self.session
        assert session is not None
        while True:
            await self._read_at_pace()
            try:
                message = await self.websocket.receive()
            except (WebSocketDisconnect, RuntimeError, OSError):
                session.abort(messages.DISCONNECTED, messages.disconnected())
                return
            if message["type"] == "websocket.disconnect":
                session.abort(messages.DISCONNECTED, messages.disconnected())
                return
            try:
                if message.get("bytes") is not None:
                    entry = self._tick(message["bytes"])
                elif message.get("text") is not None:
                    entry = self._control(message["text"])
                else:
                    continue
            except Exception as error:  # a fault of the server in this frame: it fails, the session goes on
                LOG.exception("a frame of session %s failed", getattr(session, "id", "?"))
                entry = ("error", error_frame(messages.INTERNAL, messages.internal(error)))
            await self.answers.put(entry)  # while `answers_waiting` answers wait, the socket is not read
            if entry[0] == "closing":
                return

    async def _read_at_pace(self) -> None:
        """Wait, if the client is ahead of its frame pace (a generic cell-rate rule), before the next read."""
        if not self.read_interval_s:
            return
        now = time.monotonic()
        early = self.read_due - (self.limits.answers_waiting - 1) * self.read_interval_s - now
        if early > 0:
            await asyncio.sleep(early)
            now += early
        self.read_due = max(self.read_due, now) + self.read_interval_s

    def _tick(self, data: bytes) -> tuple:
        session = self.session
        assert session is not None
        tick = self.frames
        self.frames += 1
        if len(data) > self.frame_limit:
            message = messages.frame_too_large(len(data), self.frame_limit)
            return ("error", error_frame(messages.FRAME_TOO_LARGE, message, tick))
        try:
            future = session.submit_frame(data)
        except (codec.FrameError, TickError) as error:
            return ("error", error_frame(error.code, error.message, tick))
        return ("tick", future, tick)

    def _control(self, text: str) -> tuple:
        session = self.session
        assert session is not None
        control: Any = None
        if len(text) > self.limits.control_bytes:
            problem = f"a text frame of {len(text)} characters (a control is at most {self.limits.control_bytes})"
        else:
            try:
                control = json.loads(text)
            except (ValueError, RecursionError):
                control = None
            kind = control.get("type") if isinstance(control, dict) else None
            if kind == "reset":
                try:
                    return ("reset", session.reset())
                except TickError as error:
                    return ("error", error_frame(error.code, error.message))
            if kind == "close":
                return ("closing", asyncio.ensure_future(session.close()))
            if isinstance(control, dict) and kind is not None:
                problem = f"unknown control type {str(kind)[:80]!r}"
            elif control is None:
                problem = "the text frame is not JSON"
            else:
                problem = f"unknown control {text[:80]!r}"
        return ("error", error_frame(messages.BAD_CONTROL, messages.bad_control(problem)))

    async def _send(self) -> None:
        """Answer the queued frames in order; after the socket is gone, only wait for them. An answer not
        written within `answer_timeout_s` closes the session (`unread-answers`)."""
        while True:
            entry = await self.answers.get()
            if entry is None:
                return
            try:
                for frame in await self._answer(entry):
                    await asyncio.wait_for(self._write(frame), self.limits.answer_timeout_s)
            except TimeoutError:
                self.unread = True
                if self.session is not None:
                    timeout = self.limits.answer_timeout_s
                    self.session.abort(messages.UNREAD_ANSWERS, messages.unread_answers(timeout))
                drop_answers(self.answers)
                return
            except (WebSocketDisconnect, RuntimeError, OSError):
                if self.session is not None:
                    self.session.abort(messages.DISCONNECTED, messages.disconnected())
                drop_answers(self.answers)
                return

    async def _answer(self, entry: tuple) -> list[dict | bytes]:
        """The frames that answer `entry` once it is done: one, or none; a bundle's tick that failed for some
        members only, its error frame (`"outputs": true`) and then the others' outputs."""
        kind = entry[0]
        if kind == "error":
            return [entry[1]]
        if kind == "closing":
            await entry[1]
            return []
        try:
            outputs = await entry[1]
        except TickError as error:
            if kind == "tick" and error.code in (messages.CLIENT_CLOSED, messages.DISCONNECTED):
                return []
            members = error.members if isinstance(error, BundleTickError) else None
            frame = error_frame(error.code, error.message, entry[2] if kind == "tick" else None, members)
            partial = error.outputs if isinstance(error, BundleTickError) else None
            if partial is None:
                return [frame]
            return [{**frame, "outputs": True}, codec.encode(partial)]
        if kind == "reset":
            return [{"type": "reset"}]
        return [codec.encode(outputs)]

    async def _write(self, frame: dict | bytes) -> None:
        if isinstance(frame, bytes):
            await self.websocket.send_bytes(frame)
        else:
            await self.websocket.send_json(frame)

    async def _close(self, session: ServingSession) -> None:
        websocket = self.websocket
        if websocket.client_state != WebSocketState.CONNECTED or session.close_code == messages.DISCONNECTED:
            return
        code = session.close_code or messages.CLIENT_CLOSED
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            async with asyncio.timeout(self.limits.answer_timeout_s):
                if code == messages.CLIENT_CLOSED:
                    await websocket.send_json({"type": "closed", **session.stats_json()})
                    await websocket.close(messages.CLOSE_NORMAL)
                    return
                message = session.close_message or code
                if not self.unread:
                    await websocket.send_json(error_frame(code, message))
                close_code = CLOSE_CODES.get(code, messages.CLOSE_INTERNAL)
                await websocket.close(close_code, messages.close_reason(message))


async def serve_until_closed(
    closed: asyncio.Event, receive: Coroutine[Any, Any, None], send: Coroutine[Any, Any, None], answers: asyncio.Queue
) -> None:
    """Run a socket's reader and writer until its session closes; then stop reading and let the writer send
    (or give up on) the answers queued before."""
    receiver = asyncio.create_task(receive)
    sender = asyncio.create_task(send)
    try:
        await closed.wait()
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
        await answers.put(None)  # the writer's last entry
        await sender


def drop_answers(answers: asyncio.Queue) -> None:
    """Empty a socket's queue of answers that will not be sent, retrieving their futures' errors."""
    while not answers.empty():
        entry = answers.get_nowait()
        if entry is not None and isinstance(entry[1], asyncio.Future):
            entry[1].add_done_callback(lambda future: future.cancelled() or future.exception())


def whole_number(text: str, least: int, limit: int | None) -> int | None:
    """`text` as a whole number from `least` to below `limit` (None: no limit); None when it is not one."""
    try:
        value = int(text)
    except ValueError:
        return None
    if value < least or (limit is not None and value >= limit):
        return None
    return value
