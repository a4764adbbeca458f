"""Conversations on a local Ray cluster (2 CPUs): 2 replicas of the echo engine behind the Serve proxy, 2
conversations each. A burst is spread by free capacity, a conversation too many is refused with the engine's
numbers, each conversation's audio equals the engine's in-process; a drained replica admits nothing while its
conversation goes on; a killed replica fails only its own conversations (close 1014), the others go on."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.serve")

import websockets
from echo_engine import reference

from duplexcadence.interpreter.engine.api import Decision
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, start
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec
from duplexcadence.interpreter.serve.conversations import ConversationPoolConfig
from duplexcadence.interpreter.serve.realtime import audio

pytestmark = pytest.mark.own_process  # starts Ray (tests/conftest.py says why)

HERE = Path(__file__).parent
SPEECH = (np.random.default_rng(9).standard_normal(16000) * 2000).astype("<i2")


@pytest.fixture(scope="module")
def cluster():
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))  # echo_engine, by name
    config = ClusterConfig(
        replicas=2,
        cpus_per_replica=0.5,
        local_cpus=2,
        port=0,
        stats_period_s=0.2,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    spec = PoolSpec(
        "echo_engine:build", config=ConversationPoolConfig(idle_timeout_s=300), cpu_threads=1, conversations=2
    )
    running = start(spec, config)
    try:
        yield running
    finally:
        running.shutdown()


def run(coroutine, timeout: float = 120):
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

    async def speak_unit(self) -> np.ndarray:
        await self.socket.send(json.dumps({"type": "duplexcadence.decision", "kind": "speak", "text": [1]}))
        await self.socket.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(SPEECH.tobytes()).decode()})
        )
        deltas = []
        while True:
            event = json.loads(await self.socket.recv())
            if event["type"] == "response.output_audio.delta":
                deltas.append(audio.pcm16_samples(event["delta"]))
            if event["type"] == "duplexcadence.unit":
                return np.concatenate(deltas)


def wait_for(cluster, replica: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while cluster.capacity(replica)["sessions"] != count and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3 * cluster.config.stats_period_s)  # the routers hear of it


def test_conversations_are_spread_by_free_capacity_refused_when_full_and_equal_to_the_engine(cluster):
    assert cluster.ws_url.endswith("/v1/realtime")

    async def scenario():
        opened = [await Conversation.open(cluster.ws_url, seed) for seed in range(5)]
        spoken = [await conversation.speak_unit() for conversation in opened[:4]]
        for conversation in opened:
            await conversation.socket.close()
        return opened, spoken

    opened, spoken = run(scenario())
    assert [conversation.first["type"] for conversation in opened] == ["session.created"] * 4 + ["error"]
    refusal = opened[4].first["error"]
    assert (refusal["type"], refusal["code"]) == ("duplexcadence.admission", "at-capacity")
    assert refusal["message"] == "at capacity: 2 of 2 conversations"
    assert sorted(collections.Counter(c.replica for c in opened[:4]).values()) == [2, 2]
    for seed, made in enumerate(spoken):
        expected, _ = reference(seed, SPEECH, [Decision("speak", (1,))])
        assert np.array_equal(made, expected)


def test_a_drained_replica_keeps_its_conversation_and_a_killed_one_fails_only_its_own(cluster):
    for replica in cluster.replicas():
        wait_for(cluster, replica, 0)

    async def scenario():
        first = await Conversation.open(cluster.ws_url, 20)
        drained = first.replica
        stats = await asyncio.to_thread(cluster.drain, drained)
        later = [await Conversation.open(cluster.ws_url, seed) for seed in (21, 22)]
        kept = await first.speak_unit()
        victim = later[0].replica
        await asyncio.to_thread(cluster.kill, victim)
        with pytest.raises(websockets.exceptions.ConnectionClosed) as lost:
            await later[0].speak_unit()
        again = await first.speak_unit()
        await first.socket.close()
        return drained, stats, later, kept, again, victim, lost.value

    drained, stats, later, kept, again, victim, lost = run(scenario())
    assert (stats["draining"], stats["free"], stats["sessions"]) == (True, 0, 1)
    assert drained not in {conversation.replica for conversation in later} and victim != drained
    assert lost.rcvd.code == messages.CLOSE_REPLICA_LOST
    expected, _ = reference(20, np.concatenate([SPEECH, SPEECH]), [Decision("speak", (1,))] * 2)
    assert np.array_equal(np.concatenate([kept, again]), expected)
