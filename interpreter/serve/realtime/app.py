"""The conversation server: an ASGI app (Starlette) over one `ConversationPool`.

    app = make_conversation_app(pool)    # starts the pool at start-up, stops it at shutdown

Routes: `GET /` (the page: talk to the model from a browser), `WS /v1/realtime?model=NAME&seed=N` (one conversation
per websocket, the events of `events.py`), `GET /healthz`, `GET /v1/capacity`, `GET /v1/conversations` (deadline
accounting per conversation), `GET /metrics`. docs/serving.md describes the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from duplexcadence.interpreter.engine.api import UnitOutput
from duplexcadence.interpreter.serve import messages as serve_messages
from duplexcadence.interpreter.serve.access import AccessMiddleware, AccessPolicy
from duplexcadence.interpreter.serve.admission import AdmissionRefused
from duplexcadence.interpreter.serve.app import FrontLimits, drop_answers, serve_until_closed
from duplexcadence.interpreter.serve.conversations import ConversationPool, PooledConversation
from duplexcadence.interpreter.serve.metrics import CONTENT_TYPE
from duplexcadence.interpreter.serve.realtime import messages
from duplexcadence.interpreter.serve.realtime.conversation import (
    Action,
    Configure,
    RealtimeConversation,
    Room,
    Send,
    Served,
    Unit,
)
from duplexcadence.interpreter.serve.realtime.events import EventError
from duplexcadence.interpreter.serve.scheduler import RESET, TICK, TickError

LOG = logging.getLogger("duplexcadence.serve.realtime")
PATH = "/v1/realtime"
EVENT_BYTES = 4 * 2**20
"""The longest client event read by default: an append of 3 MiB of PCM16 in base64, about 98 s of 16 kHz audio
or 33 s of 48 kHz; a longer text frame is refused."""
ADMISSION_NUMBERS = ("sessions", "capacity", "slots", "predicted_tick_s", "tick_period_s", "headroom")
"""The numbers of an admission refusal, in its `error.duplexcadence`."""

CLOSE_CODES = {
    serve_messages.IDLE_TIMEOUT: serve_messages.CLOSE_IDLE,
    serve_messages.UNREAD_ANSWERS: serve_messages.CLOSE_UNREAD_ANSWERS,
    serve_messages.SHUTTING_DOWN: serve_messages.CLOSE_GOING_AWAY,
    serve_messages.INTERNAL: serve_messages.CLOSE_INTERNAL,
}


def page() -> str:
    """The page served at `/` (page.html beside this module)."""
    return importlib.resources.files(__package__).joinpath("page.html").read_text()


def served(pool: ConversationPool) -> Served:
    engine = pool.engine
    assert engine is not None, "start() the pool first"
    return Served(
        pool.name, engine.input_rate, engine.output_rate, engine.unit_samples, pool.cadence_s, pool.config.queue_depth
    )


def make_conversation_app(
    pool: ConversationPool,
    manage_pool: bool = True,
    limits: FrontLimits | None = None,
    access: AccessPolicy | None = None,
    event_bytes: int = EVENT_BYTES,
) -> Starlette:
    """The ASGI app of `pool`; with `manage_pool` its lifespan starts the pool (the server accepts connections
    once the engine is built) and stops it at shutdown. `limits`: what one websocket may hold (`FrontLimits`:
    answers waiting, how long one may wait to be written; its `control_bytes`, a tail's, is not used here).
    `event_bytes`: the longest client event read. `access`: who may use it (`access.AccessPolicy`, checked
    before every route as for a tail's app; the page at `/` too, unless it is one of the policy's open
    routes)."""
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

    async def index(request: Request) -> Response:
        return HTMLResponse(page())

    async def healthz(request: Request) -> Response:
        if not pool.started or pool.stopping:
            return JSONResponse({"status": "stopping" if pool.stopping else "starting"}, status_code=503)
        return JSONResponse({"status": "ok", "model": pool.name, "conversations": len(pool.sessions)})

    async def capacity(request: Request) -> Response:
        return JSONResponse(pool.capacity_json())

    async def conversations(request: Request) -> Response:
        return JSONResponse(pool.deadlines().to_json())

    async def metrics(request: Request) -> Response:
        return Response(pool.exposition(), media_type=CONTENT_TYPE)

    async def realtime(websocket: WebSocket) -> None:
        await RealtimeSocket(pool, websocket, limits, event_bytes).run()

    routes = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/v1/capacity", capacity),
        Route("/v1/conversations", conversations),
        Route("/metrics", metrics),
        WebSocketRoute(PATH, realtime),
    ]
    middleware = [Middleware(AccessMiddleware, policy=access or AccessPolicy())]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.pool = pool
    app.state.schedulers = [pool]  # drained by the server on SIGTERM (server.DrainingServer)
    return app


class RealtimeSocket:
    """One websocket's conversation: a receiver turns each event into units, resets and answers, queued in
    order; a sender awaits each and sends its events. Refused events are answered with an `error` event and
    change nothing."""

    def __init__(
        self, pool: ConversationPool, websocket: WebSocket, limits: FrontLimits, event_bytes: int = EVENT_BYTES
    ):
        self.pool = pool
        self.websocket = websocket
        self.limits = limits
        self.event_bytes = event_bytes
        self.answers: asyncio.Queue = asyncio.Queue(limits.answers_waiting)
        self.unread = False
        self.pooled: PooledConversation | None = None
        self.protocol: RealtimeConversation | None = None

    async def run(self) -> None:
        websocket = self.websocket
        await websocket.accept()
        refusal = self._query_problem()
        if refusal is not None:
            await self._refuse(refusal, serve_messages.CLOSE_POLICY)
            return
        seed = int(websocket.query_params.get("seed", "0"))
        try:
            pooled = await self.pool.open(seed)
        except AdmissionRefused as refused:
            error = EventError(refused.reason, refused.message, kind=messages.ADMISSION)
            numbers = {name: getattr(refused, name) for name in ADMISSION_NUMBERS}
            await self._refuse(error, serve_messages.CLOSE_TRY_AGAIN_LATER, numbers)
            return
        self.pooled = pooled
        protocol = self.protocol = RealtimeConversation(served(self.pool), pooled.id, seed)
        try:
            await websocket.send_json(protocol.created())
        except (WebSocketDisconnect, RuntimeError, OSError):
            pooled.abort(serve_messages.DISCONNECTED, serve_messages.disconnected())
            return
        await serve_until_closed(pooled.closed_event, self._receive(), self._send(), self.answers)
        await self._close(pooled)

    def _query_problem(self) -> EventError | None:
        query = self.websocket.query_params
        model = query.get("model")
        if model is not None and model != self.pool.name:
            return EventError(messages.MODEL_NOT_SERVED, messages.model_not_served(model, self.pool.name), "model")
        seed = query.get("seed", "0")
        try:
            int(seed)
        except ValueError:
            return EventError(messages.BAD_SEED, messages.bad_seed(seed), "seed")
        return None

    async def _refuse(self, error: EventError, close_code: int, numbers: dict[str, Any] | None = None) -> None:
        event = RealtimeConversation.refusal(error, numbers)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.websocket.send_json(event)
            await self.websocket.close(close_code, serve_messages.close_reason(error.message))

    async def _receive(self) -> None:
        pooled, protocol = self.pooled, self.protocol
        assert pooled is not None and protocol is not None
        while True:
            try:
                message = await self.websocket.receive()
            except (WebSocketDisconnect, RuntimeError, OSError):
                pooled.abort(serve_messages.DISCONNECTED, serve_messages.disconnected())
                return
            if message["type"] == "websocket.disconnect":
                pooled.abort(serve_messages.DISCONNECTED, serve_messages.disconnected())
                return
            received_at = time.perf_counter()
            try:
                actions = self._actions(message)
                entries = [self._entry(action, received_at) for action in actions]
            except Exception as error:  # a fault of the server in this event: it fails, the conversation goes on
                LOG.exception("an event of conversation %s failed", pooled.id)
                failure = EventError(
                    serve_messages.INTERNAL, serve_messages.internal(error), kind=messages.SERVER_ERROR
                )
                entries = [("events", [protocol.events.error(failure)])]
            for entry in entries:
                await self.answers.put(entry)  # while `answers_waiting` answers wait, the socket is not read

    def _actions(self, message: Mapping[str, Any]) -> list[Action]:
        protocol, pooled = self.protocol, self.pooled
        assert protocol is not None and pooled is not None
        text = message.get("text")
        if text is None:
            return protocol.binary(len(message.get("bytes") or b""))
        if len(text) > self.event_bytes:
            return protocol.too_large(len(text), self.event_bytes)
        depth = self.pool.config.queue_depth
        # As the pool's own checks count them (`Client.queue_tick`, `Client.reset`).
        return protocol.receive(text, Room(depth - pooled.queued(TICK), depth - pooled.queued(RESET)))

    def _entry(self, action: Action, received_at: float) -> tuple:
        pooled = self.pooled
        assert pooled is not None
        if isinstance(action, Send):
            return ("events", [action.event])
        if isinstance(action, Configure):
            return ("configure", action.config)
        try:
            if isinstance(action, Unit):
                return ("unit", pooled.submit(action.input), action.number, received_at)
            return ("reset", pooled.reset())
        except TickError as error:
            return ("failed", error, getattr(action, "number", None))

    async def _send(self) -> None:
        """Send the queued answers in order; after the socket is gone, only wait for them. An answer not written
        within `answer_timeout_s` closes the conversation (`unread-answers`)."""
        protocol = self.protocol
        assert protocol is not None
        while True:
            entry = await self.answers.get()
            if entry is None:
                return
            try:
                for event in await self._events(protocol, entry):
                    await asyncio.wait_for(self.websocket.send_json(event), self.limits.answer_timeout_s)
            except TimeoutError:
                self.unread = True
                self._abort(serve_messages.UNREAD_ANSWERS, serve_messages.unread_answers(self.limits.answer_timeout_s))
                return
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._abort(serve_messages.DISCONNECTED, serve_messages.disconnected())
                return
            except Exception as error:  # a fault of the server: the conversation closes, saying so
                LOG.exception("answering a conversation's event failed")
                self._abort(serve_messages.INTERNAL, serve_messages.internal(error))
                return

    def _abort(self, code: str, message: str) -> None:
        """Close the conversation now; the answers left are not sent (their futures' errors retrieved)."""
        if self.pooled is not None:
            self.pooled.abort(code, message)
        drop_answers(self.answers)

    async def _events(self, protocol: RealtimeConversation, entry: tuple) -> list[dict[str, Any]]:
        kind = entry[0]
        if kind == "events":
            return entry[1]
        if kind == "configure":
            return protocol.configure(entry[1])
        if kind == "failed":
            error, number = entry[1], entry[2]
            if error.code == serve_messages.QUEUE_FULL:
                return [protocol.events.error(EventError(messages.QUEUE_FULL, error.message))]
            return protocol.unit_failed(number if number is not None else protocol.units, error.message)
        try:
            result = await entry[1]
        except TickError as error:
            if error.code in (serve_messages.CLIENT_CLOSED, serve_messages.DISCONNECTED):
                return []
            if kind == "unit" and error.code == serve_messages.BAD_INPUT:
                return protocol.unit_refused(entry[2], error.message)
            if kind == "unit":
                return protocol.unit_failed(entry[2], error.message)
            return [protocol.events.error(EventError(error.code, error.message, kind=messages.SERVER_ERROR))]
        if kind == "reset":
            return protocol.was_reset()
        assert isinstance(result, UnitOutput)
        return protocol.answer(entry[2], result, time.perf_counter() - entry[3])

    async def _close(self, pooled: PooledConversation) -> None:
        websocket = self.websocket
        if websocket.client_state != WebSocketState.CONNECTED or pooled.close_code == serve_messages.DISCONNECTED:
            return
        code = pooled.close_code or serve_messages.CLIENT_CLOSED
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            async with asyncio.timeout(self.limits.answer_timeout_s):
                if code == serve_messages.CLIENT_CLOSED:
                    await websocket.close(serve_messages.CLOSE_NORMAL)
                    return
                message = pooled.close_message or code
                if not self.unread:
                    assert self.protocol is not None
                    error = EventError(code, message, kind=messages.SERVER_ERROR)
                    await websocket.send_json(self.protocol.events.error(error))
                close_code = CLOSE_CODES.get(code, serve_messages.CLOSE_INTERNAL)
                await websocket.close(close_code, serve_messages.close_reason(message))
