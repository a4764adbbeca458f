"""The cluster's placement and loss handling without a Ray cluster: the router's ranking from routing stats
and its own placements, a handle call pinned to a named replica, the proxy middleware's close (1014, the
replica named), the replica's accept header, and the client's `ReplicaLost`."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.client import ReplicaLost, SessionClient, SessionClosedByServer
from duplexcadence.interpreter.serve.cluster import router
from duplexcadence.interpreter.serve.cluster.proxy import ReplicaLossClose, middlewares
from duplexcadence.interpreter.serve.cluster.replica import ReplicaHeader

DEPLOYMENT = DeploymentID(name="DuplexReplica", app_name="duplexcadence")


def stats(free: int, sessions: int = 0, draining: bool = False, recorded_at: float = 100.0) -> dict:
    return {"free": free, "sessions": sessions, "draining": draining, "recorded_at": recorded_at}


@pytest.mark.parametrize(
    ("standings", "order"),
    [
        # most free first; equal free: fewer sessions first, then the name
        ({"a": stats(1, 2), "b": stats(3, 0), "c": stats(2, 1)}, ["b", "c", "a"]),
        ({"a": stats(2, 2), "b": stats(2, 1)}, ["b", "a"]),
        ({"b": stats(2, 1), "a": stats(2, 1)}, ["a", "b"]),
        # a draining replica is last even with free slots; a full one before it; no stats yet: after the free ones
        ({"a": stats(5, 0, draining=True), "b": stats(0, 3), "c": {}, "d": stats(1, 2)}, ["d", "c", "b", "a"]),
    ],
)
def test_rank_puts_the_most_free_capacity_first_and_draining_replicas_last(standings, order):
    ranked = router.rank(router.standing(name, values, ()) for name, values in standings.items())
    assert [entry.replica for entry in ranked] == order


def test_placements_not_yet_in_the_stats_count_against_free_capacity():
    placed = [99.5, 100.2]  # wall-clock times this router placed sessions on the replica
    # stats recorded at 100.0: both placements are within SETTLE_S (1 s) of it, so neither is assumed in them
    assert router.standing("a", stats(3, recorded_at=100.0), placed).placed == 2
    # recorded at 101.0: the first is assumed counted (placed more than SETTLE_S before), the second not
    assert router.standing("a", stats(3, recorded_at=101.0), placed).placed == 1
    assert router.standing("a", stats(3, recorded_at=102.0), placed).placed == 0
    # two unseen placements on a replica with 3 free rank it below one with 2 free and none placed
    ranked = router.rank([router.standing("a", stats(3), placed), router.standing("b", stats(2), [])])
    assert [entry.replica for entry in ranked] == ["b", "a"]


class FakeReplica:
    """What `choose_replicas` reads of a `RunningReplica`: its id and routing stats."""

    def __init__(self, name: str, routing_stats: dict):
        self.replica_id = ReplicaID(name, DEPLOYMENT)
        self.routing_stats = routing_stats


def pending(request: str, **kwargs) -> PendingRequest:
    return PendingRequest(
        args=[], kwargs=kwargs, metadata=RequestMetadata(request_id=request, internal_request_id=request)
    )


def names(ranks) -> list[list[str]]:
    return [[replica.replica_id.unique_id for replica in rank] for rank in ranks]


def test_a_burst_of_sessions_is_spread_by_the_routers_own_placements():
    async def scenario():
        chooser = router.FreeCapacityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.PROXY)
        chooser.initialize_state()
        replicas = [FakeReplica("a", stats(3, recorded_at=0.0)), FakeReplica("b", stats(3, recorded_at=0.0))]
        firsts = []
        for index in range(6):  # routed long after the stats were recorded, before new ones arrive
            ranks = await chooser.choose_replicas(replicas, pending(f"r{index}"))
            firsts.append(names(ranks)[0][0])
        # a session the proxy accepted elsewhere than the first choice moves its placement there
        chooser.on_request_routed(pending("r5"), ReplicaID("a", DEPLOYMENT), None)
        moved = chooser.placements["r5"].replica
        chooser.on_request_completed(ReplicaID("a", DEPLOYMENT), "r0")
        return firsts, moved, sorted(chooser.placements)

    firsts, moved, left = asyncio.run(scenario())
    assert firsts == ["a", "b", "a", "b", "a", "b"]
    assert moved == "a"
    assert left == ["r1", "r2", "r3", "r4", "r5"]


def test_a_handle_call_that_names_a_replica_goes_to_it_and_reserves_nothing():
    async def scenario():
        chooser = router.FreeCapacityRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
        chooser.initialize_state()
        replicas = [FakeReplica("a", stats(3)), FakeReplica("b", stats(0, 3))]
        pinned = await chooser.choose_replicas(replicas, pending("c1", replica_id="b"))
        gone = await chooser.choose_replicas(replicas, pending("c2", replica_id="zzz"))
        return names(pinned), names(gone), dict(chooser.placements)

    pinned, gone, placements = asyncio.run(scenario())
    assert pinned == [["b"]]
    assert gone == [["a"], ["b"]]  # any replica answers that zzz is not serving
    assert placements == {}


async def accepted_then_gone(scope, receive, send):
    """A relay whose replica accepted the session, then died (the relay ends without a close frame)."""
    await send({"type": "websocket.accept", "headers": [(messages.REPLICA_HEADER.encode(), b"r7k2")]})
    await receive()


async def accepted_then_closed(scope, receive, send):
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": 1000, "reason": ""})


async def plain_http(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_proxy_closes_a_session_whose_replica_stopped_with_1014_naming_it():
    client = TestClient(ReplicaLossClose(accepted_then_gone))
    with client.websocket_connect("/v1/session") as socket:
        socket.send_text("{}")
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    assert closed.value.code == 1014
    assert closed.value.reason == "replica r7k2 stopped; this session's state was on it and is lost"


def test_the_proxy_leaves_closed_sessions_and_http_alone():
    client = TestClient(ReplicaLossClose(accepted_then_closed))
    with client.websocket_connect("/") as socket, pytest.raises(WebSocketDisconnect) as closed:
        socket.receive_text()
    assert closed.value.code == 1000
    assert TestClient(ReplicaLossClose(plain_http)).get("/").text == "ok"
    assert [m.cls for m in middlewares()] == [ReplicaLossClose]


def test_the_replica_names_itself_in_the_websocket_accept():
    async def app(scope, receive, send):
        await send({"type": "websocket.accept", "headers": [(b"x-other", b"1")]})
        await send({"type": "websocket.close", "code": 1000})

    with TestClient(ReplicaHeader(app, "r7k2")).websocket_connect("/") as socket:
        headers = dict(socket.extra_headers)
        with pytest.raises(WebSocketDisconnect):
            socket.receive_text()
    assert headers == {b"x-other": b"1", b"x-duplexcadence-replica": b"r7k2"}


class FakeConnection:
    def __init__(self, headers: dict):
        self.response = type("Response", (), {"headers": headers})()


@pytest.mark.parametrize(
    ("headers", "close", "kind", "code", "message"),
    [
        (
            {"x-duplexcadence-replica": "r7k2"},
            Close(1014, "replica r7k2 stopped; this session's state was on it and is lost"),
            ReplicaLost,
            "replica-lost",
            "replica r7k2 stopped; this session's state was on it and is lost",
        ),
        (
            {"x-duplexcadence-replica": "r7k2"},
            None,
            ReplicaLost,
            "replica-lost",
            "the connection to replica r7k2 ended without a close frame; this session's state was there and is lost",
        ),
        ({}, None, SessionClosedByServer, "closed", ""),
        ({"x-duplexcadence-replica": "r7k2"}, Close(1000, ""), SessionClosedByServer, "closed", ""),
    ],
)
def test_the_client_turns_a_lost_replica_into_replica_lost_naming_it(headers, close, kind, code, message):
    client = SessionClient(FakeConnection(headers), {"type": "ready"})
    error = client.closed_error(ConnectionClosedError(rcvd=close, sent=None))
    assert type(error) is kind
    assert (error.code, error.message) == (code, message)
    if kind is ReplicaLost:
        assert error.replica == "r7k2"
        assert str(error) == f"replica-lost: {message}"
