"""The Serve proxy's side of a lost replica: a session's websocket closes with a code and a reason.

A websocket through the Serve proxy is relayed to the replica that accepted it. When that replica dies, the
proxy's relay ends, and without this middleware the proxy drops the client's connection without a close frame
(code 1006, no reason). `ReplicaLossClose` wraps the proxy's ASGI app: a websocket the app accepted and ended
without a close frame of its own is closed with 1014 (bad gateway) and a reason that names the replica (read
from the `x-duplexcadence-replica` header of the replica's accept). It changes nothing else: HTTP requests,
websockets the replica or the client closed.

Ray Serve installs proxy middlewares from the import path in the environment variable
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH` of the proxy's process (`ray.serve._private.http_util`): the
cluster launcher sets it to `PROXY_CALLBACK` before it starts a local Ray; the nodes of an existing cluster
need it in their environment when `ray start` runs (docs/serving.md, "Across GPUs and nodes"). The module
imports neither torch nor the pool: it loads into every proxy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.middleware import Middleware

from duplexcadence.interpreter.serve import messages

PROXY_CALLBACK = "duplexcadence.interpreter.serve.cluster.proxy:middlewares"
PROXY_CALLBACK_VARIABLE = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def header_value(headers: Any, name: bytes) -> str | None:
    for key, value in headers or ():
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


class ReplicaLossClose:
    """ASGI middleware: a websocket accepted by a replica and left open when the relay ends is closed with
    `messages.CLOSE_REPLICA_LOST` and a reason naming the replica."""

    def __init__(self, app: Callable[[Message, Receive, Send], Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        replica: str | None = None
        accepted = closed = False

        async def relay_send(message: Message) -> None:
            nonlocal replica, accepted, closed
            if message["type"] == "websocket.accept":
                accepted = True
                replica = header_value(message.get("headers"), messages.REPLICA_HEADER.encode())
            elif message["type"] == "websocket.close":
                closed = True
            await send(message)

        async def relay_receive() -> Message:
            nonlocal closed
            message = await receive()
            if message["type"] == "websocket.disconnect":
                closed = True
            return message

        try:
            await self.app(scope, relay_receive, relay_send)
        finally:
            if accepted and not closed:
                reason = messages.close_reason(messages.replica_lost(replica))
                await send({"type": "websocket.close", "code": messages.CLOSE_REPLICA_LOST, "reason": reason})


def middlewares() -> list[Middleware]:
    """The proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`): the middlewares of every Serve proxy."""
    return [Middleware(ReplicaLossClose)]
