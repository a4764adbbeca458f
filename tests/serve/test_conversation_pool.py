"""The conversation pool over engines that need no model: the stock `Engine` over a stub model (its headroom
the pool's), and engines whose open is slow, refuses or whose close fails."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from duplexcadence.interpreter.engine.api import ConversationRefused, EngineCapacity
from duplexcadence.interpreter.engine.engine import Engine, RoundModel
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused
from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig
from duplexcadence.interpreter.serve.scheduler import TickError

CONFIG = ConversationPoolConfig(freeze_gc=False, pace=None, latency_guard=False)


class StubModel:
    """The slots of a `UnitModel`, without any stage."""

    name = "stub"
    input_rate, output_rate, unit_samples, slots = 16000, 24000, 16000, 8

    def start(self, slot: int, seed: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def bytes_per_conversation(self) -> int:
        return 1000


class SlowEngine:
    """Conversations whose open waits for `go` (on the device thread); `fail_close`: close raises."""

    input_rate, output_rate, unit_samples = 16000, 24000, 16000

    def __init__(self, refuse_after: int | None = None, fail_close: bool = False) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.open_ids: list[int] = []
        self.closed: list[int] = []
        self.refuse_after = refuse_after
        self.fail_close = fail_close

    def open(self, seed: int = 0) -> int:
        self.entered.set()
        self.go.wait(10)
        if self.refuse_after is not None and len(self.open_ids) >= self.refuse_after:
            raise ConversationRefused("2 conversations would take 1200 ms a round", {"predicted_ms": 1200.0})
        self.open_ids.append(len(self.open_ids) + len(self.closed) + 1)
        return self.open_ids[-1]

    def close(self, conversation: int) -> None:
        if self.fail_close:
            raise RuntimeError("the slot is stuck")
        self.open_ids.remove(conversation)
        self.closed.append(conversation)

    def step(self, units):
        return {}

    def reset(self, conversation: int) -> None:
        pass

    def capacity(self) -> EngineCapacity:
        active = len(self.open_ids)
        return EngineCapacity(max(active, 1), active, 4, 1, 1000, 900.0, 1000.0)


def test_the_pools_headroom_is_the_engines_so_what_it_admits_the_engine_opens():
    async def scenario():
        def build() -> Engine:
            engine = Engine(StubModel())  # its own headroom is 0.1: 2 conversations of 316 ms fit 900 ms
            engine.round_model = RoundModel({1: 316.0}, 0.0, 316.0)
            return engine

        pool = ConversationPool(build, "stub", attrs_evolve(CONFIG, headroom=0.05))
        await pool.start()
        try:
            capacity = pool.capacity()
            opened = [await pool.open(seed) for seed in range(3)]
            with pytest.raises(AdmissionRefused) as refused:
                await pool.open(3)
            assert pool.engine is not None
            return capacity, len(opened), pool.engine.capacity(), refused.value
        finally:
            await pool.stop()

    capacity, opened, engine_capacity, refused = asyncio.run(scenario())
    assert (capacity.capacity, capacity.headroom, opened) == (3, 0.05, 3)
    assert (engine_capacity.conversations, engine_capacity.time_limit, engine_capacity.active) == (3, 3, 3)
    assert (refused.reason, refused.sessions, refused.capacity) == (messages.AT_CAPACITY, 3, 3)


def attrs_evolve(config: ConversationPoolConfig, **changes) -> ConversationPoolConfig:
    import attrs

    return attrs.evolve(config, **changes)


def test_an_engine_refusal_carries_the_engines_numbers():
    async def scenario():
        engine = SlowEngine(refuse_after=1)
        pool = ConversationPool(lambda: engine, "slow", CONFIG)
        await pool.start()
        try:
            await pool.open()
            with pytest.raises(AdmissionRefused) as refused:
                await pool.open()
            return refused.value
        finally:
            await pool.stop()

    refused = asyncio.run(scenario())
    assert (refused.reason, refused.message) == (messages.AT_CAPACITY, "2 conversations would take 1200 ms a round")
    numbers = (refused.sessions, refused.capacity, refused.slots, refused.predicted_tick_s, refused.tick_period_s)
    assert numbers == (1, 1, 4, 1.2, 1.0)


def test_a_conversation_opened_while_the_pool_shuts_down_is_closed_and_refused_shutting_down():
    async def scenario():
        engine = SlowEngine()
        pool = ConversationPool(lambda: engine, "slow", CONFIG)
        await pool.start()
        engine.go.clear()
        opening = asyncio.ensure_future(pool.open())
        await asyncio.to_thread(engine.entered.wait, 10)
        shutting = asyncio.ensure_future(pool.shut_down(5.0))
        await asyncio.sleep(0)
        engine.go.set()
        with pytest.raises(AdmissionRefused) as refused:
            await opening
        await shutting
        sessions, capacity = dict(pool.sessions), pool.capacity()
        await pool.stop()
        return engine, refused.value, sessions, capacity

    engine, refused, sessions, capacity = asyncio.run(scenario())
    assert (refused.reason, refused.message) == (messages.SHUTTING_DOWN, messages.shutting_down())
    assert (engine.open_ids, engine.closed, sessions, capacity.sessions) == ([], [1], {}, 0)


def test_a_cancelled_open_closes_what_the_engine_opened():
    async def scenario():
        engine = SlowEngine()
        pool = ConversationPool(lambda: engine, "slow", CONFIG)
        await pool.start()
        engine.go.clear()
        opening = asyncio.ensure_future(pool.open())
        await asyncio.to_thread(engine.entered.wait, 10)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        engine.go.set()
        await pool.run_on_device(lambda: None)  # the open is done
        while pool.abandoned:
            await asyncio.sleep(0.01)
        counts = (pool.opening, len(pool.sessions))
        await pool.stop()
        return engine, counts

    engine, counts = asyncio.run(scenario())
    assert (engine.open_ids, engine.closed, counts) == ([], [1], (0, 0))


def test_a_failed_engine_close_is_logged_once_and_its_slot_stays_counted(caplog):
    async def scenario():
        engine = SlowEngine(fail_close=True)
        pool = ConversationPool(lambda: engine, "slow", attrs_evolve(CONFIG, headroom=0.0))
        await pool.start()
        try:
            conversation = await pool.open()
            with caplog.at_level(logging.ERROR, logger="duplexcadence.serve"):
                await conversation.close()
            logged = [record.getMessage() for record in caplog.records]
            capacity, sessions = pool.capacity(), dict(pool.sessions)
            for _ in range(3):
                await pool.open()
            return capacity, pool.admission_refusal(), sessions, logged
        finally:
            await pool.stop()

    capacity, refusal, sessions, logged = asyncio.run(scenario())
    assert (sessions, capacity.sessions, capacity.free) == ({}, 1, 3)
    assert refusal is not None and (refusal.reason, refusal.sessions, refusal.slots) == (messages.AT_CAPACITY, 4, 4)
    assert logged == [
        "closing conversation 1 failed; its slot stays counted as used (1 so): RuntimeError: the slot is stuck"
    ]


def test_a_reset_past_the_resets_queued_says_how_many_resets_are_queued():
    async def scenario():
        pool = ConversationPool(SlowEngine, "slow", attrs_evolve(CONFIG, queue_depth=2))
        await pool.start()
        try:
            conversation = await pool.open()
            conversation.reset(), conversation.reset()
            with pytest.raises(TickError) as full:
                conversation.reset()
            return full.value
        finally:
            await pool.stop()

    full = asyncio.run(scenario())
    assert (full.code, full.message) == (messages.QUEUE_FULL, messages.resets_queue_full(2))
    assert full.message.startswith("the session already has 2 resets queued")
