"""A Python client of the server (the `websockets` library, asyncio): one `SessionClient` per session.

    async with await SessionClient.connect("ws://127.0.0.1:8000/v1/session", seed=3) as client:
        print(client.ready["inputs"])                 # names, dtypes, shapes of a tick
        pcm = (await client.step(codes=codes))["pcm"]  # one tick: its outputs by name
        await client.reset()                          # barge-in

`send` and `receive` pipeline ticks (the server answers in order). An error frame raises `ServerError` (its
code and message); a refused session raises `Refused` from `connect` (the reason, with the numbers). Through a
cluster (`interpreter/serve/cluster`), `replica` names the replica that holds the session (the accept's
`x-duplexcadence-replica` header), and a session whose replica stops raises `ReplicaLost` naming it.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

import torch
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.access import API_KEY_ENV

MAX_FRAME_BYTES = 64 * 2**20
CLOSING_FRAMES = 256
"""The most frames read after a closing error while waiting for the close (the answers still queued)."""


class ServerError(Exception):
    """An error frame: `code` (docs/serving.md), `message`, the tick it answers (None for a control), and for
    a bundle the members whose part of it did not run (None for a session) and the tick's outputs when the
    other members stepped it (their rows; the failed members' rows zeros), else None."""

    def __init__(
        self,
        code: str,
        message: str,
        tick: int | None = None,
        members: list[int] | None = None,
        outputs: dict[str, torch.Tensor] | None = None,
    ):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.tick = tick
        self.members = members
        self.outputs = outputs


class Refused(ServerError):
    """The server did not open the session (at capacity, draining...): its error frame and close code."""

    def __init__(self, code: str, message: str, close_code: int | None):
        super().__init__(code, message)
        self.close_code = close_code


class SessionClosedByServer(ServerError):
    """The server closed the session (idle timeout, shutdown): the close code and reason."""

    def __init__(self, code: str, message: str, close_code: int | None):
        super().__init__(code, message)
        self.close_code = close_code


class ReplicaLost(SessionClosedByServer):
    """The replica holding the session stopped (it died, or was replaced after a failed health check): the
    session's state is lost with it, and nothing re-opens it elsewhere. `replica` names it; `close_code` is
    1014 from the Serve proxy, or None when the connection ended without a close frame."""

    def __init__(self, message: str, close_code: int | None, replica: str | None):
        super().__init__(messages.REPLICA_LOST, message, close_code)
        self.replica = replica


def bundle_url(session_url: str, count: int) -> str:
    """The bundle route of the server whose session route is `session_url`, for `count` sessions:
    ws://HOST:PORT/v1/session -> ws://HOST:PORT/v1/bundle?sessions=COUNT."""
    parts = urllib.parse.urlsplit(session_url)
    path = parts.path.removesuffix("/v1/session") + "/v1/bundle"
    query = "&".join(filter(None, [parts.query, f"sessions={count}"]))
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, parts.fragment))


