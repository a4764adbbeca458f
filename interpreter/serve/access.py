"""Who may use the server: an API key, an Origin allow-list and trusted hosts, checked by one ASGI middleware
before any route (`AccessMiddleware`), so a route added to the app later (`/v1/realtime`) is covered too.

* **API key** (`--api-key`, or the `DUPLEXCADENCE_API_KEY` variable, as vLLM reads `VLLM_API_KEY`): every
  route but the open ones (`/healthz`) needs `Authorization: Bearer KEY`; a browser, which cannot set headers
  on a websocket, may offer the subprotocol `openai-insecure-api-key.KEY` instead (OpenAI Realtime's
  convention; a route that chooses no subprotocol accepts with that one). A request without it is refused
  with 401.
* **Origin**: a request that carries an `Origin` header (a browser's) is refused with 403 unless the origin is
  the server's own (its host and port are the `Host` header's) or on the allow-list (`--allowed-origin`; `*`:
  any). A web page the user opens can then not take the server's slots; programs send no `Origin`.
* **Trusted hosts** (`--trusted-host`): the `Host` header must name one (refused with 400), so a DNS name
  rebound to a loopback server does not reach it. Serving on a loopback address trusts `localhost`,
  `127.0.0.1` and `::1` unless told; on any other address every host (`*`) unless told, so a server bound
  there without `--trusted-host` or an API key is open to a page whose DNS name is rebound to it.
* **Routes**: `hidden_routes` answer 404 to everyone (`--hide-route /v1/sessions`: its sessions' ids, seeds
  and latencies); `open_routes` need no key (`--open-route /metrics` for a scraper without one).

Every refusal is a JSON body `{"type": "error", "code": ..., "message": ...}` (a websocket's is the HTTP
response to its handshake, where the server offers it, else a close with 1008 before the accept: HTTP 403).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs

from duplexcadence.interpreter.serve import messages

API_KEY_ENV = "DUPLEXCADENCE_API_KEY"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@attrs.frozen
class AccessPolicy:
    """What `AccessMiddleware` checks (see the module docstring). `api_keys` empty: no key is asked."""

    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ("*",)
    open_routes: tuple[str, ...] = ("/healthz",)
    hidden_routes: tuple[str, ...] = ()

    @classmethod
    def serving_on(cls, bind_host: str, api_key: str | None = None, **options: Any) -> AccessPolicy:
        """The policy of a server bound to `bind_host`: the key given, else `DUPLEXCADENCE_API_KEY`'s (none
        when neither is set); trusted hosts the loopback names on a loopback address unless given."""
        key = api_key or os.environ.get(API_KEY_ENV) or None
        if not options.get("trusted_hosts"):
            options["trusted_hosts"] = LOOPBACK_HOSTS if is_loopback(bind_host) else ("*",)
        return cls(api_keys=(key,) if key else (), **options)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """Why the request of `scope` is refused: (HTTP status, error code, message); None: it may go on."""
        path = scope.get("path", "")
        if path in self.hidden_routes:
            return 404, messages.NOT_FOUND, messages.route_hidden(path)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        host = headers.get("host", "")
        if "*" not in self.trusted_hosts and host_name(host) not in self.trusted_hosts:
            return 400, messages.UNTRUSTED_HOST, messages.untrusted_host(host, self.trusted_hosts)
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host):
            return 403, messages.FORBIDDEN_ORIGIN, messages.forbidden_origin(origin)
        if self.api_keys and path not in self.open_routes and not self.key_matches(given_key(headers)):
            return 401, messages.UNAUTHORIZED, messages.unauthorized(API_KEY_ENV)
        return None

    def origin_allowed(self, origin: str, host: str) -> bool:
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        return urllib.parse.urlsplit(origin).netloc.lower() == host.lower() != ""  # the server's own page

    def key_matches(self, key: str | None) -> bool:
        return key is not None and any(hmac.compare_digest(key.encode(), known.encode()) for known in self.api_keys)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(host: str) -> str:
    """The name in a `Host` header, without its port (`[::1]:8000` -> `::1`)."""
    return (urllib.parse.urlsplit(f"//{host}").hostname or "") if host else ""


def given_key(headers: dict[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, or a websocket subprotocol `KEY_SUBPROTOCOL` KEY."""
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for offered in headers.get("sec-websocket-protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(KEY_SUBPROTOCOL):
            return offered[len(KEY_SUBPROTOCOL) :]
    return None


def key_protocol_chosen(scope: Scope, send: Send) -> Send:
    """`send`, which accepts a websocket that offered its key as a subprotocol with that subprotocol when the
    route chooses none (a browser fails a handshake that chooses none of the subprotocols it offered)."""
    offered = [
        protocol
        for protocol in scope.get("subprotocols", ())
        if scope["type"] == "websocket" and protocol.startswith(KEY_SUBPROTOCOL)
    ]
    if not offered:
        return send

    async def choosing(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": offered[0]}
        await send(message)

    return choosing


class AccessMiddleware:
    """The ASGI middleware of an `AccessPolicy`: a refused request never reaches the app."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], policy: AccessPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.policy.refusal(scope) if scope["type"] in ("http", "websocket") else None
        if refusal is None:
            await self.app(scope, receive, key_protocol_chosen(scope, send))
            return
        status, code, message = refusal
        body = json.dumps({"type": "error", "code": code, "message": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # the websocket's connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": messages.CLOSE_POLICY})
