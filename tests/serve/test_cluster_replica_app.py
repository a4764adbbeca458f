"""What a Ray replica serves, without Ray: the app it builds from its `PoolSpec` applies the spec's access
policy (conversations and tail sessions alike), the spec crosses to the replicas pickled, and `dsl serve --ray`'s
start-up lines name what each replica's pool holds."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pytest.importorskip("ray.serve")
from starlette.testclient import TestClient, WebSocketDenialResponse

from duplexcadence.interpreter.cli import serve_ray
from duplexcadence.interpreter.engine.api import LISTEN, EngineCapacity, UnitOutput
from duplexcadence.interpreter.serve.access import AccessPolicy
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec, replica_app
from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.tail import served_tail

KEY = "replica-key"
ACCESS = AccessPolicy(api_keys=(KEY,), trusted_hosts=("testserver",), hidden_routes=("/v1/sessions",))


class ListeningEngine:
    input_rate, output_rate, unit_samples = 16000, 24000, 16000

    def open(self, seed: int = 0) -> int:
        return 1

    def step(self, units):
        return {c: UnitOutput(c, 0, LISTEN, (), "", (), np.zeros(0, np.float32), False) for c in units}

    def reset(self, conversation: int) -> None:
        pass

    def close(self, conversation: int) -> None:
        pass

    def capacity(self) -> EngineCapacity:
        return EngineCapacity(2, 0, 2, 2, 0, None, 1000.0)


def conversation_pool() -> ConversationPool:
    return ConversationPool(ListeningEngine, "listening", ConversationPoolConfig(freeze_gc=False))


def tail_pool() -> SessionPool:
    return SessionPool(served_tail("toy", None, {}, "cpu"), PoolConfig(slots=1, freeze_gc=False))


def test_the_spec_carries_the_access_policy_through_pickle():
    spec = PoolSpec("minicpmo45", None, {}, ConversationPoolConfig(), conversations=2, access=ACCESS)
    assert pickle.loads(pickle.dumps(spec)).access == ACCESS


@pytest.mark.parametrize(("make_pool", "route"), [(conversation_pool, "/v1/realtime"), (tail_pool, "/v1/session")])
def test_a_replicas_app_applies_the_specs_access_policy(make_pool, route):
    pool = make_pool()
    with TestClient(replica_app(pool, ACCESS, "replica-1")) as client:
        assert client.portal is not None
        client.portal.call(pool.start)
        try:
            without = client.get("/v1/capacity")
            keyed = client.get("/v1/capacity", headers={"Authorization": f"Bearer {KEY}"})
            hidden = client.get("/v1/sessions", headers={"Authorization": f"Bearer {KEY}"})
            untrusted = client.get("/v1/capacity", headers={"Authorization": f"Bearer {KEY}", "Host": "evil.example"})
            with pytest.raises(WebSocketDenialResponse) as socket_refused, client.websocket_connect(route):
                pass
        finally:
            client.portal.call(pool.stop)
    assert (without.status_code, without.json()["code"]) == (401, "unauthorized")
    assert (keyed.status_code, hidden.status_code, untrusted.status_code) == (200, 404, 400)
    assert socket_refused.value.status_code == 401


class Cluster:
    ws_url = "ws://127.0.0.1:8000/v1/realtime"

    def __init__(self, capacities):
        self._capacities = capacities

    def capacities(self):
        return self._capacities


def test_the_start_up_lines_name_a_conversation_pools_conversations():
    conversations = {**conversation_stats(), "device": "cuda"}
    sessions = {"sessions": 1, "slots": 4, "capacity": 3, "device": "cpu"}
    lines = serve_ray.describe(Cluster({"a": conversations, "b": sessions}))
    assert lines == [
        "serving on 2 replica(s) through ws://127.0.0.1:8000/v1/realtime",
        "  replica a on cuda: capacity 2 conversations of 2 slots, 0 active",
        "  replica b on cpu: capacity 3 sessions of 4 slots, 1 active",
    ]


def conversation_stats() -> dict:
    """A started conversation pool's `capacity_json()`, as a replica reports it."""
    import asyncio

    async def snapshot():
        pool = conversation_pool()
        await pool.start()
        try:
            return pool.capacity_json()
        finally:
            await pool.stop()

    return asyncio.run(snapshot())