class SessionClient:
    """One session over one websocket (see the module docstring)."""

    def __init__(self, connection: ClientConnection, ready: dict):
        self.connection = connection
        self.ready = ready
        self.sent = 0
        response = connection.response
        self.replica: str | None = response.headers.get(messages.REPLICA_HEADER) if response is not None else None
        """The replica that holds the session (a cluster), None for a single server."""
        self.bundle: int | None = ready.get("bundle")
        """The sessions of a bundle (`/v1/bundle?sessions=N`), None for one session."""

    @classmethod
    async def connect(
        cls, url: str, seed: int = 0, open_timeout: float = 600.0, api_key: str | None = None
    ) -> SessionClient:
        """Open a session; `Refused` when the server does not admit it (its reason, with the numbers).
        `api_key`: the server's (`Authorization: Bearer`); None: `DUPLEXCADENCE_API_KEY`'s, if set."""
        separator = "&" if "?" in url else "?"
        key = api_key or os.environ.get(API_KEY_ENV)
        connection = await connect(
            f"{url}{separator}seed={seed}",
            additional_headers={"Authorization": f"Bearer {key}"} if key else None,
            compression=None,
            max_size=MAX_FRAME_BYTES,
            open_timeout=open_timeout,
            proxy=None,
            ping_interval=None,
        )
        try:
            first = json.loads(await connection.recv())
        except ConnectionClosed as closed:
            reason, code = (closed.rcvd.reason, closed.rcvd.code) if closed.rcvd else ("", None)
            raise Refused("closed", reason, code) from None
        if first.get("type") != "ready":
            close_code = None
            try:
                await connection.recv()
            except ConnectionClosed as closed:
                close_code = closed.rcvd.code if closed.rcvd else None
            raise Refused(first.get("code", "?"), first.get("message", ""), close_code)
        return cls(connection, first)

    @property
    def tick_period_s(self) -> float:
        return float(self.ready["tick_period_s"])

    async def send(self, tensors: Mapping[str, torch.Tensor] | None = None, last: bool = False, **named) -> int:
        """Send one tick (inputs by name); returns its index (error frames name it). SessionClosedByServer (or
        ReplicaLost) when the session is already closed."""
        data = codec.encode({**(tensors or {}), **named}, last)
        try:
            await self.connection.send(data)
        except ConnectionClosed as closed:
            raise self.closed_error(closed) from None
        self.sent += 1
        return self.sent - 1

    async def send_raw(self, data: bytes | str) -> None:
        """Send a frame as it is (tests of malformed frames)."""
        await self.connection.send(data)

    async def receive(self) -> Any:
        """The next answer: a tick's outputs by name (binary frame), or a control frame (a dict); ServerError
        for an error frame, SessionClosedByServer when the server closed the session."""
        try:
            message = await self.connection.recv()
        except ConnectionClosed as closed:
            raise self.closed_error(closed) from None
        if isinstance(message, bytes):
            return codec.decode(message).tensors
        frame = json.loads(message)
        if frame.get("type") == "error":
            code = frame.get("code")
            if code in ("idle-timeout", "shutting-down") or (code == "internal" and frame.get("tick") is None):
                # The session is closing: a tick sent meanwhile is refused with the closing code, then the
                # closing frame and the close follow.
                close_code = None
                try:
                    for _ in range(CLOSING_FRAMES):
                        following = await self.connection.recv()
                        closing = json.loads(following) if isinstance(following, str) else {}
                        if closing.get("type") == "error" and closing.get("tick") is None:
                            frame = closing
                except ConnectionClosed as closed:
                    close_code = closed.rcvd.code if closed.rcvd else None
                raise SessionClosedByServer(frame["code"], frame["message"], close_code)
            outputs = None
            if frame.get("outputs"):  # the other members' outputs follow
                try:
                    following = await self.connection.recv()
                except ConnectionClosed as closed:
                    raise self.closed_error(closed) from None
                outputs = codec.decode(following).tensors if isinstance(following, bytes) else None
            raise ServerError(frame["code"], frame["message"], frame.get("tick"), frame.get("members"), outputs)
        return frame

    def closed_error(self, closed: ConnectionClosed) -> SessionClosedByServer:
        """What a closed connection means for the session: `ReplicaLost` when the proxy says its replica stopped
        (1014) or, through a cluster, when the connection ended without a close frame."""
        code = closed.rcvd.code if closed.rcvd else None
        reason = closed.rcvd.reason if closed.rcvd else ""
        if code == messages.CLOSE_REPLICA_LOST:
            return ReplicaLost(reason or messages.replica_lost(self.replica), code, self.replica)
        if code is None and self.replica is not None:
            return ReplicaLost(messages.connection_lost(self.replica, code), code, self.replica)
        return SessionClosedByServer("closed", reason, code)

    async def step(self, tensors: Mapping[str, torch.Tensor] | None = None, last: bool = False, **named) -> dict:
        """One tick: send it, return its outputs by name (ServerError for its error frame)."""
        await self.send(tensors, last, **named)
        answer = await self.receive()
        if not isinstance(answer, dict) or answer.get("type") is not None:
            raise ServerError("protocol", f"expected the tick's outputs, got {answer!r}")
        return answer

    async def reset(self) -> None:
        """Barge-in: back to the start (after the ticks sent before it are answered: receive them first)."""
        await self.connection.send(json.dumps({"type": "reset"}))
        answer = await self.receive()
        if answer != {"type": "reset"}:
            raise ServerError("protocol", f"expected the reset's answer, got {answer!r}")

    async def close(self) -> dict:
        """Close the session (the server answers the ticks sent before); the `closed` frame's statistics."""
        await self.connection.send(json.dumps({"type": "close"}))
        closed: dict = {}
        while True:
            try:
                answer = await self.receive()
            except SessionClosedByServer:
                break
            if isinstance(answer, dict) and answer.get("type") == "closed":
                closed = answer
        await self.connection.close()
        return closed

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.connection.close()
