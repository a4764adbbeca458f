"""The round scheduler: clients' items stepped in rounds on one device thread, at a cadence.

The scheduler knows nothing of what a round computes. A client (`Client`: a tail's session, a conversation)
submits items through its handle: ticks, and the controls `reset` and `close`. The scheduler gathers the
ready items into a round, runs the round on the device thread through its `RoundRunner` (what the round
computes: the tail's `step_many`, a conversation engine's `step`), and delivers each client's result or
its error. Around that loop it owns:

* the clients' queues: bounded (`queue_depth` ticks beside the one in flight), one item in flight per
  client, so a client's items run in the order it sent them;
* the gather: a round waits, up to `gather_s` from its oldest tick, for every awaited client to have
  something queued, so that clients paced by one cadence share a round;
* the pace: a client's ticks are stepped at most `pace` a tick period on average, after a burst of
  `queue_depth` (a generic cell-rate rule: each client's theoretical time for its next tick), so a client
  that sends ahead of the cadence waits in its own queue (`queue-full` past it) and takes no rounds from
  the others;
* admission: `admission_refusal` (a slot, the calibrated round model against the period, the observed
  latency guard) with the numbers, `capacity()`, `drain()` and `drained()`;
* deadline accounting (`deadlines.LatencyBook`), the metrics (`metrics.PoolMetrics`), the idle reaper, and
  `stop()`.

A scheduler of a kind of client subclasses `Scheduler` and gives it a runner. Its loop-side hooks (`screen`,
`choose`, `settle`, `answered`, `closed`, `awaited`) default to "every client is independent"; the tail's
`pool.SessionPool` overrides them for lockstep groups and bundles. `run_on_device` runs anything else on
the device thread (opening a client, loading).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, AdmissionRule, Capacity
from duplexcadence.interpreter.serve.deadlines import DeadlineReport, LatencyBook, SessionStats, quantile
from duplexcadence.interpreter.serve.metrics import PoolMetrics

LOG = logging.getLogger("duplexcadence.serve")

TICK = "tick"
RESET = "reset"
CLOSE = "close"

OBSERVE_EVERY_S = 0.1
"""How often the scheduler sets its observed p99 and latency histograms (also set at each scrape)."""


class TickError(Exception):
    """A tick that did not run, or failed: `code` (an error code of `messages`) and `message`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class RoundSettings(Protocol):
    """What the scheduler reads of its configuration (`pool.PoolConfig` has it)."""

    @property
    def queue_depth(self) -> int: ...

    @property
    def idle_timeout_s(self) -> float: ...

    @property
    def headroom(self) -> float: ...

    @property
    def freeze_gc(self) -> bool: ...

    @property
    def pace(self) -> float | None: ...


class SessionClosed(TickError):
    """A tick, reset or close of a client that is closed (or closing): `code` says why it closed."""


@attrs.define(eq=False)
class Item:
    """One queued item of a client: a tick (its `inputs`, whatever the runner steps) or a control."""

    kind: str  # TICK, RESET or CLOSE
    future: asyncio.Future = attrs.field(repr=False)
    inputs: Any = attrs.field(default=None, repr=False)
    last: bool = False
    queued_at: float = 0.0
    covers: list[Any] | None = attrs.field(default=None, repr=False)
    """The clients a whole item is for (a bundle's lockstep group queued on its lead); None: its own."""

    @property
    def whole(self) -> bool:
        return self.covers is not None


class ClosingState:
    """Why a client closed or is closing: `closing` is (code, message), None while it is open."""

    closing: tuple[str, str] | None = None

    @property
    def close_code(self) -> str | None:
        """Why the client closed or is closing (an error code of `messages`, or "closed": asked to)."""
        return self.closing[0] if self.closing else None

    @property
    def close_message(self) -> str | None:
        return self.closing[1] if self.closing else None

    def check_open(self) -> None:
        """SessionClosed, saying why, once the client is closed or closing."""
        if self.closing is not None:
            raise SessionClosed(self.closing[0], messages.session_closed(self.closing[1]))


