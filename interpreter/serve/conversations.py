"""The conversation pool: one conversation engine on one device, its conversations advanced in rounds.

    pool = ConversationPool(lambda: registry.load("minicpmo45", device="cuda", conversations=8), "minicpmo45")
    await pool.start()                        # the engine built on the device thread
    conversation = await pool.open(seed=3)    # ConversationRefusal when it does not fit
    output = await conversation.submit(UnitInput(audio))   # a UnitOutput
    await conversation.reset()                # barge-in
    await conversation.close()

One thread owns the device: it builds the engine, opens, resets and closes conversations and runs the rounds. A
round is one `engine.step` over every conversation whose next queued item is a unit (their resets and closes
first); a conversation has at most one unit in flight and `queue_depth` queued, so its units run in the order
sent. A round waits up to `gather_s` from its oldest unit for the other conversations' units (conversations paced
by the same cadence arrive a few milliseconds apart, and one round for all of them costs less than two).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import importlib
import time
from collections.abc import Callable
from typing import Any

import attrs

from duplexcadence.interpreter.engine.api import (
    ConversationEngine,
    ConversationError,
    ConversationRefused,
    UnitInput,
    UnitOutput,
)
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.modes import TickError
from duplexcadence.interpreter.serve.pool import ClosingState, SessionClosed

GATHER_FRACTION = 0.05


class EngineSetupError(LookupError):
    """An engine that cannot be built as named: the message says why."""


def engine_factory(
    target: str, device: str, conversations: int, params: dict[str, str]
) -> Callable[[], ConversationEngine]:
    """What builds the engine `target` names: a registered conversation engine, or `MODULE:FUNCTION` (a function
    of the user's that returns a `ConversationEngine`), called with `device=`, `conversations=` and `params`.
    EngineSetupError for a function that cannot be imported or an installation without an engine registry."""
    from duplexcadence.interpreter import tails

    if ":" in target:
        module, _, function = target.partition(":")
        try:
            build = tails.import_function(module, function)
        except tails.ImportFailed as error:
            raise EngineSetupError(str(error)) from None
        return lambda: build(device=device, conversations=conversations, **params)
    try:
        registry = importlib.import_module("duplexcadence.interpreter.engine.registry")
    except ImportError as error:
        raise EngineSetupError(f"no conversation engine is registered in this installation ({error})") from None
    return lambda: registry.load(target, device=device, conversations=conversations, **params)


def engine_name(target: str) -> str:
    """The name a pool serves `target` under: a registered engine's, or the FUNCTION of `MODULE:FUNCTION`."""
    return target.rpartition(":")[2]


@attrs.frozen
class ConversationPoolConfig:
    """`queue_depth`: units a conversation may have queued beside the one in flight; `idle_timeout_s`: a
    conversation that sends nothing this long is closed; `gather_s`: how long a round may wait from its oldest
    unit for the others' (None: 5 % of the cadence)."""

    queue_depth: int = 4
    idle_timeout_s: float = 30.0
    gather_s: float | None = None

    def problems(self) -> list[str]:
        found = []
        if self.queue_depth < 1:
            found.append(f"the queue depth must be at least 1, not {self.queue_depth}")
        if not self.idle_timeout_s > 0:
            found.append(f"the idle timeout must be above 0 s, not {self.idle_timeout_s}")
        if self.gather_s is not None and not self.gather_s >= 0:
            found.append(f"the gather time must be 0 s or more, not {self.gather_s}")
        return found


class ConversationRefusal(Exception):
    """A conversation the pool does not open: `code` ("at-capacity", "draining", "shutting-down"), the message
    with the numbers, and the numbers."""

    def __init__(self, code: str, message: str, numbers: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.numbers = dict(numbers or {})


@attrs.define(eq=False)
class Item:
    kind: str  # "unit", "reset" or "close"
    future: asyncio.Future
    unit: UnitInput | None = None
    queued_at: float = 0.0


class PooledConversation(ClosingState):
    """One client's conversation in the pool: its units run in the order submitted."""

    def __init__(self, pool: ConversationPool, engine_id: int, seed: int):
        self.pool = pool
        self.id = engine_id
        self.seed = seed
        self.queue: collections.deque[Item] = collections.deque()
        self.in_flight = False
        self.closing = None
        self.closed_event = asyncio.Event()
        self.units = 0
        self.last_activity = time.monotonic()

    def submit(self, unit: UnitInput) -> asyncio.Future:
        """Queue one unit; a future of its `UnitOutput`. TickError at once for a full queue or a closed
        conversation (nothing queued)."""
        self.check_open()
        queued = sum(1 for item in self.queue if item.kind == "unit")
        if queued >= self.pool.config.queue_depth:
            raise TickError(messages.QUEUE_FULL, messages.queue_full(queued))
        return self._queue(Item("unit", self.pool.loop.create_future(), unit, time.perf_counter()))

    def queued(self) -> int:
        """Units queued or in flight."""
        return sum(1 for item in self.queue if item.kind == "unit") + int(self.in_flight)

    def reset(self) -> asyncio.Future:
        """Barge-in after the units queued before it (a future, done when it is)."""
        self.check_open()
        return self._queue(Item("reset", self.pool.loop.create_future()))

    async def close(self) -> None:
        """Close after the units queued before it; the engine's slot is free when this returns."""
        if self.closing is None:
            self.closing = (messages.CLIENT_CLOSED, "closed by the client")
            await self._queue(Item("close", self.pool.loop.create_future()))
        else:
            await self.closed_event.wait()

    def abort(self, code: str, message: str) -> None:
        """Close now: what is queued fails with `code`; the slot is freed after the unit in flight."""
        if self.closed_event.is_set():
            return
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        error = SessionClosed(code, message)
        for item in self.queue:
            if item.kind != "close" and not item.future.done():
                item.future.set_exception(error)
                item.future.exception()
        kept = [item for item in self.queue if item.kind == "close"]
        self.queue.clear()
        self.queue.extend(kept or [Item("close", self.pool.loop.create_future())])
        self.pool.wake()

    def _queue(self, item: Item) -> asyncio.Future:
        self.queue.append(item)
        self.last_activity = time.monotonic()
        self.pool.wake()
        return item.future


class ConversationPool:
    """Conversations of one engine on one device (see the module docstring). `build` makes the engine (called on
    the device thread); `name` is the model's."""

    def __init__(
        self, build: Callable[[], ConversationEngine], name: str, config: ConversationPoolConfig | None = None
    ):
        self.build = build
        self.name = name
        self.config = config or ConversationPoolConfig()
        problems = self.config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.engine: ConversationEngine | None = None
        self.conversations: dict[int, PooledConversation] = {}
        self.draining = False
        self.stopping = False
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self.units = 0
        self.round_log: collections.deque[tuple[int, float]] = collections.deque(maxlen=4096)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() the pool first"
        return self._loop

    @property
    def started(self) -> bool:
        return self.engine is not None

    @property
    def cadence_s(self) -> float:
        engine = self._engine()
        return engine.unit_samples / engine.input_rate

    def _engine(self) -> ConversationEngine:
        assert self.engine is not None, "start() the pool first"
        return self.engine

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="duplexcadence-engine")
        self.engine = await self.run_on_device(self.build)
        self._tasks = [asyncio.create_task(self._schedule()), asyncio.create_task(self._reap())]

    async def stop(self) -> None:
        self.stopping = True
        for conversation in list(self.conversations.values()):
            conversation.abort(messages.SHUTTING_DOWN, messages.shutting_down())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle(), timeout=30)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def _idle(self) -> None:
        while self.conversations:
            await asyncio.sleep(0.01)

    async def run_on_device(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._executor is not None, "start() the pool first"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def drain(self) -> None:
        self.draining = True

    async def open(self, seed: int = 0) -> PooledConversation:
        """A new conversation; ConversationRefusal when the pool is draining or the engine refuses it."""
        if self.stopping:
            raise ConversationRefusal(messages.SHUTTING_DOWN, messages.shutting_down())
        if self.draining:
            raise ConversationRefusal(messages.DRAINING, messages.draining(len(self.conversations)))
        engine = self._engine()
        try:
            engine_id = await self.run_on_device(engine.open, seed)
        except ConversationRefused as refusal:
            raise ConversationRefusal(messages.AT_CAPACITY, refusal.reason, refusal.numbers) from None
        conversation = PooledConversation(self, engine_id, seed)
        self.conversations[engine_id] = conversation
        return conversation

    def capacity_json(self) -> dict[str, Any]:
        """The engine's capacity (`EngineCapacity`), with the pool's `sessions` (its open conversations), `free`
        (conversations it admits now: none while draining) and `draining`, the fields a router places by."""
        capacity = attrs.asdict(self._engine().capacity())
        sessions = len(self.conversations)
        free = 0 if self.draining or self.stopping else max(0, capacity["conversations"] - sessions)
        return {**capacity, "sessions": sessions, "free": free, "draining": self.draining}

    # --- the scheduler ---------------------------------------------------------------------------------

    async def _schedule(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._gather()
            controls, units = self._take()
            if not controls and not units:
                continue
            try:
                outcome = await self.run_on_device(self._round, controls, units)
            except Exception as error:  # a fault of the engine outside what it reports per unit
                for conversation, item in controls + units:
                    conversation.in_flight = False
                    if not item.future.done():
                        item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
                continue
            self._deliver(controls, units, *outcome)

    async def _gather(self) -> None:
        """Wait, up to the gather time from the oldest unit queued, while another open conversation has none."""
        assert self._wake is not None
        gather = self.config.gather_s if self.config.gather_s is not None else GATHER_FRACTION * self.cadence_s
        while gather > 0:
            conversations = self.conversations.values()
            queued = [c.queue[0].queued_at for c in conversations if c.queue and c.queue[0].kind == "unit"]
            waiting = any(not c.queue and not c.in_flight and c.closing is None for c in conversations)
            remaining = min(queued, default=0.0) + gather - time.perf_counter()
            if not queued or not waiting or remaining <= 0:
                return
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    def _take(self) -> tuple[list[tuple[PooledConversation, Item]], list[tuple[PooledConversation, Item]]]:
        controls, units = [], []
        for conversation in list(self.conversations.values()):
            if conversation.in_flight:
                continue
            while conversation.queue and conversation.queue[0].kind != "unit":
                controls.append((conversation, conversation.queue.popleft()))
            if conversation.queue and not any(c is conversation and i.kind == "close" for c, i in controls):
                units.append((conversation, conversation.queue.popleft()))
                conversation.in_flight = True
        return controls, units

    def _round(self, controls: list, units: list) -> tuple[list, dict, float]:
        """On the device thread: the controls in order, then one step of every unit."""
        engine = self._engine()
        done: list[Exception | None] = []
        for conversation, item in controls:
            try:
                (engine.reset if item.kind == "reset" else engine.close)(conversation.id)
                done.append(None)
            except Exception as error:
                done.append(error)
        results: dict[int, Any] = {}
        started = time.perf_counter()
        if units:
            inputs = {conversation.id: item.unit for conversation, item in units}
            try:
                results = dict(engine.step(inputs))
            except ConversationError as error:
                results = {key: error for key in inputs}
            except Exception as error:
                results = {key: error for key in inputs}
        return done, results, time.perf_counter() - started

    def _deliver(self, controls: list, units: list, done: list, results: dict, round_s: float) -> None:
        for (conversation, item), error in zip(controls, done, strict=True):
            if item.kind == "close":
                self.conversations.pop(conversation.id, None)
                if conversation.closing is None:
                    conversation.closing = (messages.CLIENT_CLOSED, "closed by the client")
                while conversation.queue:
                    left = conversation.queue.popleft()
                    if not left.future.done():
                        left.future.set_exception(SessionClosed(*conversation.closing))
                        left.future.exception()
                conversation.closed_event.set()
                if not item.future.done():
                    item.future.set_result(None)
            elif not item.future.done():
                if error is None:
                    item.future.set_result(None)
                else:
                    item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
        if units:
            self.round_log.append((len(units), round_s))
        for conversation, item in units:
            conversation.in_flight = False
            value = results.get(conversation.id)
            if item.future.done():
                continue
            if isinstance(value, UnitOutput):
                conversation.units += 1
                self.units += 1
                item.future.set_result(value)
            elif isinstance(value, ConversationError):
                item.future.set_exception(TickError(messages.BAD_INPUT, str(value)))
            else:
                cause = "the engine gave no output" if value is None else messages.internal(value)
                item.future.set_exception(TickError(messages.STAGE_FAILED, cause))
        if any(c.queue for c in self.conversations.values()):
            self.wake()

    async def _reap(self) -> None:
        timeout = self.config.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for conversation in list(self.conversations.values()):
                idle = not conversation.queue and not conversation.in_flight and conversation.closing is None
                if idle and now - conversation.last_activity > timeout:
                    conversation.abort(messages.IDLE_TIMEOUT, messages.idle_timeout(timeout))
