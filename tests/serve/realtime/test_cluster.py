"""Conversations on a local Ray cluster (2 CPUs): 2 replicas of MiniCPM-o 4.5's conversation engine at the reduced
sizes behind the Serve proxy, 2 conversations each. A burst is spread by free capacity and a conversation too many
is refused with the numbers; a drained replica admits nothing while its conversation goes on; a killed replica
fails only its own conversations (close 1014), the others go on."""

from __future__ import annotations

import asyncio
import base64
import collections
import importlib.util
import json
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("transformers")
if importlib.util.find_spec("stepaudio2") is None:
    pytest.skip("needs stepaudio2-minicpmo (scripts/model-pins.txt)", allow_module_level=True)

import websockets

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, start
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec
from duplexcadence.interpreter.serve.conversations import ConversationPoolConfig

pytestmark = [pytest.mark.own_process, pytest.mark.slow]  # starts Ray (tests/conftest.py says why)

SPEECH = (np.random.default_rng(9).standard_normal(16000) * 2000).astype("<i2")
OPTIONS = {"sizes": "reduced", "n_timesteps": "2"}


@pytest.fixture(scope="module")
def cluster():
    config = ClusterConfig(replicas=2, cpus_per_replica=0.5, local_cpus=2, port=0, stats_period_s=0.2)
    pool = ConversationPoolConfig(idle_timeout_s=300)
    running = start(PoolSpec("minicpmo45", params=OPTIONS, config=pool, cpu_threads=1, conversations=2), config)
    try:
        yield running
    finally:
        running.shutdown()


def run(coroutine, timeout: float = 600):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=timeout))


class Conversation:
    """A websocket on /v1/realtime: the replica that took it, and one speaking unit at a time."""

    def __init__(self, socket, first: dict):
        self.socket = socket
        self.first = first
        self.replica = socket.response.headers.get(messages.REPLICA_HEADER)

    @classmethod
    async def open(cls, url: str, seed: int) -> Conversation:
        socket = await websockets.connect(f"{url}?seed={seed}")
        return cls(socket, json.loads(await socket.recv()))

    async def listen_unit(self) -> dict:
        """One unit of audio, listening; its `duplexcadence.unit` event."""
        await self.socket.send(json.dumps({"type": "duplexcadence.decision", "kind": "listen"}))
        appended = {"type": "input_audio_buffer.append", "audio": base64.b64encode(SPEECH.tobytes()).decode()}
        await self.socket.send(json.dumps(appended))
        while True:
            event = json.loads(await self.socket.recv())
            if event["type"] == "duplexcadence.unit":
                return event


def wait_for(cluster, replica: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while cluster.capacity(replica)["sessions"] != count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3 * cluster.config.stats_period_s)  # the routers hear of it


def test_conversations_are_spread_by_free_capacity_and_refused_when_full(cluster):
    assert cluster.ws_url.endswith("/v1/realtime")

    async def scenario():
        opened = [await Conversation.open(cluster.ws_url, seed) for seed in range(5)]
        units = [await conversation.listen_unit() for conversation in opened[:4]]
        for conversation in opened:
            await conversation.socket.close()
        return opened, units

    opened, units = run(scenario())
    assert [conversation.first["type"] for conversation in opened] == ["session.created"] * 4 + ["error"]
    refusal = opened[4].first["error"]
    assert (refusal["type"], refusal["code"]) == ("duplexcadence.admission", "at-capacity")
    assert refusal["message"].startswith("at capacity: 2 of 2 conversations")
    assert sorted(collections.Counter(c.replica for c in opened[:4]).values()) == [2, 2]
    assert [(unit["unit"], unit["kind"]) for unit in units] == [(0, "listen")] * 4


def test_a_drained_replica_keeps_its_conversation_and_a_killed_one_fails_only_its_own(cluster):
    for replica in cluster.replicas():
        wait_for(cluster, replica, 0)

    async def scenario():
        first = await Conversation.open(cluster.ws_url, 20)
        drained = first.replica
        stats = await asyncio.to_thread(cluster.drain, drained)
        later = [await Conversation.open(cluster.ws_url, seed) for seed in (21, 22)]
        kept = await first.listen_unit()
        victim = later[0].replica
        await asyncio.to_thread(cluster.kill, victim)
        with pytest.raises(websockets.exceptions.ConnectionClosed) as lost:
            await later[0].listen_unit()
        again = await first.listen_unit()
        await first.socket.close()
        return drained, stats, later, kept, again, victim, lost.value

    drained, stats, later, kept, again, victim, lost = run(scenario())
    assert (stats["draining"], stats["free"], stats["sessions"]) == (True, 0, 1)
    assert drained not in {conversation.replica for conversation in later} and victim != drained
    assert lost.rcvd.code == messages.CLOSE_REPLICA_LOST
    assert [(kept["unit"], again["unit"])] == [(0, 1)]