class Client(ClosingState):
    """One client of a scheduler: its items run in the order submitted, one in flight at a time."""

    def __init__(self, scheduler: Scheduler, client_id: int, seed: int = 0):
        self.scheduler = scheduler
        self.id = client_id
        self.seed = seed
        self.queue: collections.deque[Item] = collections.deque()
        self.in_flight = False
        self.closing = None
        self.closed = False
        self.closed_event = asyncio.Event()
        self.queued_on: Client | None = None
        """A client whose items another client queues for it (a fused group's member, on its lead)."""
        self.due = 0.0
        """When this client's next tick is due at its pace (perf_counter seconds; the burst may run ahead)."""
        self.ticks = 0
        self.missed = 0
        self.errors = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=4096)
        self.last_activity = time.monotonic()

    def queue_tick(self, inputs: Any, last: bool = False) -> asyncio.Future:
        """Queue one tick of `inputs` (checked by the caller); a future of its result. TickError before
        queueing for a full queue or a closed client: the client is unchanged."""
        self.check_open()
        queued = self.queued(TICK)
        if queued >= self.scheduler.config.queue_depth:
            raise TickError(messages.QUEUE_FULL, messages.queue_full(queued))
        return self.enqueue(Item(TICK, self.scheduler.loop.create_future(), inputs, last, time.perf_counter()))

    def queued(self, kind: str) -> int:
        """Items of `kind` queued (ticks, or controls: any other kind)."""
        if kind == TICK:
            return sum(1 for item in self.queue if item.kind == TICK)
        return sum(1 for item in self.queue if item.kind != TICK)

    def reset(self) -> asyncio.Future:
        """Barge-in: back to the start after the ticks queued before it (a future, done when it is)."""
        self.check_open()
        queued = self.queued(RESET)
        if queued >= self.scheduler.config.queue_depth:
            raise TickError(messages.QUEUE_FULL, messages.resets_queue_full(queued))
        return self.enqueue(Item(RESET, self.scheduler.loop.create_future()))

    async def close(self) -> None:
        """Close after the items queued before it; the slot is free when this returns."""
        if self.closed:
            return
        if self.closing is None:
            await self.close_after(messages.CLIENT_CLOSED, "closed by the client")
        else:
            await self.closed_event.wait()

    def close_after(self, code: str, message: str) -> asyncio.Future:
        """Close with `code` once the items queued before it are done (a drain); no item is taken after it."""
        if self.closing is None:
            self.closing = (code, message)
            return self.enqueue(Item(CLOSE, self.scheduler.loop.create_future()))
        future = self.scheduler.loop.create_future()
        future.set_result(None)
        return future

    def abort(self, code: str, message: str) -> None:
        """Close now (a client gone, an idle timeout, the scheduler stopping): the queued ticks and resets fail
        with `code`; the slot is freed after the item in flight, if any."""
        if self.closed:
            return
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        error = SessionClosed(code, message)
        kept = [item for item in self.queue if item.kind == CLOSE]
        for item in self.queue:
            if item.kind != CLOSE and not item.future.done():
                item.future.set_exception(error)
                item.future.exception()  # retrieved: nobody may be waiting for it
        self.queue.clear()
        self.queue.extend(kept or [Item(CLOSE, self.scheduler.loop.create_future())])
        self.scheduler.wake()

    def covered_by(self, item: Item) -> list[Any]:
        """The clients `item` of this client's queue is for."""
        return item.covers if item.covers is not None else [self]

    def enqueue(self, item: Item) -> asyncio.Future:
        """Queue `item` (checked by the caller) and wake the scheduler; its future."""
        self.queue.append(item)
        self.last_activity = time.monotonic()
        self.scheduler.wake()
        return item.future

    def mark_closed(self) -> None:
        """Closed: every item still queued fails with the reason."""
        self.closed = True
        while self.queue:
            item = self.queue.popleft()
            if not item.future.done():
                code, message = self.closing or (messages.CLIENT_CLOSED, "closed by the client")
                item.future.set_exception(SessionClosed(code, message))
                item.future.exception()
        self.closed_event.set()

    def stats(self) -> SessionStats:
        recent = list(self.latencies)
        return SessionStats(
            self.id,
            self.seed,
            self.ticks,
            self.missed,
            self.errors,
            quantile(recent, 0.5),
            quantile(recent, 0.99),
            max(recent) if recent else None,
        )

    def stats_json(self) -> dict:
        return attrs.asdict(self.stats())


@attrs.define
class Round:
    """A round's work: each client's leading controls, then at most one tick of each client."""

    controls: list[tuple[Any, Item]] = attrs.field(factory=list)
    ticks: list[tuple[Any, Item]] = attrs.field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.controls or self.ticks)


