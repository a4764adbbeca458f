"""The session pool: one tail's runtime on one device, its sessions stepped in rounds at the cadence.

    pool = SessionPool(served_tail("toy"), PoolConfig(slots=8, lanes=2))
    await pool.start()                      # load, warm every slot, calibrate the tick model
    session = await pool.open(seed=3)       # AdmissionRefused when it does not fit
    outputs = await session.step(codes=c)   # {"pcm": tensor on the host}
    await session.reset()                   # barge-in
    await session.close()

One thread owns the device (`run_on_device`): it loads the runtime, opens and closes sessions and runs the
rounds; the event loop never waits on the device. A round steps every session whose next queued item is a tick
(its controls first: reset, close), as one `Runtime.step_many` (in lockstep, over the groups whose members all
have a tick). Each session has one item in flight at most and a bounded queue, so its ticks run in the order
sent. A round starts as soon as the one before it ends and something is queued.

Admission (`admission.AdmissionRule`): a slot must be free and the calibrated tick with one more session must
stay under the tick period less the headroom. `capacity()` is the snapshot a router reads, `drain()` stops
admission while the sessions finish. Deadlines: a tick's latency runs from its arrival at the pool to its
outputs on the host; over the tick period it is missed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, AdmissionRule, Capacity, TickModel, fit
from duplexcadence.interpreter.serve.metrics import PoolMetrics
from duplexcadence.interpreter.serve.modes import (
    MODES,
    BundleTickError,
    StepResult,
    TensorSpec,
    TickError,
    WholeGroup,
)
from duplexcadence.interpreter.serve.placement import BoardSeat, WorkerLoad
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

REPORT_EVERY_S = 1.0
PUBLISH_EVERY_S = 0.1
"""How often a pool on a placement board publishes its load, besides at each open, close and refusal, and sets
its observed p99 and latency histograms (also set at each scrape)."""
GATHER_FRACTION = 0.05
LATENCY_WINDOW = 65536
ACCEPTED_KINDS = 1024


@attrs.frozen
class PoolConfig:
    """How a pool serves its tail.

    `slots`: runtime session slots (with `lockstep`, groups of `lockstep` sessions each); `lanes`: sessions
    stepped concurrently (see `Runtime.load`); `headroom`: the fraction of the tick period admission keeps free;
    `idle_timeout_s`: a session that sends nothing this long is closed; `queue_depth`: ticks a session may
    have queued beside the one in flight. `tick_period_s`: None takes the plan's (cadence over instants).
    `tick_model`: None calibrates one at start (`calibration_sizes` units, None: 1, min(units, 2 x lanes) and
    every unit; after `calibration_warmup` rounds, the median of `calibration_repeats`); a given model skips
    the calibration. `enforce_tick_budget`: False admits up to the slots whatever the model predicts (a
    benchmark that finds the limit itself).
    `latency_guard`: also refuse while the p99 latency of the ticks answered in the last 5 tick periods is
    over the budget (admission.py); False admits on the model alone.
    `warm_slots`: open every slot once at start (on CUDA: capture its graphs before any session waits).
    `deterministic`: cuDNN's deterministic algorithms while the pool runs (outputs equal to stock eager).
    `freeze_gc`: once started, move every object then alive (the model, the runtime, its graphs) out of the
    cyclic garbage collector's generations (`gc.freeze()`), so that a full collection while serving walks only
    what serving allocates: over a loaded model it walks hundreds of thousands of objects, holding the GIL,
    and every thread (the event loop, the device thread, the lanes) stalls for its length. `stop()` puts
    them back (`gc.unfreeze()`), so that a stopped pool's objects can be collected.
    `gather_s`: how long a round may wait, from its oldest tick's arrival, for the other sessions' ticks
    (sessions paced by the same cadence arrive a few milliseconds apart; one round for all of them costs less
    than two); None: 5 % of the tick period; 0: a round starts as soon as anything is queued.
    """

    slots: int = 1
    lanes: int = 1
    lockstep: int | None = None
    headroom: float = 0.15
    idle_timeout_s: float = 30.0
    queue_depth: int = 4
    tick_period_s: float | None = None
    tick_model: TickModel | None = None
    calibration_sizes: tuple[int, ...] | None = None
    calibration_warmup: int = 2
    calibration_repeats: int = 5
    enforce_tick_budget: bool = True
    latency_guard: bool = True
    warm_slots: bool = True
    deterministic: bool = True
    freeze_gc: bool = True
    gather_s: float | None = None

    def problems(self) -> list[str]:
        found = []
        if self.slots < 1:
            found.append(f"slots must be at least 1, not {self.slots}")
        if not 1 <= self.lanes <= max(self.slots, 1):
            found.append(f"lanes must be from 1 to slots ({self.slots}), not {self.lanes}")
        if self.lockstep is not None and self.lockstep < 1:
            found.append(f"lockstep rows must be at least 1, not {self.lockstep}")
        if not 0.0 <= self.headroom < 1.0:
            found.append(f"headroom must be from 0 to below 1, not {self.headroom}")
        if not self.idle_timeout_s > 0:
            found.append(f"the idle timeout must be above 0 s, not {self.idle_timeout_s}")
        if self.queue_depth < 1:
            found.append(f"the queue depth must be at least 1, not {self.queue_depth}")
        if self.tick_period_s is not None and not self.tick_period_s > 0:
            found.append(f"the tick period must be above 0 s, not {self.tick_period_s}")
        if self.gather_s is not None and not self.gather_s >= 0:
            found.append(f"the gather time must be 0 s or more, not {self.gather_s}")
        return found


class SessionClosed(TickError):
    """A tick, reset or close of a session that is closed (or closing): `code` says why it closed."""


@attrs.define(eq=False)
class Item:
    kind: str  # "tick", "reset" or "close"
    future: asyncio.Future = attrs.field(repr=False)
    inputs: dict[str, torch.Tensor] | None = attrs.field(default=None, repr=False)
    last: bool = False
    queued_at: float = 0.0
    whole: bool = False  # a fused bundle's: for every session of the lead's `fused` rows


@attrs.frozen
class SessionStats:
    """One session's deadline accounting: ticks stepped, ticks missed (latency over the period), ticks answered
    with an error, and the latency quantiles of its recent ticks (seconds; None before the first)."""

    id: int
    seed: int
    ticks: int
    missed: int
    errors: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(round(q * len(ordered), 9)) - 1))
    return ordered[rank]


class ClosingState:
    """Why a session closed or is closing, for a pool's session and a front's proxy of one: `closing` is
    (code, message), None while it is open."""

    closing: tuple[str, str] | None = None

    @property
    def close_code(self) -> str | None:
        """Why the session closed or is closing (an error code of `messages`, or "closed": asked to)."""
        return self.closing[0] if self.closing else None

    @property
    def close_message(self) -> str | None:
        return self.closing[1] if self.closing else None

    def check_open(self) -> None:
        """SessionClosed, saying why, once the session is closed or closing."""
        if self.closing is not None:
            raise SessionClosed(self.closing[0], messages.session_closed(self.closing[1]))


class PooledSession(ClosingState):
    """One client's session in the pool. Its ticks run in the order submitted, one in flight at a time."""

    def __init__(self, pool: SessionPool, session_id: int, seed: int, handle: Any, group: int | None):
        self.pool = pool
        self.id = session_id
        self.seed = seed
        self.handle = handle  # the mode's: a runtime Session, or a lockstep Member (the device thread's)
        self.group = group
        self.queue: collections.deque[Item] = collections.deque()
        self.in_flight = False
        self.closing = None
        self.closed = False
        self.closed_event = asyncio.Event()
        self.failed: str | None = None
        self.finished = False
        self.fused: list[PooledSession] | None = None
        """On the lead of a bundle's fused group (the member in its first row): the group's sessions in row
        order; their ticks and resets are queued here, whole."""
        self.driven_by: PooledSession | None = None
        """On the other sessions of a fused group: its lead, which queues for them."""
        self.ticks = 0
        self.missed = 0
        self.errors = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=4096)
        self.last_activity = time.monotonic()

    def submit(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> asyncio.Future:
        """Queue one tick; a future of its outputs (by name, on the host). Raises TickError before queueing
        for inputs the tail cannot take, a full queue or a closed session: the session is unchanged."""
        self.check_open()
        self.pool.check_inputs(inputs, last)
        queued = sum(1 for item in self.queue if item.kind == "tick")
        if queued >= self.pool.config.queue_depth:
            raise TickError(messages.QUEUE_FULL, messages.queue_full(queued))
        return self._queue(Item("tick", self.pool.loop.create_future(), dict(inputs), last, time.perf_counter()))

    def submit_frame(self, data: bytes | bytearray | memoryview) -> asyncio.Future:
        """Queue one tick sent as a tensor frame (`codec`): decoded, then `submit`. Raises codec.FrameError
        or TickError before queueing, counted in the session's errors and the pool's metrics."""
        try:
            frame = codec.decode(data)
            return self.submit(frame.tensors, frame.last)
        except (codec.FrameError, TickError) as error:
            self.errors += 1
            if self.pool.metrics is not None:
                self.pool.metrics.tick_errors.labels(error.code).inc()
            raise

    async def step(self, inputs: Mapping[str, torch.Tensor] | None = None, last: bool = False, **named) -> dict:
        """One tick: `inputs` by name (or as keywords); its outputs by name. TickError if it did not run."""
        return await self.submit({**(inputs or {}), **named}, last)

    def reset(self) -> asyncio.Future:
        """Barge-in: back to the start after the ticks queued before it (a future, done when it is)."""
        self.check_open()
        if sum(1 for item in self.queue if item.kind != "tick") >= self.pool.config.queue_depth:
            raise TickError(messages.QUEUE_FULL, messages.queue_full(len(self.queue)))
        return self._queue(Item("reset", self.pool.loop.create_future()))

    async def close(self) -> None:
        """Close after the ticks queued before it; the slot is free when this returns."""
        if self.closed:
            return
        if self.closing is None:
            self.closing = (messages.CLIENT_CLOSED, "closed by the client")
            future = self._queue(Item("close", self.pool.loop.create_future()))
            await future
        else:
            await self.closed_event.wait()

    def abort(self, code: str, message: str) -> None:
        """Close now (a client gone, an idle timeout, the pool stopping): the queued ticks and resets fail with
        `code`; the slot is freed after the item in flight, if any."""
        if self.closed:
            return
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        error = SessionClosed(code, message)
        kept = [item for item in self.queue if item.kind == "close"]
        for item in self.queue:
            if item.kind != "close" and not item.future.done():
                item.future.set_exception(error)
                item.future.exception()  # retrieved: nobody may be waiting for it
        self.queue.clear()
        self.queue.extend(kept or [Item("close", self.pool.loop.create_future())])
        self.pool.wake()

    def stepped_by(self, item: Item) -> list[PooledSession]:
        """The sessions `item` of this session's queue is for: every session of its fused group when it is
        whole, else this one."""
        return self.fused if item.whole and self.fused is not None else [self]

    def _queue(self, item: Item) -> asyncio.Future:
        self.queue.append(item)
        self.last_activity = time.monotonic()
        self.pool.wake()
        return item.future

    def _mark_closed(self) -> None:
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

    def info(self) -> dict:
        """What the server's `ready` frame says of the session."""
        row = getattr(self.handle, "row", None)
        return {"session": self.id, "seed": self.seed, "group": self.group, "row": row}


class Bundle(ClosingState):
    """Sessions of one pool opened together and stepped as one (`SessionPool.open_bundle`): a tick's inputs
    stack the members' on a new leading axis, in member order, and its outputs stack theirs the same way. Each
    member is a `PooledSession` of its own (its slot, its lockstep row, its accounting); the bundle submits a
    tick to every member or to none, and closes them together: when one closes (the idle timeout, a fault, the
    pool stopping), the others close with its reason.

    In lockstep, a bundle whose members fill whole groups, in row order (`fused`), queues one item a group:
    the group's batched inputs, stepped whole, its outputs unbatched once, instead of a tick a member."""

    def __init__(self, pool: SessionPool, members: list[PooledSession], fused: list[list[PooledSession]] | None):
        self.pool = pool
        self.members = members
        self.fused = fused
        self.closing = None
        self.closed_event = asyncio.Event()
        self._pending: set[asyncio.Future] = set()
        for group in fused or ():
            group[0].fused = group
            for member in group[1:]:
                member.driven_by = group[0]
        self._watch = pool.loop.create_task(self._close_together(), name="duplexcadence-bundle")

    @property
    def id(self) -> int:
        """The bundle's id: its first member's."""
        return self.members[0].id

    def info(self) -> dict:
        """What the `ready` frame says of the bundle: its size and each member's session."""
        return {"bundle": len(self.members), "members": [member.info() for member in self.members]}

    def submit(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> asyncio.Future:
        """Queue one tick of every member (`inputs[name][i]` is member i's); a future of the stacked outputs.
        Raises TickError before queueing for inputs a member cannot take, a member's full queue or a closed
        bundle: every member is then unchanged."""
        self.check_open()
        count = len(self.members)
        for name, tensor in inputs.items():
            if tensor.dim() == 0 or tensor.shape[0] != count:
                found = list(tensor.shape)
                raise TickError(messages.WRONG_SHAPE, messages.bundle_shape(name, found, count))
        # the members' inputs share dtypes and shapes: one member's check is every member's
        self.pool.check_inputs({name: tensor[0] for name, tensor in inputs.items()}, last)
        depth = self.pool.config.queue_depth
        for member in self.members:
            member.check_open()
            queued = sum(1 for item in member.queue if item.kind == "tick")
            if queued >= depth:
                raise TickError(messages.QUEUE_FULL, messages.queue_full(queued))
        loop, now = self.pool.loop, time.perf_counter()  # checked above for every member: queued as they are
        if self.fused is None:
            rows: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
            for name, tensor in inputs.items():
                for row, member_input in zip(rows, tensor.unbind(0), strict=True):
                    row[name] = member_input
            ticks = [
                member._queue(Item("tick", loop.create_future(), row, last, now))
                for member, row in zip(self.members, rows, strict=True)
            ]
            return self._joined(ticks, [[index] for index in range(count)], self._stacked)
        axes = self.pool.mode.axes
        futures: list[asyncio.Future] = []
        owners: list[list[int]] = []
        first = 0
        for group in self.fused:
            size = len(group)
            batch = {
                name: tensor[first : first + size].squeeze(axes[name] + 1).movedim(0, axes[name]).contiguous()
                for name, tensor in inputs.items()
            }
            active_at = time.monotonic()
            for member in group:
                member.last_activity = active_at  # its ticks are queued on the group's lead
            futures.append(group[0]._queue(Item("tick", loop.create_future(), batch, last, now, whole=True)))
            owners.append(list(range(first, first + size)))
            first += size
        return self._joined(futures, owners, self._unbatched)

    def submit_frame(self, data: bytes | bytearray | memoryview) -> asyncio.Future:
        """Queue one tick sent as a tensor frame (`codec`) of the stacked inputs: decoded, then `submit`."""
        try:
            frame = codec.decode(data)
            return self.submit(frame.tensors, frame.last)
        except (codec.FrameError, TickError) as error:
            for member in self.members:
                member.errors += 1
            if self.pool.metrics is not None:
                self.pool.metrics.tick_errors.labels(error.code).inc(len(self.members))
            raise

    def reset(self) -> asyncio.Future:
        """Barge-in of every member, after the ticks queued before it (a future, done when all are)."""
        self.check_open()
        depth = self.pool.config.queue_depth
        for member in self.members:
            member.check_open()
            if sum(1 for item in member.queue if item.kind != "tick") >= depth:
                raise TickError(messages.QUEUE_FULL, messages.queue_full(len(member.queue)))
        if self.fused is None:
            resets = [member.reset() for member in self.members]
            return self._joined(resets, [[index] for index in range(len(self.members))], None)
        loop, first = self.pool.loop, 0
        futures: list[asyncio.Future] = []
        owners: list[list[int]] = []
        for group in self.fused:
            active_at = time.monotonic()
            for member in group:
                member.last_activity = active_at
            futures.append(group[0]._queue(Item("reset", loop.create_future(), whole=True)))
            owners.append(list(range(first, first + len(group))))
            first += len(group)
        return self._joined(futures, owners, None)

    async def close(self) -> None:
        """Close every member after the ticks queued before it; their slots are free when this returns."""
        if self.closing is None:
            self.closing = (messages.CLIENT_CLOSED, "closed by the client")
            if self._pending:  # a fused group's items are queued on its lead alone: let them run first
                await asyncio.wait(list(self._pending))
            await asyncio.gather(*(member.close() for member in self.members))
        await self.closed_event.wait()

    def abort(self, code: str, message: str) -> None:
        """Close every member now (the client gone, the pool stopping): as `PooledSession.abort`."""
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        for member in self.members:
            member.abort(code, message)

    def stats_json(self) -> dict:
        return {"members": [member.stats_json() for member in self.members]}

    async def _close_together(self) -> None:
        waits = [asyncio.ensure_future(member.closed_event.wait()) for member in self.members]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            first = next(member for member, wait in zip(self.members, waits, strict=True) if wait in done)
            code, message = first.closing or (messages.CLIENT_CLOSED, "closed by the client")
            if self.closing is None:
                self.closing = (code, message)
            for member in self.members:
                if member.closing is None:
                    member.abort(code, message)
            await asyncio.gather(*waits)
        finally:
            for wait in waits:
                wait.cancel()
            self.closed_event.set()

    @staticmethod
    def _stacked(results: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {name: torch.stack([result[name] for result in results]) for name in results[0]}

    def _unbatched(self, results: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Fused groups' batched outputs as the members' stacked: the batch axis moved to the front, each
        member's batch axis of 1 in its place."""
        axes = self.pool.mode.axes
        parts = {
            name: [result[name].movedim(axes[name], 0).unsqueeze(axes[name] + 1) for result in results]
            for name in results[0]
        }
        return {name: tensors[0] if len(tensors) == 1 else torch.cat(tensors) for name, tensors in parts.items()}

    def _joined(
        self,
        futures: list[asyncio.Future],
        owners: list[list[int]],
        outputs: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]] | None,
    ) -> asyncio.Future:
        """A future done when every one of `futures` is (`owners[i]`: the members future i is for): the
        `outputs` of their results, or None; else a BundleTickError naming the members whose item failed (the
        first one's code and message)."""
        joined = self.pool.loop.create_future()
        left = [len(futures)]

        def one_done(_: asyncio.Future) -> None:
            left[0] -= 1
            if left[0] or joined.done():
                return
            failed = [
                (owner, None if f.cancelled() else f.exception())
                for owner, f in zip(owners, futures, strict=True)
                if f.cancelled() or f.exception() is not None
            ]
            if failed:
                errors = [error for _, error in failed if isinstance(error, TickError)]
                code, message = (errors[0].code, errors[0].message) if errors else (messages.INTERNAL, "cancelled")
                joined.set_exception(BundleTickError(code, message, [index for owner, _ in failed for index in owner]))
                joined.exception()  # retrieved: a closed bundle's answers may have no reader
            elif outputs is not None:
                joined.set_result(outputs([f.result() for f in futures]))
            else:
                joined.set_result(None)

        for future in futures:
            future.add_done_callback(one_done)
            if self.fused is not None:
                self._pending.add(future)
                future.add_done_callback(self._pending.discard)
        return joined


@attrs.frozen
class DeadlineReport:
    """The pool's deadline accounting: session ticks stepped and missed since start, their latency
    quantiles over the last ticks (seconds), and every open session's own numbers."""

    ticks: int
    missed: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None
    tick_period_s: float
    sessions: tuple[SessionStats, ...]

    def to_json(self) -> dict:
        data = attrs.asdict(self, recurse=False)
        data["sessions"] = [attrs.asdict(stats) for stats in self.sessions]
        return data


@attrs.define
class Round:
    controls: list[tuple[PooledSession, Item]] = attrs.field(factory=list)
    ticks: list[tuple[PooledSession, Item]] = attrs.field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.controls or self.ticks)


@attrs.frozen
class RoundOutcome:
    controls: list[tuple[PooledSession, Item, BaseException | None]]
    ticks: list[tuple[PooledSession, Item, Any]]  # outputs dict, or a TickError
    failed: dict[Any, str]
    round_s: float
    done_at: float
    units: int
    started_at: float


class SessionPool:
    """Sessions of one tail on one device (see the module docstring)."""

    def __init__(self, served: ServedTail, config: PoolConfig | None = None, placement: BoardSeat | None = None):
        """`placement`: this pool's seat on the board of the workers of one port (`placement.PlacementBoard`):
        the pool publishes its load there and leaves a new session to a worker that takes it at a lower cost."""
        self.served = served
        self.config = config or PoolConfig()
        self.placement = placement
        problems = self.config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.sessions: dict[int, PooledSession] = {}
        self.draining = False
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.loaded: LoadedTail | None = None
        self.mode: Any = None
        self.rule: AdmissionRule | None = None
        self.metrics: PoolMetrics | None = None
        self.tick_period_s = 0.0
        self.gather_s = 0.0
        self.started_s = 0.0
        self._ids = itertools.count(1)
        self._opening = 0
        self._opening_groups: collections.Counter = collections.Counter()
        self._wakeup: asyncio.Event | None = None
        self._empty: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self.tick_latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        """The latency of the last session ticks (seconds), oldest first."""
        self.round_log: collections.deque[tuple[int, float]] = collections.deque(maxlen=LATENCY_WINDOW)
        """(units stepped, seconds) of the last rounds on the device, oldest first."""
        self.answered: collections.deque[tuple[float, float]] = collections.deque(maxlen=LATENCY_WINDOW)
        """(answered at, latency) of the ticks answered in admission's guard window (perf_counter seconds)."""
        self._answered_version = 0
        self._observed_p99: tuple[int, float, float | None] = (-1, 0.0, None)
        """`observed_tick_p99()` as last taken: (answered's version, until when it holds, the p99)."""
        self._unobserved: list[tuple[float, float, int]] = []
        """(latency, wait, session ticks) answered but not yet in the latency histograms: observing each
        session tick costs the event loop about a microsecond, so it is done off the answers' path."""
        self._ticks = 0
        self._missed = 0
        self._report_at = 0.0
        self._input_specs: dict[str, TensorSpec] | None = None
        self._accepted: set[tuple[str, torch.dtype, torch.Size]] = set()
        """(input, dtype, shape) that passed the checks (a stream repeats them: they are checked once)."""
        self._previous_cudnn: tuple[bool, bool] | None = None
        self._froze_gc = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the pool runs on (the one `start()` ran on)."""
        if self._loop is None:
            raise RuntimeError("the session pool is not started: await pool.start() first")
        return self._loop

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the tail's runtime on the device thread, warm every slot, calibrate (unless a model is
        given), then start the scheduler and the idle reaper. ValueError for a mode the plan cannot take."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._bundles_opening = asyncio.Lock()
        self._bundle_groups: set[int] = set()  # lockstep groups a bundle fills or holds whole
        self._empty = asyncio.Event()
        self._empty.set()
        device = torch.device(self.served.device)
        if device.type == "cuda" and device.index is None:  # set_device needs an index: "cuda" is the current one
            device = torch.device("cuda", torch.cuda.current_device())
        initializer = (lambda: torch.cuda.set_device(device)) if device.type == "cuda" else None
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "duplexcadence-device", initializer=initializer)
        started = time.perf_counter()
        try:
            model = await self.run_on_device(self._load)
        except BaseException:
            await self.run_on_device(self._unload)
            self.executor.shutdown(wait=False)
            raise
        self.started_s = time.perf_counter() - started
        self.tick_period_s = self.config.tick_period_s or self.mode.facts.tick_period_s
        self.gather_s = GATHER_FRACTION * self.tick_period_s if self.config.gather_s is None else self.config.gather_s
        self.rule = AdmissionRule(
            self.mode.session_slots,
            self.config.lockstep,
            model,
            self.tick_period_s,
            self.config.headroom,
            self.config.enforce_tick_budget,
            self.config.latency_guard,
        )
        self.metrics = PoolMetrics(self.tick_period_s)
        self.metrics.slots.set(self.mode.session_slots)
        assert self.loaded is not None
        self.metrics.take_report(await self.run_on_device(self.loaded.runtime.report))
        self._refresh_gauges()
        if self.config.freeze_gc:
            gc.collect()  # the load's garbage goes now, not into the frozen generation
            gc.freeze()
            self._froze_gc = True
        self._tasks = [
            self.loop.create_task(self._schedule(), name="duplexcadence-scheduler"),
            self.loop.create_task(self._reap(), name="duplexcadence-idle-reaper"),
            self.loop.create_task(self._republish(), name="duplexcadence-republish"),
        ]

    def _load(self) -> TickModel:
        config = self.config
        if config.deterministic:
            self._previous_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        rows = config.lockstep
        self.loaded = self.served.load(sessions=config.slots, lanes=config.lanes, rows=rows)
        if rows is None:
            self.mode = MODES["lanes"](self.loaded, config.slots)
        else:
            self.mode = MODES["lockstep"](self.loaded, config.slots, rows, self.served.batch_param)
        if config.warm_slots:
            self.mode.warm()
        if config.tick_model is not None:
            return attrs.evolve(config.tick_model, unit=self.mode.unit)
        return self._calibrate()

    def _inputs_of(self, seed: int, instant: int) -> dict[str, torch.Tensor]:
        if self.served.inputs is not None:
            return self.served.inputs(seed, instant)
        return self.mode.facts.zeros(instant)

    def _calibrate(self) -> TickModel:
        config, mode = self.config, self.mode
        units = mode.units()
        # the full pool too: past a few units a round can cost more per unit (the device saturates), and
        # admission decides at the top of the range
        sizes = config.calibration_sizes or tuple(sorted({1, min(units, max(2, 2 * config.lanes)), units}))
        sizes = tuple(sorted({min(max(size, 1), units) for size in sizes}))
        opened = mode.calibration_units(max(sizes))
        samples: dict[int, list[float]] = {size: [] for size in sizes}
        try:
            for _ in range(config.calibration_warmup):
                self._calibration_round(mode.unit_ticks(opened, self._inputs_of))
            for _ in range(config.calibration_repeats):
                for size in sizes:
                    samples[size].append(self._calibration_round(mode.unit_ticks(opened[:size], self._inputs_of)))
        finally:
            mode.release_calibration(opened)
        return fit([(size, statistics.median(times)) for size, times in samples.items()], mode.unit)

    def _calibration_round(self, ticks: list) -> float:
        started = time.perf_counter()
        result: StepResult = self.mode.step(ticks)
        elapsed = time.perf_counter() - started
        if result.errors:
            error = next(iter(result.errors.values()))
            raise RuntimeError(f"the calibration's ticks failed: {error.message}")
        return elapsed

    async def stop(self) -> None:
        """Close every session (their queued items fail with `shutting-down`), stop the tasks and the device
        thread. The pool cannot start again."""
        if self.stopping:
            return
        self.stopping = True
        self._publish()
        for session in list(self.sessions.values()):
            session.abort(messages.SHUTTING_DOWN, messages.shutting_down())
        if self.sessions and self._empty is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout=max(10.0, 10 * self.tick_period_s))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._observe_answered()
        if self.executor is not None:
            await self.run_on_device(self._unload)
            self.executor.shutdown(wait=True)
        if self._froze_gc:
            gc.unfreeze()
            self._froze_gc = False

    def _unload(self) -> None:
        if self._previous_cudnn is not None:
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self._previous_cudnn

    async def run_on_device(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run `function(*args)` on the pool's device thread (after the work queued before it); from any event
        loop (the device thread is not the loop's)."""
        assert self.executor is not None, "start() the pool first"
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    # --- admission ---------------------------------------------------------------------------------

    def capacity(self) -> Capacity:
        """The snapshot a router places sessions by: sessions, slots, capacity, free, predicted tick..."""
        assert self.rule is not None, "start() the pool first"
        return self.rule.snapshot(
            len(self.sessions),
            self.draining or self.stopping,
            self.config.lanes,
            self._shared_units(),
            self.observed_tick_p99(),
        )

    def observed_tick_p99(self) -> float | None:
        """The p99 latency of the ticks answered in admission's guard window (None: none answered there)."""
        assert self.rule is not None, "start() the pool first"
        now = time.perf_counter()
        version, valid_until, value = self._observed_p99
        if version == self._answered_version and now < valid_until:
            return value  # no tick answered, none left the window: every close of a bundle's members reads it
        since = now - self.rule.guard_window_s
        recent = [(at, latency) for at, latency in list(self.answered) if at >= since]
        value = quantile([latency for _, latency in recent], 0.99)
        valid_until = recent[0][0] + self.rule.guard_window_s if recent else math.inf
        self._observed_p99 = (self._answered_version, valid_until, value)
        return value

    def drain(self) -> None:
        """Admit no new session; the open ones keep their ticks until they close."""
        self.draining = True
        self._refresh_gauges()

    async def drained(self) -> None:
        """Wait until the pool holds no session."""
        assert self._empty is not None, "start() the pool first"
        await self._empty.wait()

    async def open(self, seed: int = 0) -> PooledSession:
        """A new session (its RNG seeded with `seed`); AdmissionRefused, with the numbers, when it does not fit."""
        return await self._open(seed, None)

    async def _open(self, seed: int, group_choice: int | None) -> PooledSession:
        """`open`, in lockstep into `group_choice` when given (a group with a free row), else the group
        `_group_for_new_session` picks."""
        assert self.rule is not None and self.metrics is not None, "start() the pool first"
        active = len(self.sessions) + self._opening
        refusal: AdmissionRefused | None
        if self.stopping:
            refusal = AdmissionRefused(
                messages.SHUTTING_DOWN,
                messages.shutting_down(),
                active,
                0,
                self.rule.slots,
                self.rule.predict(active + 1),
                self.tick_period_s,
                self.config.headroom,
            )
        else:
            observed = self.observed_tick_p99()
            refusal = self.rule.refusal(active, self.draining, self._shared_units(), observed)
            refusal = refusal or self._placed_elsewhere(active)
        if refusal is not None:
            self.metrics.refused.labels(refusal.reason).inc()
            self._publish()  # whether it admits depends on the other workers' units too: say it as it is now
            raise refusal
        rows = self.config.lockstep
        if group_choice is not None and rows is not None and self._rows_taken()[group_choice] >= rows:
            group_choice = None  # taken meanwhile by a session that found no other room
        group = self._group_for_new_session() if group_choice is None else group_choice
        self._opening += 1
        if group is not None:
            self._opening_groups[group] += 1
        self._publish()
        try:
            handle = await self.run_on_device(self.mode.join, seed, group)
        except BaseException:
            self._opened(group)
            self._publish()
            raise
        self._opened(group)
        session = PooledSession(self, next(self._ids), seed, handle, group)
        self.sessions[session.id] = session
        assert self._empty is not None
        self._empty.clear()
        self.metrics.admitted.inc()
        self._refresh_gauges()
        return session

    async def open_bundle(self, count: int, seed: int = 0) -> Bundle:
        """`count` sessions opened together (seeds `seed`, `seed + 1`, ...) as one `Bundle`, or none of them:
        AdmissionRefused, saying how many fitted, when one does not fit (the ones opened are closed again)."""
        if count < 1:
            raise ValueError(f"a bundle holds at least 1 session, not {count}")
        assert self.rule is not None, "start() the pool first"
        active = len(self.sessions) + self._opening
        free = max(0, self.rule.slots - active)
        if count > free:  # refused before any session is opened
            assert self.metrics is not None
            self.metrics.refused.labels(messages.AT_CAPACITY).inc()
            message = messages.bundle_over_slots(count, free, self.rule.slots)
            shared = self._shared_units()
            raise AdmissionRefused(
                messages.AT_CAPACITY,
                message,
                active,
                self.rule.capacity(shared),
                self.rule.slots,
                self.rule.predict(active + count, shared),
                self.tick_period_s,
                self.config.headroom,
            )
        members: list[PooledSession] = []
        rows = self.config.lockstep
        reserved: list[int] = []
        try:
            async with self._bundles_opening:  # bundles open one at a time: their members fill groups of their own
                group_of_chunk = None
                for index in range(count):
                    choice = None
                    if rows is not None and count - (index - index % rows) >= rows:  # in a whole group of its own
                        if index % rows == 0:
                            group_of_chunk = self._empty_group()
                            if group_of_chunk is not None:
                                self._bundle_groups.add(group_of_chunk)
                                reserved.append(group_of_chunk)
                        choice = group_of_chunk
                    members.append(await self._open(seed + index, choice))
        except AdmissionRefused as refusal:
            self._bundle_groups.difference_update(reserved)
            await asyncio.gather(*(member.close() for member in members))
            message = messages.bundle_refused(count, len(members), refusal.message)
            numbers = (refusal.sessions, refusal.capacity, refusal.slots, refusal.predicted_tick_s)
            raise AdmissionRefused(refusal.reason, message, *numbers, refusal.tick_period_s, refusal.headroom) from None
        except BaseException:
            self._bundle_groups.difference_update(reserved)
            for member in members:
                member.abort(messages.INTERNAL, "its bundle did not open")
            raise
        whole = self._whole_groups(members)
        if whole is None:
            self._bundle_groups.difference_update(reserved)
        return Bundle(self, members, whole)

    def _empty_group(self) -> int | None:
        """The first lockstep group with no member, none being opened and no bundle filling it (None: none)."""
        taken = self._rows_taken()
        groups = range(self.config.slots)
        return next((group for group in groups if taken[group] == 0 and group not in self._bundle_groups), None)

    def _whole_groups(self, members: list[PooledSession]) -> list[list[PooledSession]] | None:
        """`members` cut into the lockstep groups they fill, each in row order, when they fill whole groups that
        hold nobody else (a bundle's fused groups); else None."""
        rows = self.config.lockstep
        if rows is None or len(members) % rows:
            return None
        groups = [members[start : start + rows] for start in range(0, len(members), rows)]
        for group in groups:
            if any(
                held is not member.handle for held, member in zip(group[0].handle.group.members, group, strict=True)
            ):
                return None
        return groups

    def _opened(self, group: int | None) -> None:
        self._opening -= 1
        if group is not None:
            self._opening_groups[group] -= 1

    def _rows_taken(self) -> collections.Counter:
        """Rows taken in each lockstep group, the sessions being opened included."""
        return collections.Counter(s.group for s in self.sessions.values()) + self._opening_groups

    def _group_for_new_session(self) -> int | None:
        """The fullest group that has members and a free row, else the first empty one: sessions fill the
        groups already stepped before another group is stepped."""
        rows = self.config.lockstep
        if rows is None:
            return None
        taken = self._rows_taken()

        def fullest(groups: list[int]) -> int | None:
            running = [group for group in groups if 0 < taken[group] < rows]
            if running:
                return max(running, key=lambda group: (taken[group], -group))
            return next((group for group in groups if taken[group] == 0), None)

        # a group a bundle fills or holds whole is taken last: a bundle's group with a session of its own
        # steps its members one by one
        every = list(range(self.config.slots))
        choice = fullest([group for group in every if group not in self._bundle_groups])
        choice = fullest(every) if choice is None else choice
        if choice is None:
            raise AssertionError("admission let in a session with every row taken")
        return choice

    def placement_load(self) -> WorkerLoad:
        """This pool's load as a placement board holds it: whether it admits a session now, the units it
        steps (groups with members, or sessions) and the free rows of its groups with members."""
        assert self.rule is not None, "start() the pool first"
        active = len(self.sessions) + self._opening
        refusal = self.rule.refusal(active, self.draining, self._shared_units(), self.observed_tick_p99())
        admits = not self.stopping and refusal is None
        rows = self.config.lockstep
        if rows is None:
            return WorkerLoad(admits, active)
        running = [count for count in self._rows_taken().values() if count > 0]
        return WorkerLoad(admits, len(running), sum(rows - count for count in running))

    def _placed_elsewhere(self, active: int) -> AdmissionRefused | None:
        """The refusal of a session another worker of the port takes at a lower cost (None: it is taken here)."""
        if self.placement is None:
            return None
        assert self.rule is not None
        here = self.placement_load()
        other = self.placement.better_worker(here)
        if other is None:
            return None
        there = self.placement.board.loads()[other]
        message = messages.other_worker(
            self.placement.index, other, here.cost(), there.cost(), self.mode.unit, self.placement.workers
        )
        shared = self._shared_units()
        numbers = (self.rule.capacity(shared), self.rule.slots, self.rule.predict(active + 1, shared))
        return AdmissionRefused(
            messages.OTHER_WORKER, message, active, *numbers, self.tick_period_s, self.config.headroom
        )

    def _shared_units(self) -> int:
        """The units other pools step on this pool's device (0 without a placement board)."""
        return 0 if self.placement is None else self.placement.shared_units()

    async def _republish(self) -> None:
        """Every `PUBLISH_EVERY_S`: set the observed p99's gauge, and publish this pool's load on the placement
        board (whether it admits changes with the other workers' units as well as with its own sessions)."""
        while True:
            await asyncio.sleep(PUBLISH_EVERY_S)
            self._set_observed_gauge()
            self._observe_answered()
            self._publish()

    def _publish(self) -> None:
        if self.placement is not None and self.rule is not None:
            self.placement.publish(self.placement_load())

    # --- inputs ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> list[TensorSpec]:
        """Each input of one session: name, dtype, shape (None on the time axis)."""
        return self.mode.facts.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.mode.facts.outputs

    def check_inputs(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> None:
        """TickError (unknown-input, missing-input, wrong-dtype, wrong-shape, bad-input) for a tick the tail
        cannot take; what the runtime checks at the instant it checks itself."""
        specs = self._input_specs
        if specs is None:
            specs = self._input_specs = {spec.name: spec for spec in self.inputs}
        names = list(specs)
        for name in inputs:
            if name not in specs:
                raise TickError(messages.UNKNOWN_INPUT, messages.unknown_input(name, names))
        missing = [name for name in self.mode.facts.always_fed if name not in inputs]
        if missing:
            raise TickError(messages.MISSING_INPUT, messages.missing_input(missing, names))
        if last and self.config.lockstep is not None:
            raise TickError(messages.BAD_INPUT, messages.no_last_in_lockstep())
        for name, tensor in inputs.items():
            if (name, tensor.dtype, tensor.shape) in self._accepted:
                continue
            spec = specs[name]
            found = codec.DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
            if found != spec.dtype:
                raise TickError(messages.WRONG_DTYPE, messages.wrong_dtype(name, found, spec.dtype))
            shape = tuple(tensor.shape)
            problem = shape_problem(spec, shape, self.config.lockstep is not None)
            if problem:
                raise TickError(messages.WRONG_SHAPE, messages.wrong_shape(name, shape, spec.declared(), problem))
            if len(self._accepted) >= ACCEPTED_KINDS:
                self._accepted.clear()
            self._accepted.add((name, tensor.dtype, tensor.shape))

    # --- the scheduler -----------------------------------------------------------------------------

    def wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _schedule(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while True:
                await self._gather()
                work = self._collect()
                if not work:
                    break
                try:
                    outcome = await self.run_on_device(self._round, work)
                except Exception as error:  # a fault of the pool itself: the sessions of the round are lost
                    self._fail_round(work, error)
                    continue
                self._deliver(outcome)
                if not self._wakeup.is_set():  # nothing queued (`_deliver` wakes it if anything is): the
                    break  # answers go out before the next scan of the sessions

    async def _gather(self) -> None:
        """Hold the next round until every idle session has something queued, or the oldest queued tick has
        waited `gather_s`, or a control is queued (never held)."""
        assert self._wakeup is not None
        while self.gather_s > 0:
            waiting = [
                s for s in self.sessions.values() if not s.in_flight and s.closing is None and s.driven_by is None
            ]
            heads = [s.queue[0] for s in waiting if s.queue]
            closing = any(s.closing is not None and s.queue for s in self.sessions.values())
            if not heads or closing or any(head.kind != "tick" for head in heads):
                return
            if all(s.queue or s.failed is not None or s.finished for s in waiting):
                return
            remaining = min(head.queued_at for head in heads) + self.gather_s - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _collect(self) -> Round:
        """Take this round's work: every idle session's leading controls and, if its next item is a tick, that
        tick (in lockstep only when every healthy member of its group has one). Ticks of a failed or finished
        session are answered here, without the device."""
        work = Round()
        candidates: dict[PooledSession, Item] = {}
        for session in list(self.sessions.values()):
            if session.in_flight or session.closed:
                continue
            controls = []
            while session.queue and session.queue[0].kind != "tick":
                controls.append(session.queue.popleft())
                if controls[-1].kind == "close":
                    break
            if controls:
                work.controls += [(session, item) for item in controls]
                session.in_flight = True
                if controls[-1].kind == "close":
                    continue
            resets = any(item.kind == "reset" for item in controls)
            failed = session.failed is not None and not resets
            finished = session.finished and not resets
            while session.queue and session.queue[0].kind == "tick" and (failed or finished):
                item = session.queue.popleft()
                error = (
                    TickError(messages.SESSION_FAILED, messages.session_failed(session.failed or ""))
                    if failed
                    else TickError(messages.FINISHED, messages.finished())
                )
                self._answer_error(session, item, error)
            if session.queue and session.queue[0].kind == "tick":
                candidates[session] = session.queue[0]
        if self.config.lockstep is None:
            chosen = list(candidates)
        else:
            chosen = self._ready_members(candidates, work)
        for session in chosen:
            work.ticks.append((session, session.queue.popleft()))
            session.in_flight = True
        return work

    def _ready_members(self, candidates: dict[PooledSession, Item], work: Round) -> list[PooledSession]:
        closing = {session for session, item in work.controls if item.kind == "close"}
        resets = {session for session, item in work.controls if item.kind == "reset"}
        groups: dict[int | None, list[PooledSession]] = collections.defaultdict(list)
        for session in self.sessions.values():
            if session.driven_by is not None and session.driven_by.fused is not None and session not in closing:
                continue  # its fused group's lead steps the whole group
            healthy = session not in closing and (
                session in resets or (session.failed is None and not session.finished)
            )
            if healthy:
                groups[session.group].append(session)
        chosen = []
        for members in groups.values():
            if members and all(member in candidates for member in members):
                chosen += members
        return chosen

    def _answer_error(self, session: PooledSession, item: Item, error: TickError) -> None:
        assert self.metrics is not None
        for member in session.stepped_by(item):
            member.errors += 1
            self.metrics.tick_errors.labels(error.code).inc()
        if not item.future.done():
            item.future.set_exception(error)

    def _round(self, work: Round) -> RoundOutcome:
        """On the device thread: the controls, then one step of every tick."""
        mode = self.mode
        controls: list[tuple[PooledSession, Item, BaseException | None]] = []
        for session, item in work.controls:
            try:
                if item.kind == "reset":
                    for member in session.stepped_by(item):
                        member.handle = mode.reset(member.handle)
                else:
                    mode.leave(session.handle)
                controls.append((session, item, None))
            except Exception as error:
                controls.append((session, item, error))
        ticks: list[tuple[PooledSession, Item, Any]] = []
        failed: dict[Any, str] = {}
        started = time.perf_counter()
        units = 0
        if work.ticks:
            keys = [WholeGroup(session.handle.group) if item.whole else session.handle for session, item in work.ticks]
            result = mode.step([(key, item.inputs, item.last) for key, (_, item) in zip(keys, work.ticks, strict=True)])
            failed = result.failed
            for key, (session, item) in zip(keys, work.ticks, strict=True):
                value = result.errors.get(key) or result.outputs.get(key)
                ticks.append((session, item, value))
            units = len({getattr(session.handle, "group", session.handle) for session, _ in work.ticks})
        done_at = time.perf_counter()
        if done_at - self._report_at > REPORT_EVERY_S and self.metrics is not None and self.loaded is not None:
            self.metrics.take_report(self.loaded.runtime.report())
            self._report_at = time.perf_counter()
        return RoundOutcome(controls, ticks, failed, done_at - started, done_at, units, started)

    def _deliver(self, outcome: RoundOutcome) -> None:
        metrics = self.metrics
        assert metrics is not None
        if outcome.ticks:
            self.round_log.append((outcome.units, outcome.round_s))
            metrics.round_seconds.observe(outcome.round_s)
            metrics.round_units.observe(outcome.units)
        for handle, cause in outcome.failed.items():
            for session in self.sessions.values():
                if session.handle is handle:
                    session.failed = cause
        stepped = late = whole = 0
        for session, item, value in outcome.ticks:
            session.in_flight = False
            if isinstance(value, TickError):
                self._answer_error(session, item, value)
                continue
            if value is None:
                self._answer_error(session, item, TickError(messages.INTERNAL, "the round gave no outputs"))
                continue
            latency = outcome.done_at - item.queued_at
            missed = latency > self.tick_period_s
            whole += item.whole
            members = session.stepped_by(item)
            for member in members:
                member.ticks += 1
                member.missed += missed
                member.latencies.append(latency)
            stepped += len(members)
            late += missed * len(members)
            self.tick_latencies.extend(itertools.repeat(latency, len(members)))
            self.answered.extend(itertools.repeat((outcome.done_at, latency), len(members)))
            self._answered_version += 1
            self._unobserved.append((latency, outcome.started_at - item.queued_at, len(members)))
            if item.last:
                session.finished = True
            if not item.future.done():
                item.future.set_result(value)
        self._ticks += stepped
        self._missed += late
        self._forget_answered(outcome.done_at)
        if stepped:
            metrics.ticks.inc(stepped)
        if whole:
            metrics.whole_group_ticks.inc(whole)
        if late:
            metrics.missed.inc(late)
        for session, item, error in outcome.controls:
            session.in_flight = False
            if item.kind == "reset":
                if error is None:
                    for member in session.stepped_by(item):
                        member.failed = None
                        member.finished = False
                    if not item.future.done():
                        item.future.set_result(None)
                elif not item.future.done():
                    item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
            else:
                self._closed(session)
                if not item.future.done():
                    item.future.set_result(None)
        if any(session.queue for session in self.sessions.values()):
            self.wake()

    def _closed(self, session: PooledSession) -> None:
        assert self.metrics is not None and self._empty is not None
        if session.closing is None:
            session.closing = (messages.CLIENT_CLOSED, "closed by the client")
        session._mark_closed()
        if self.sessions.pop(session.id, None) is not None:
            self.metrics.closed.labels(session.closing[0]).inc()
        lead = session.driven_by or (session if session.fused is not None else None)
        if lead is not None and lead.fused is not None:
            for member in lead.fused:  # a whole group cannot step with a row gone: its sessions close together
                member.abort(*session.closing)
            if not any(other.group == session.group for other in self.sessions.values()):
                self._bundle_groups.discard(session.group)
        if not self.sessions:
            self._empty.set()
        self._refresh_gauges()

    def _fail_round(self, work: Round, error: BaseException) -> None:
        for session, item in work.controls + work.ticks:
            session.in_flight = False
            session.abort(messages.INTERNAL, messages.internal(error))
            if not item.future.done():
                item.future.set_exception(TickError(messages.INTERNAL, messages.internal(error)))
        self.wake()

    def _forget_answered(self, now: float) -> None:
        """Drop the answered ticks older than admission's guard window. (Their p99 is taken where it is read,
        not here: sorting the window every round costs the event loop a millisecond a round at 512 sessions.)"""
        assert self.rule is not None
        since = now - self.rule.guard_window_s
        while self.answered and self.answered[0][0] < since:
            self.answered.popleft()

    def _set_observed_gauge(self) -> None:
        assert self.metrics is not None
        observed = self.observed_tick_p99()
        self.metrics.observed_tick_p99.set(0.0 if observed is None else observed)

    def _refresh_gauges(self) -> None:
        if self.metrics is None or self.rule is None:
            return
        self._publish()
        snapshot = self.capacity()
        self.metrics.sessions_active.set(snapshot.sessions)
        self.metrics.predicted_tick.set(snapshot.predicted_tick_s)
        self.metrics.capacity.set(snapshot.capacity)
        self.metrics.draining.set(int(snapshot.draining))

    async def _reap(self) -> None:
        """Close the sessions idle past the timeout (nothing queued, nothing in flight)."""
        timeout = self.config.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                driver = session.driven_by or session  # a fused group's ticks are queued on its lead
                idle = not driver.queue and not driver.in_flight and session.closing is None
                if idle and now - session.last_activity > timeout:
                    session.abort(messages.IDLE_TIMEOUT, messages.idle_timeout(timeout))

    # --- reports -----------------------------------------------------------------------------------

    def ready_fields(self) -> dict:
        """What every session's `ready` frame says of the pool: the tail, its tensors, the cadence, the limits."""
        served = self.served
        return {
            "tail": served.name,
            "options": dict(served.options),
            "device": served.device,
            "inputs": [spec.to_json() for spec in self.inputs],
            "outputs": [spec.to_json() for spec in self.outputs],
            "tick_period_s": self.tick_period_s,
            "lockstep": self.config.lockstep,
            "queue_depth": self.config.queue_depth,
            "idle_timeout_s": self.config.idle_timeout_s,
        }

    async def health(self) -> tuple[int, dict]:
        """`/healthz`: the HTTP status and its body (503 while starting or stopping)."""
        if self.rule is None:
            return 503, {"status": "starting"}
        if self.stopping:
            return 503, {"status": "stopping"}
        return 200, {"status": "ok", "tail": self.served.name, "sessions": len(self.sessions)}

    async def capacity_json(self) -> dict:
        """`/v1/capacity`: `capacity()` as JSON."""
        return self.capacity().to_json()

    async def deadlines_json(self) -> dict:
        """`/v1/sessions`: `deadlines()` as JSON."""
        return self.deadlines().to_json()

    async def metrics_text(self) -> bytes:
        """`/metrics`: the Prometheus text."""
        return self.exposition()

    def exposition(self) -> bytes:
        """The Prometheus text of the pool's metrics (with several workers, of all of theirs), the observed
        p99's gauge set now."""
        assert self.metrics is not None, "start() the pool first"
        self._set_observed_gauge()
        self._observe_answered()
        return self.metrics.exposition()

    def _observe_answered(self) -> None:
        """The latency histograms given the ticks answered since the last call."""
        if self.metrics is None or not self._unobserved:
            return
        answered, self._unobserved = self._unobserved, []
        for latency, wait, ticks in answered:
            for _ in range(ticks):
                self.metrics.tick_latency.observe(latency)
                self.metrics.tick_wait.observe(wait)

    def deadlines(self) -> DeadlineReport:
        recent = list(self.tick_latencies)
        return DeadlineReport(
            self._ticks,
            self._missed,
            quantile(recent, 0.5),
            quantile(recent, 0.99),
            max(recent) if recent else None,
            self.tick_period_s,
            tuple(session.stats() for session in self.sessions.values()),
        )

    @property
    def model(self) -> TickModel:
        assert self.rule is not None, "start() the pool first"
        return self.rule.model

    def describe(self) -> str:
        """The start-up lines: the tail, the mode, the arena, the tick model, the capacity."""
        assert self.rule is not None and self.loaded is not None
        report = self.metrics.report if self.metrics is not None else None
        mode = (
            f"{self.config.slots} session slots in {self.config.lanes} lane(s)"
            if self.config.lockstep is None
            else f"{self.config.slots} lockstep groups of {self.config.lockstep} rows in {self.config.lanes} lane(s)"
        )
        lines = [
            f"serving '{self.served.name}' on {self.served.device}: {mode}; tick period "
            f"{messages.milliseconds(self.tick_period_s)}"
        ]
        if report is not None:
            lines.append(
                f"arena {report.arena_bytes} bytes ({report.session_bytes} per slot + {report.lanes} x "
                f"{report.scratch_bytes} scratch); {report.graphs_captured} graphs captured"
            )
        lines.append(self.rule.model.describe())
        lines.append(str(self.capacity()))
        return "\n".join(lines)


def shape_problem(spec: TensorSpec, shape: tuple[int, ...], exact_units: bool) -> str | None:
    """Why a tensor of `shape` cannot be `spec`'s input (None: it can, as far as the shape goes)."""
    if len(shape) != len(spec.shape):
        return f"{len(spec.shape)} dimensions, not {len(shape)}"
    for axis, (found, declared) in enumerate(zip(shape, spec.shape)):
        if axis == spec.time_axis:
            if found < 1:
                return f"dimension {axis} (time) needs at least 1 unit"
            if exact_units and spec.units is not None and found != spec.units:
                return f"dimension {axis} (time) must be {spec.units} in a lockstep group"
        elif declared is not None and found != declared:
            return f"dimension {axis} must be {declared}"
    return None
