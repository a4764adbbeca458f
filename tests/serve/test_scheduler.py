"""The round scheduler on its own, with a round that is not a tail's: a conversation engine's
(`engine.api.ConversationEngine.step`, one unit of every conversation that sent one), run by a runner of a
dozen lines. The core gathers the conversations' units into one engine step, answers each conversation with
its own output in the order sent, resets and closes through the engine, refuses past the rule's slots with
the numbers, and closes an idle conversation."""

from __future__ import annotations

import asyncio
import time

import attrs
import numpy as np
import pytest

from duplexcadence.interpreter.engine.api import LISTEN, UnitInput, UnitOutput
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRule, TickModel
from duplexcadence.interpreter.serve.metrics import PoolMetrics
from duplexcadence.interpreter.serve.scheduler import RESET, Client, Round, RoundOutcome, Scheduler, SessionClosed


@attrs.frozen
class Settings:
    queue_depth: int = 2
    idle_timeout_s: float = 30.0
    headroom: float = 0.15
    freeze_gc: bool = False
    pace: float | None = None


class ScaledEngine:
    """A ConversationEngine's shape: each step scales every conversation's audio by its unit count."""

    def __init__(self) -> None:
        self.units: dict[int, int] = {}
        self.steps: list[list[int]] = []

    def open(self, conversation: int) -> None:
        self.units[conversation] = 0

    def step(self, units: dict[int, UnitInput]) -> dict[int, UnitOutput]:
        self.steps.append(sorted(units))
        outputs = {}
        for conversation, unit in units.items():
            self.units[conversation] += 1
            count = self.units[conversation]
            outputs[conversation] = UnitOutput(conversation, count, LISTEN, (), "", (), unit.audio * count, False)
        return outputs

    def reset(self, conversation: int) -> None:
        self.units[conversation] = 0

    def close(self, conversation: int) -> None:
        del self.units[conversation]


class ConversationRounds:
    """The runner: a round's resets and closes through the engine, then one engine step of its units."""

    unit = "conversation"

    def __init__(self, engine: ScaledEngine):
        self.engine = engine

    def run(self, work: Round) -> RoundOutcome:
        for client, item in work.controls:
            (self.engine.reset if item.kind == RESET else self.engine.close)(client.id)
        started = time.perf_counter()
        units = {client.id: item.inputs for client, item in work.ticks}
        outputs = self.engine.step(units) if units else {}
        done = time.perf_counter()
        ticks = [(client, item, outputs[client.id]) for client, item in work.ticks]
        controls = [(client, item, None) for client, item in work.controls]
        return RoundOutcome(controls, ticks, {}, done - started, done, len(ticks), started)


async def started(engine: ScaledEngine, **settings) -> Scheduler:
    scheduler = Scheduler(Settings(**settings))
    scheduler.open_device()
    rule = AdmissionRule(2, None, TickModel(0.1, 0.2, "conversation"), 1.0, 0.15)
    scheduler.begin(ConversationRounds(engine), rule, PoolMetrics(1.0), gather_s=0.5, gather=0.0)
    return scheduler


async def opened(scheduler: Scheduler, engine: ScaledEngine) -> Client:
    refusal = scheduler.admission_refusal()
    if refusal is not None:
        raise scheduler.refused(refusal)
    client = Client(scheduler, next(scheduler.ids))
    await scheduler.run_on_device(engine.open, client.id)
    scheduler.add(client)
    return client


def unit(value: float) -> UnitInput:
    return UnitInput(np.full(4, value, dtype=np.float32))


def test_conversations_units_are_stepped_together_answered_in_order_reset_and_refused_past_the_slots():
    async def scenario():
        engine = ScaledEngine()
        scheduler = await started(engine)
        a, b = await opened(scheduler, engine), await opened(scheduler, engine)
        refused = scheduler.admission_refusal()
        first = [a.queue_tick(unit(1.0)), a.queue_tick(unit(1.0))]
        second = b.queue_tick(unit(2.0))  # gathered with a's first unit: one engine step for both
        outputs = [await future for future in [*first, second]]
        await a.reset()
        after_reset = await a.queue_tick(unit(3.0))
        await b.close()
        with pytest.raises(SessionClosed) as closed:
            b.queue_tick(unit(2.0))
        await scheduler.stop()
        return engine, scheduler, refused, outputs, after_reset, closed.value

    engine, scheduler, refused, outputs, after_reset, closed = asyncio.run(scenario())
    assert engine.steps[:2] == [[1, 2], [1]]
    assert [(out.conversation, out.unit, out.audio[0]) for out in outputs] == [(1, 1, 1.0), (1, 2, 2.0), (2, 1, 2.0)]
    assert (after_reset.unit, after_reset.audio[0]) == (1, 3.0)
    assert (refused.reason, refused.sessions, refused.capacity, refused.slots) == (messages.AT_CAPACITY, 2, 2, 2)
    assert closed.code == messages.CLIENT_CLOSED
    assert scheduler.deadlines().ticks == 4 and engine.units == {}


def test_an_idle_conversation_is_closed_with_its_code():
    async def scenario():
        engine = ScaledEngine()
        scheduler = await started(engine, idle_timeout_s=0.2)
        client = await opened(scheduler, engine)
        await asyncio.wait_for(client.closed_event.wait(), 5)
        await scheduler.stop()
        return client, engine

    client, engine = asyncio.run(scenario())
    assert client.close_code == messages.IDLE_TIMEOUT and engine.units == {}