@attrs.frozen
class RoundOutcome:
    """What a round gave: each control with the error it raised (None: done), each tick with its result or
    its TickError, the clients now failed (by the runner's handle, with the cause), the round's device time,
    when it ended and began (perf_counter seconds), and the units it stepped (admission's unit)."""

    controls: list[tuple[Any, Item, BaseException | None]]
    ticks: list[tuple[Any, Item, Any]]
    failed: Mapping[Any, str]
    round_s: float
    done_at: float
    units: int
    started_at: float


class RoundRunner(Protocol):
    """What a round computes, run on the scheduler's device thread: the controls (reset, close) of `work`,
    then one step of all its ticks together."""

    unit: str
    """What admission counts a round in: "session", "group", "conversation"."""

    def run(self, work: Round) -> RoundOutcome: ...


class Scheduler:
    """Clients' items in rounds on one device thread (see the module docstring). A subclass starts it:
    `open_device`, then its own loading on the device thread, then `begin(runner, rule, metrics)`."""

    def __init__(self, config: RoundSettings):
        self.config = config
        self.sessions: dict[int, Any] = {}
        """The open clients by id."""
        self.draining = False
        self.shutting_down = False
        self.stopping = False
        self.runner: RoundRunner | None = None
        self.rule: AdmissionRule | None = None
        self.metrics: PoolMetrics | None = None
        self.book: LatencyBook | None = None
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.device_stopped = False
        """Whether `stop()` has shut the device thread down (nothing runs on the device after)."""
        self.tick_period_s = 0.0
        self.gather_s = 0.0
        self.interval_s = 0.0
        """A client's ticks are stepped at most one per `interval_s` on average (0: no pace)."""
        self.held_until: float | None = None
        """The earliest time a tick held back by its client's pace may run (None: none is held)."""
        self.opening = 0
        """Clients being opened (admitted, not yet in `sessions`): admission counts them."""
        self.unreleased = 0
        """Clients whose close failed in the runner (logged): the client is closed, but what it held on the
        device may still be held, so admission and the capacity count each as open for good."""
        self.ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._empty: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._froze_gc = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the scheduler runs on (the one `open_device` ran on)."""
        if self._loop is None:
            raise RuntimeError("the session pool is not started: await pool.start() first")
        return self._loop

    @property
    def tick_latencies(self) -> collections.deque[float]:
        assert self.book is not None, "start() the pool first"
        return self.book.tick_latencies

    @property
    def round_log(self) -> collections.deque[tuple[int, float]]:
        assert self.book is not None, "start() the pool first"
        return self.book.round_log

    # --- lifecycle ---------------------------------------------------------------------------------

    def open_device(self, initializer: Callable[[], None] | None = None) -> None:
        """Take the running event loop and start the device thread (`initializer` runs on it first)."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "duplexcadence-device", initializer=initializer)

    def begin(
        self, runner: RoundRunner, rule: AdmissionRule, metrics: PoolMetrics, gather_s: float | None, gather: float
    ) -> None:
        """Start the rounds: `runner` steps them under `rule`, at the rule's tick period; a round gathers for
        `gather_s` (None: `gather` of the period). Then the scheduler, the idle reaper and the observer
        run."""
        self.runner = runner
        self.rule = rule
        self.metrics = metrics
        self.tick_period_s = rule.tick_period_s
        self.gather_s = gather * self.tick_period_s if gather_s is None else gather_s
        pace = self.config.pace
        self.interval_s = self.tick_period_s / pace if pace else 0.0
        self.book = LatencyBook(self.tick_period_s, rule.guard_window_s)
        self.refresh_gauges()
        if self.config.freeze_gc:
            gc.collect()  # the load's garbage goes now, not into the frozen generation
            gc.freeze()
            self._froze_gc = True
        self._tasks = [
            self.loop.create_task(self._schedule(), name="duplexcadence-scheduler"),
            self.loop.create_task(self._reap(), name="duplexcadence-idle-reaper"),
            self.loop.create_task(self._observe(), name="duplexcadence-observe"),
        ]

    async def stop(self) -> None:
        """Close every client (their queued items fail with `shutting-down`), stop the tasks and the device
        thread (after `unload` on it). The scheduler cannot start again."""
        if self.stopping:
            return
        self.stopping = True
        for client in list(self.sessions.values()):
            client.abort(messages.SHUTTING_DOWN, messages.shutting_down())
        if self.sessions and self._empty is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout=max(10.0, 10 * self.tick_period_s))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.observe_answered()
        if self.executor is not None:
            await self.run_on_device(self.unload)
            self.executor.shutdown(wait=True)
            self.device_stopped = True
        if self._froze_gc:
            gc.unfreeze()
            self._froze_gc = False

    async def shut_down(self, limit_s: float) -> None:
        """Drain for a shutdown: admit nothing new (`shutting-down`), answer every item already queued, then
        close each client with `shutting-down`; returns when none is left or after `limit_s` (`stop()` then
        closes the rest at once)."""
        self.shutting_down = True
        for client in list(self.sessions.values()):
            client.close_after(messages.SHUTTING_DOWN, messages.shutting_down())
        if self.sessions and self._empty is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout=limit_s)

    def unload(self) -> None:
        """On the device thread, last: what the subclass's loading changed, put back."""

    async def run_on_device(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run `function(*args)` on the device thread (after the work queued before it); from any event loop
        (the device thread is not the loop's)."""
        assert self.executor is not None, "start() the pool first"
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    # --- admission ---------------------------------------------------------------------------------

    def capacity(self) -> Capacity:
        """The snapshot a router places clients by: sessions, slots, capacity, free, predicted tick..."""
        assert self.rule is not None, "start() the pool first"
        return self.rule.snapshot(
            len(self.sessions) + self.unreleased,
            self.draining or self.stopping or self.shutting_down,
            self.lanes(),
            self.observed_tick_p99(),
        )

    def lanes(self) -> int:
        """The lanes the runner steps clients in, for the capacity record."""
        return 1

    def observed_tick_p99(self) -> float | None:
        """The p99 latency of the ticks answered in admission's guard window (None: none answered there)."""
        assert self.book is not None, "start() the pool first"
        return self.book.observed_p99()

    def keep_unreleased(self, client: str, error: BaseException) -> None:
        """`client`'s close failed on the device: logged once, and counted as open for good (`unreleased`)."""
        self.unreleased += 1
        LOG.error(
            "closing %s failed; its slot stays counted as used (%d so): %s: %s",
            client,
            self.unreleased,
            type(error).__name__,
            error,
        )

    def admission_refusal(self, extra: int = 1) -> AdmissionRefused | None:
        """Why `extra` more clients are not admitted now (None: they are), with the numbers."""
        assert self.rule is not None, "start() the pool first"
        active = len(self.sessions) + self.opening + self.unreleased
        if self.stopping or self.shutting_down:
            return AdmissionRefused(
                messages.SHUTTING_DOWN,
                messages.shutting_down(),
                active,
                0,
                self.rule.slots,
                self.rule.predict(active + extra),
                self.tick_period_s,
                self.config.headroom,
            )
        return self.rule.refusal(active, self.draining, self.observed_tick_p99())

    def refused(self, refusal: AdmissionRefused) -> AdmissionRefused:
        """`refusal`, counted in the metrics, to raise."""
        assert self.metrics is not None
        self.metrics.refused.labels(refusal.reason).inc()
        return refusal

    def add(self, client: Client) -> None:
        """An admitted client, opened: it is served from now on."""
        assert self.metrics is not None and self._empty is not None
        self.sessions[client.id] = client
        self._empty.clear()
        self.metrics.admitted.inc()
        self.refresh_gauges()

    def drain(self) -> None:
        """Admit no new client; the open ones keep their ticks until they close."""
        self.draining = True
        self.refresh_gauges()

    async def drained(self) -> None:
        """Wait until the scheduler holds no client."""
        assert self._empty is not None, "start() the pool first"
        await self._empty.wait()

    # --- the loop-side hooks -------------------------------------------------------------------------

    def screen(self, client: Any, resetting: bool) -> TickError | None:
        """The error that answers `client`'s next tick without the device (None: it runs); `resetting`: a
        reset of the client is in this round, ahead of the tick."""
        return None

    def choose(self, candidates: dict[Any, Item], work: Round) -> list[Any]:
        """Which clients' ready ticks (`candidates`) this round steps, besides the controls in `work`."""
        return list(candidates)

    def settle(self, outcome: RoundOutcome) -> None:
        """A round's outcome, on the loop, before its answers go out (the clients it failed)."""

    def answered(self, client: Any, item: Item) -> None:
        """`item` of `client` was done (a tick stepped, a reset done), before its future is."""

    def closed(self, client: Any) -> None:
        """`client` closed and left `sessions`."""

    def awaited(self, client: Any) -> bool:
        """Whether the gather waits for `client`'s tick (a failed or finished client sends none)."""
        return True

    # --- the rounds --------------------------------------------------------------------------------

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def wake_at(self, moment: float) -> None:
        """Scan the clients again at `moment` (perf_counter seconds) if nothing wakes the scheduler before:
        from `choose`, for work that becomes ready by the clock alone."""
        self.held_until = moment if self.held_until is None else min(self.held_until, moment)

    async def _schedule(self) -> None:
        assert self._wakeup is not None and self.runner is not None
        while True:
            await self._woken()
            self._wakeup.clear()
            while True:
                work = Round()
                try:
                    await self._gather()
                    self._collect(work)
                    if not work:
                        break
                    outcome = await self.run_on_device(self.runner.run, work)
                    self._deliver(outcome)
                except Exception as error:  # a fault of the scheduler itself (a bug): no client is left hanging
                    LOG.exception("a round failed")
                    self._fail_round(work, error)
                    self._fail_everyone(error)
                    continue
                if not self._wakeup.is_set():  # nothing queued (`_deliver` wakes it if anything is): the
                    break  # answers go out before the next scan of the clients

    async def _woken(self) -> None:
        """Wait for a wake-up, or until a tick held by its client's pace is due."""
        assert self._wakeup is not None
        if self.held_until is None:
            await self._wakeup.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), max(0.0, self.held_until - time.perf_counter()))

    async def _gather(self) -> None:
        """Hold the next round until every awaited idle client has something queued, or the oldest queued
        tick has waited `gather_s`, or a control is queued (never held)."""
        assert self._wakeup is not None
        while self.gather_s > 0:
            waiting = [
                c for c in self.sessions.values() if not c.in_flight and c.closing is None and c.queued_on is None
            ]
            heads = [c.queue[0] for c in waiting if c.queue]
            closing = any(c.closing is not None and c.queue for c in self.sessions.values())
            if not heads or closing or any(head.kind != TICK for head in heads):
                return
            if all(c.queue or not self.awaited(c) for c in waiting):
                return
            remaining = min(head.queued_at for head in heads) + self.gather_s - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _collect(self, work: Round) -> None:
        """Take this round's work into `work`: every idle client's leading controls and, if its next item is a
        tick, that tick (those `choose` picks). Ticks `screen` answers are answered here, without the device."""
        candidates: dict[Any, Item] = {}
        now = time.perf_counter()
        burst = (self.config.queue_depth - 1) * self.interval_s
        self.held_until = None
        for client in list(self.sessions.values()):
            if client.in_flight or client.closed:
                continue
            controls = []
            while client.queue and client.queue[0].kind != TICK:
                controls.append(client.queue.popleft())
                if controls[-1].kind == CLOSE:
                    break
            if controls:
                work.controls += [(client, item) for item in controls]
                client.in_flight = True
                if controls[-1].kind == CLOSE:
                    continue
            resetting = any(item.kind == RESET for item in controls)
            while client.queue and client.queue[0].kind == TICK:
                error = self.screen(client, resetting)
                if error is None:
                    break
                self.answer_error(client, client.queue.popleft(), error)
            if client.queue and client.queue[0].kind == TICK:
                if now < client.due - burst:  # ahead of its pace: held in its queue until due
                    due = client.due - burst
                    self.held_until = due if self.held_until is None else min(self.held_until, due)
                    continue
                candidates[client] = client.queue[0]
        for client in self.choose(candidates, work):
            work.ticks.append((client, client.queue.popleft()))
            client.in_flight = True
            client.due = max(client.due, now) + self.interval_s

    def answer_error(self, client: Client, item: Item, error: TickError) -> None:
        """Answer `item` with `error`, counted for every client it covers."""
        assert self.metrics is not None
        for member in client.covered_by(item):
            member.errors += 1
            self.metrics.tick_errors.labels(error.code).inc()
        if not item.future.done():
            item.future.set_exception(error)

    def _deliver(self, outcome: RoundOutcome) -> None:
        metrics, book = self.metrics, self.book
        assert metrics is not None and book is not None
        if outcome.ticks:
            book.round_log.append((outcome.units, outcome.round_s))
            metrics.round_seconds.observe(outcome.round_s)
            metrics.round_units.observe(outcome.units)
        self.settle(outcome)
        stepped = late = whole = 0
        for client, item, value in outcome.ticks:
            client.in_flight = False
            if isinstance(value, TickError):
                self.answer_error(client, item, value)
                continue
            if value is None:
                self.answer_error(client, item, TickError(messages.INTERNAL, "the round gave no outputs"))
                continue
            latency = outcome.done_at - item.queued_at
            members = client.covered_by(item)
            missed = book.record(latency, outcome.started_at - item.queued_at, len(members), outcome.done_at)
            whole += item.whole
            for member in members:
                member.ticks += 1
                member.missed += missed
                member.latencies.append(latency)
            stepped += len(members)
            late += missed * len(members)
            self.answered(client, item)
            if not item.future.done():
                item.future.set_result(value)
        book.forget(outcome.done_at)
        if stepped:
            metrics.ticks.inc(stepped)
        if whole:
            metrics.whole_group_ticks.inc(whole)
        if late:
            metrics.missed.inc(late)
        for client, item, error in outcome.controls:
            client.in_flight = False
            if item.kind == RESET:
                if error is None:
                    self.answered(client, item)
                    if not item.future.done():
                        item.future.set_result(None)
                elif not item.future.done():
                    item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
            else:
                if error is not None:
                    self.keep_unreleased(
                        f"{self.runner.unit if self.runner is not None else 'client'} {client.id}", error
                    )
                self._closed(client)
                if not item.future.done():
                    item.future.set_result(None)
        if any(client.queue for client in self.sessions.values()):
            self.wake()

    def _closed(self, client: Client) -> None:
        assert self.metrics is not None and self._empty is not None
        if client.closing is None:
            client.closing = (messages.CLIENT_CLOSED, "closed by the client")
        client.mark_closed()
        if self.sessions.pop(client.id, None) is not None:
            self.metrics.closed.labels(client.closing[0]).inc()
        self.closed(client)
        if not self.sessions:
            self._empty.set()
            assert self.book is not None
            self.book.clear_window()
        self.refresh_gauges()

    def _fail_everyone(self, error: BaseException) -> None:
        """After a fault of the scheduler's own: every client closed with `internal` (close 1011); the
        scheduler goes on, and new clients are served."""
        for client in list(self.sessions.values()):
            client.in_flight = False
            client.abort(messages.INTERNAL, messages.internal(error))

    def _fail_round(self, work: Round, error: BaseException) -> None:
        for client, item in work.controls + work.ticks:
            client.in_flight = False
            client.abort(messages.INTERNAL, messages.internal(error))
            if not item.future.done():
                item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
        self.wake()

    async def _reap(self) -> None:
        """Close the clients idle past the timeout (nothing queued, nothing in flight)."""
        timeout = self.config.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for client in list(self.sessions.values()):
                driver = client.queued_on or client
                idle = not driver.queue and not driver.in_flight and client.closing is None
                if idle and now - client.last_activity > timeout:
                    client.abort(messages.IDLE_TIMEOUT, messages.idle_timeout(timeout))

    async def _observe(self) -> None:
        """Every `OBSERVE_EVERY_S`: set the observed p99's gauge and the latency histograms."""
        while True:
            await asyncio.sleep(OBSERVE_EVERY_S)
            self.set_observed_gauge()
            self.observe_answered()

    # --- reports -----------------------------------------------------------------------------------

    def set_observed_gauge(self) -> None:
        assert self.metrics is not None
        observed = self.observed_tick_p99()
        self.metrics.observed_tick_p99.set(0.0 if observed is None else observed)

    def refresh_gauges(self) -> None:
        if self.metrics is None or self.rule is None:
            return
        snapshot = self.capacity()
        self.metrics.sessions_active.set(snapshot.sessions)
        self.metrics.predicted_tick.set(snapshot.predicted_tick_s)
        self.metrics.capacity.set(snapshot.capacity)
        self.metrics.draining.set(int(snapshot.draining))

    def observe_answered(self) -> None:
        """The latency histograms given the ticks answered since the last call."""
        if self.metrics is None or self.book is None:
            return
        for latency, wait, ticks in self.book.take_unobserved():
            for _ in range(ticks):
                self.metrics.tick_latency.observe(latency)
                self.metrics.tick_wait.observe(wait)

    def exposition(self) -> bytes:
        """The Prometheus text of the metrics, the observed p99's gauge set now."""
        assert self.metrics is not None, "start() the pool first"
        self.set_observed_gauge()
        self.observe_answered()
        return self.metrics.exposition()

    def deadlines(self) -> DeadlineReport:
        assert self.book is not None, "start() the pool first"
        return self.book.report(tuple(client.stats() for client in self.sessions.values()))
