"""Access control before every route: the API key (but on /healthz), the Origin allow-list refusing a
cross-site browser by default, trusted hosts against DNS rebinding, hidden and open routes, and a route added
to the app after `make_app` (as `/v1/realtime` is) covered without doing anything."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.access import API_KEY_ENV, AccessPolicy
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.app import make_app
from duplexcadence.interpreter.serve.client import SessionClient
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ServerThread
from duplexcadence.interpreter.serve.tail import served_tail

KEY = "s3cret-key"


async def added_route(request):
    return PlainTextResponse("added")


@pytest.fixture(scope="module")
def server():
    pool = SessionPool(served_tail("toy"), PoolConfig(slots=2, tick_model=TickModel(0.001, 0.001)))
    policy = AccessPolicy.serving_on(
        "127.0.0.1", KEY, allowed_origins=("https://app.example",), hidden_routes=("/v1/sessions",)
    )
    app = make_app(pool, access=policy)
    app.router.routes.append(Route("/v1/added", added_route))  # a route another module adds later
    with ServerThread(app) as running:
        yield running


def get(server, path: str, **headers: str) -> tuple[int, dict, str]:
    request = urllib.request.Request(server.url(path), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def refused(body: str) -> str:
    return json.loads(body)["code"]


def test_every_route_but_healthz_needs_the_key_a_route_added_later_included(server):
    bearer = {"Authorization": f"Bearer {KEY}"}
    assert get(server, "/healthz")[0] == 200
    for path in ("/v1/capacity", "/metrics", "/v1/added"):
        status, headers, body = get(server, path)
        assert (status, headers.get("www-authenticate"), refused(body)) == (401, "Bearer", messages.UNAUTHORIZED)
        assert get(server, path, **bearer)[0] == 200
        assert get(server, path, Authorization="Bearer wrong")[0] == 401
    assert get(server, "/v1/added", **bearer)[2] == "added"


def test_a_hidden_route_is_not_found_even_with_the_key(server):
    status, _, body = get(server, "/v1/sessions", Authorization=f"Bearer {KEY}")
    assert (status, refused(body)) == (404, messages.NOT_FOUND)


def test_a_cross_site_page_and_a_rebound_host_are_refused_the_servers_own_page_and_an_allowed_origin_are_not(server):
    bearer = {"Authorization": f"Bearer {KEY}"}
    status, _, body = get(server, "/v1/capacity", Origin="http://evil.example", **bearer)
    assert (status, refused(body)) == (403, messages.FORBIDDEN_ORIGIN)
    assert get(server, "/v1/capacity", Origin=f"http://127.0.0.1:{server.port}", **bearer)[0] == 200
    assert get(server, "/v1/capacity", Origin="https://app.example", **bearer)[0] == 200
    status, _, body = get(server, "/v1/capacity", Host=f"evil.example:{server.port}", **bearer)
    assert (status, refused(body)) == (400, messages.UNTRUSTED_HOST)
    assert get(server, "/v1/capacity", Host=f"localhost:{server.port}", **bearer)[0] == 200


def test_a_websocket_needs_the_key_and_a_browser_may_offer_it_as_a_subprotocol(server, monkeypatch):
    async def scenario():
        url = server.ws_url()
        with pytest.raises(InvalidStatus) as without:
            await connect(url, proxy=None)
        with pytest.raises(InvalidStatus) as cross_site:
            await connect(url, proxy=None, origin="http://evil.example", additional_headers={"Authorization": KEY})
        client = await SessionClient.connect(url, seed=1, api_key=KEY)
        await client.close()
        monkeypatch.setenv(API_KEY_ENV, KEY)
        from_environment = await SessionClient.connect(url, seed=2)
        await from_environment.close()
        offered = await connect(url, proxy=None, subprotocols=[f"openai-insecure-api-key.{KEY}"])
        ready = json.loads(await offered.recv())
        await offered.close()
        return without.value.response, cross_site.value.response, ready, offered.subprotocol

    without, cross_site, ready, chosen = asyncio.run(scenario())
    assert chosen == f"openai-insecure-api-key.{KEY}"
    assert (without.status_code, refused(without.body.decode())) == (401, messages.UNAUTHORIZED)
    assert cross_site.status_code == 403
    assert ready["type"] == "ready"


def test_the_key_comes_from_the_environment_and_loopback_trusts_the_loopback_names(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    policy = AccessPolicy.serving_on("127.0.0.1")
    assert policy.api_keys == ("from-env",) and policy.trusted_hosts == ("localhost", "127.0.0.1", "::1")
    assert AccessPolicy.serving_on("0.0.0.0", "given").api_keys == ("given",)
    assert AccessPolicy.serving_on("0.0.0.0").trusted_hosts == ("*",)
