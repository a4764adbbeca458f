"""The session pool: one tail's runtime on one device, its sessions stepped in rounds at the cadence.

    pool = SessionPool(served_tail("toy"), PoolConfig(slots=8, lanes=2))
    await pool.start()                      # load, warm every slot, calibrate the tick model
    session = await pool.open(seed=3)       # AdmissionRefused when it does not fit
    outputs = await session.step(codes=c)   # {"pcm": tensor on the host}
    await session.reset()                   # barge-in
    await session.close()

The pool is the round scheduler (`scheduler.Scheduler`: queues, gather, rounds on the device thread,
delivery, admission, drain, the idle reaper, deadlines and metrics) with the tail's round as its runner
(`rounds.TailRounds`: one `Runtime.step_many` over every session with a tick, in lockstep over the groups
whose members all have one). What is the tail's is here: loading and calibration on the device thread, a
session's handle in the mode (a runtime session, a lockstep row), the choice of a new session's lockstep
group, bundles (`bundle.Bundle`), and the rounds' lockstep rules (`choose`, `screen`, `settle`).

Admission (`admission.AdmissionRule`): a slot must be free and the calibrated tick with one more session must
stay under the tick period less the headroom. `capacity()` is the snapshot a router reads, `drain()` stops
admission while the sessions finish. Deadlines: a tick's latency runs from its arrival at the pool to its
outputs on the host; over the tick period it is missed.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, AdmissionRule, TickModel
from duplexcadence.interpreter.serve.bundle import Bundle
from duplexcadence.interpreter.serve.deadlines import DeadlineReport, SessionStats
from duplexcadence.interpreter.serve.metrics import PoolMetrics
from duplexcadence.interpreter.serve.modes import MODES, TensorSpec
from duplexcadence.interpreter.serve.numerics import Numerics
from duplexcadence.interpreter.serve.rounds import InputCheck, TailRounds, calibrate
from duplexcadence.interpreter.serve.scheduler import (
    CLOSE,
    OBSERVE_EVERY_S,
    RESET,
    TICK,
    Client,
    Item,
    Round,
    RoundOutcome,
    Scheduler,
    SessionClosed,
    TickError,
)
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

GATHER_FRACTION = 0.05
GROUP_MISSES = 3
"""Tick periods in a row a lockstep group waits for one member before that member is closed (`too-slow`)."""

__all__ = [
    "OBSERVE_EVERY_S",
    "Bundle",
    "DeadlineReport",
    "PoolConfig",
    "PooledSession",
    "SessionClosed",
    "SessionPool",
    "SessionStats",
]


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
    `pace`: a session's ticks are stepped at most `pace` a tick period on average, after a burst of
    `queue_depth` (a client ahead of the cadence waits in its own queue); None: as fast as they come.
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
    pace: float | None = 2.0

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
        if self.pace is not None and not self.pace > 0:
            found.append(f"the pace must be above 0 ticks a period, not {self.pace}")
        if self.gather_s is not None and not self.gather_s >= 0:
            found.append(f"the gather time must be 0 s or more, not {self.gather_s}")
        return found


class PooledSession(Client):
    """One client's session in the pool. Its ticks run in the order submitted, one in flight at a time."""

    def __init__(self, pool: SessionPool, session_id: int, seed: int, handle: Any, group: int | None):
        super().__init__(pool, session_id, seed)
        self.pool = pool
        self.handle = handle  # the mode's: a runtime Session, or a lockstep Member (the device thread's)
        self.group = group
        self.failed: str | None = None
        self.finished = False
        self.misses = 0
        """Tick periods in a row its lockstep group waited for this session's tick."""
        self.fused: list[PooledSession] | None = None
        """On the lead of a bundle's fused group (the member in its first row): the group's sessions in row
        order; their ticks and resets are queued here, whole."""

    def submit(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> asyncio.Future:
        """Queue one tick; a future of its outputs (by name, on the host). Raises TickError before queueing
        for inputs the tail cannot take, a full queue or a closed session: the session is unchanged."""
        self.check_open()
        self.pool.check_inputs(inputs, last)
        return self.queue_tick(dict(inputs), last)

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

    def info(self) -> dict:
        """What the server's `ready` frame says of the session."""
        row = getattr(self.handle, "row", None)
        return {"session": self.id, "seed": self.seed, "group": self.group, "row": row}


class SessionPool(Scheduler):
    """Sessions of one tail on one device (see the module docstring)."""

    def __init__(self, served: ServedTail, config: PoolConfig | None = None):
        config = config or PoolConfig()
        problems = config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        super().__init__(config)
        self.config: PoolConfig = config
        self.served = served
        self.sessions: dict[int, PooledSession] = {}
        self.loaded: LoadedTail | None = None
        self.mode: Any = None
        self.started_s = 0.0
        self._opening_groups: collections.Counter = collections.Counter()
        self._bundles_opening: asyncio.Lock | None = None
        self._bundle_groups: set[int] = set()  # lockstep groups a bundle fills or holds whole
        self._group_waits: dict[int | None, tuple[float, set[PooledSession]]] = {}
        """Lockstep groups waiting for some members' ticks: since when (the oldest tick, or the last miss),
        and the members that missed in this wait."""
        self._check: InputCheck | None = None
        self.numerics: Numerics | None = None
        """The device thread's numeric settings (a thread's own torch thread count can differ from the loop's)."""
        self._previous_cudnn: tuple[bool, bool] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the tail's runtime on the device thread, warm every slot, calibrate (unless a model is
        given), then start the scheduler and the idle reaper. ValueError for a mode the plan cannot take."""
        device = torch.device(self.served.device)
        if device.type == "cuda" and device.index is None:  # set_device needs an index: "cuda" is the current one
            device = torch.device("cuda", torch.cuda.current_device())
        self.open_device((lambda: torch.cuda.set_device(device)) if device.type == "cuda" else None)
        self._bundles_opening = asyncio.Lock()
        started = self.loop.time()
        assert self.executor is not None
        try:
            model = await self.run_on_device(self._load)
        except BaseException:
            await self.run_on_device(self.unload)
            self.executor.shutdown(wait=False)
            raise
        self.started_s = self.loop.time() - started
        self.numerics = await self.run_on_device(Numerics.current, self.served.device)
        config = self.config
        tick_period_s = config.tick_period_s or self.mode.facts.tick_period_s
        rule = AdmissionRule(
            self.mode.session_slots,
            config.lockstep,
            model,
            tick_period_s,
            config.headroom,
            config.enforce_tick_budget,
            config.latency_guard,
        )
        metrics = PoolMetrics(tick_period_s)
        metrics.slots.set(self.mode.session_slots)
        assert self.loaded is not None
        report = self.loaded.runtime.report
        metrics.take_report(await self.run_on_device(report))
        lockstep = config.lockstep is not None
        self._check = InputCheck(self.inputs, self.mode.facts.always_fed, lockstep, self.served.input_bounds)
        self.begin(TailRounds(self.mode, metrics, report), rule, metrics, config.gather_s, GATHER_FRACTION)

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
        return calibrate(
            self.mode,
            config.lanes,
            self._inputs_of,
            config.calibration_sizes,
            config.calibration_warmup,
            config.calibration_repeats,
        )

    def _inputs_of(self, seed: int, instant: int) -> dict[str, torch.Tensor]:
        if self.served.inputs is not None:
            return self.served.inputs(seed, instant)
        return self.mode.facts.zeros(instant)

    def unload(self) -> None:
        if self._previous_cudnn is not None:
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self._previous_cudnn

    # --- admission ---------------------------------------------------------------------------------

    def lanes(self) -> int:
        return self.config.lanes

    async def open(self, seed: int = 0) -> PooledSession:
        """A new session (its RNG seeded with `seed`); AdmissionRefused, with the numbers, when it does not fit."""
        return await self._open(seed, None)

    async def _open(self, seed: int, group_choice: int | None) -> PooledSession:
        """`open`, in lockstep into `group_choice` when given (a group with a free row), else the group
        `_group_for_new_session` picks."""
        assert self.rule is not None and self.metrics is not None, "start() the pool first"
        refusal = self.admission_refusal()
        if refusal is not None:
            raise self.refused(refusal)
        rows = self.config.lockstep
        if group_choice is not None and rows is not None and self._rows_taken()[group_choice] >= rows:
            group_choice = None  # taken meanwhile by a session that found no other room
        group = self._group_for_new_session() if group_choice is None else group_choice
        self.opening += 1
        if group is not None:
            self._opening_groups[group] += 1
        try:
            handle = await self.run_on_device(self.mode.join, seed, group)
        except BaseException:
            self._opened(group)
            raise
        self._opened(group)
        session = PooledSession(self, next(self.ids), seed, handle, group)
        self.add(session)
        return session

    async def open_bundle(self, count: int, seed: int = 0) -> Bundle:
        """`count` sessions opened together (seeds `seed`, `seed + 1`, ...) as one `Bundle`, or none of them:
        AdmissionRefused, saying how many fitted, when one does not fit (the ones opened are closed again)."""
        if count < 1:
            raise ValueError(f"a bundle holds at least 1 session, not {count}")
        assert self.rule is not None, "start() the pool first"
        active = len(self.sessions) + self.opening
        free = max(0, self.rule.slots - active)
        if count > free:  # refused before any session is opened
            assert self.metrics is not None
            self.metrics.refused.labels(messages.AT_CAPACITY).inc()
            message = messages.bundle_over_slots(count, free, self.rule.slots)
            raise AdmissionRefused(
                messages.AT_CAPACITY,
                message,
                active,
                self.rule.capacity(),
                self.rule.slots,
                self.rule.predict(active + count),
                self.tick_period_s,
                self.config.headroom,
            )
        members: list[PooledSession] = []
        rows = self.config.lockstep
        reserved: list[int] = []
        try:
            assert self._bundles_opening is not None
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
        self.opening -= 1
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

    # --- inputs ----------------------------------------------------------------------------------

    @property
    def inputs(self) -> list[TensorSpec]:
        """Each input of one session: name, dtype, shape (None on the time axis)."""
        return self.mode.facts.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.mode.facts.outputs

    def max_frame_bytes(self, sessions: int = 1) -> int:
        """The longest binary frame a tick of `sessions` sessions (a bundle's) can be: every input at the most
        units the plan feeds it at one instant, with room for the longest header."""
        facts = self.mode.facts
        total = 0
        for spec in self.inputs:
            units = facts.most_units.get(spec.name, spec.units or 1)
            dims = [units if axis == spec.time_axis else (dim or 1) for axis, dim in enumerate(spec.shape)]
            total += math.prod(dims) * codec.TORCH_DTYPES[spec.dtype].itemsize
        return sessions * total + codec.MAX_HEADER_BYTES

    def check_inputs(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> None:
        """TickError (unknown-input, missing-input, wrong-dtype, wrong-shape, bad-input) for a tick the tail
        cannot take; what the runtime checks at the instant it checks itself."""
        assert self._check is not None, "start() the pool first"
        self._check(inputs, last)

    def check_values(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """TickError (bad-input) for a value outside the tail's bounds (in lockstep; a bundle's whole stack)."""
        assert self._check is not None, "start() the pool first"
        self._check.values(inputs)

    # --- the rounds' lockstep rules ----------------------------------------------------------------

    def screen(self, client: PooledSession, resetting: bool) -> TickError | None:
        """A failed or finished session's ticks are answered without the device, until a reset."""
        if client.failed is not None and not resetting:
            return TickError(messages.SESSION_FAILED, messages.session_failed(client.failed))
        if client.finished and not resetting:
            return TickError(messages.FINISHED, messages.finished())
        return None

    def choose(self, candidates: dict[PooledSession, Item], work: Round) -> list[PooledSession]:
        """Every session with a tick; in lockstep, the groups whose healthy members all have one."""
        if self.config.lockstep is None:
            return list(candidates)
        return self._ready_members(candidates, work)

    def _ready_members(self, candidates: dict[PooledSession, Item], work: Round) -> list[PooledSession]:
        closing = {session for session, item in work.controls if item.kind == CLOSE}
        resets = {session for session, item in work.controls if item.kind == RESET}
        groups: dict[int | None, list[PooledSession]] = collections.defaultdict(list)
        for session in self.sessions.values():
            if session.queued_on is not None and session not in closing:
                continue  # its fused group's lead steps the whole group
            healthy = session not in closing and (
                session in resets or (session.failed is None and not session.finished)
            )
            if healthy:
                groups[session.group].append(session)
        chosen = []
        now = time.perf_counter()
        for group, members in groups.items():
            ready = [member for member in members if member in candidates]
            if len(ready) == len(members):
                _, missed = self._group_waits.pop(group, (0.0, set()))
                for member in members:
                    if member not in missed:
                        member.misses = 0
                chosen += members
            elif not ready:
                self._group_waits.pop(group, None)
            else:
                self._wait_for_members(group, members, [candidates[m].queued_at for m in ready], now)
        return chosen

    def _wait_for_members(
        self, group: int | None, members: list[PooledSession], ticks: list[float], now: float
    ) -> None:
        """A group some of whose members have no tick yet waits for them a tick period at a time: each period
        it waits is a miss of each member that kept it waiting, and a member that misses `GROUP_MISSES` times
        in a row is closed (`too-slow`) so that the group goes on without it."""
        since, missed = self._group_waits.get(group, (min(ticks), set()))
        if now - since >= self.tick_period_s:
            for member in members:
                if member.queue and member.queue[0].kind == TICK:
                    continue
                member.misses += 1
                missed.add(member)
                if member.misses >= GROUP_MISSES:
                    member.abort(messages.TOO_SLOW, messages.too_slow(member.misses, self.tick_period_s))
            since = now
        self._group_waits[group] = (since, missed)
        self.wake_at(since + self.tick_period_s)

    def settle(self, outcome: RoundOutcome) -> None:
        for handle, cause in outcome.failed.items():
            for session in self.sessions.values():
                if session.handle is handle:
                    session.failed = cause

    def answered(self, client: PooledSession, item: Item) -> None:
        if item.kind == RESET:
            for member in client.covered_by(item):
                member.failed = None
                member.finished = False
        elif item.last:
            client.finished = True

    def closed(self, client: PooledSession) -> None:
        lead = client.queued_on or (client if client.fused is not None else None)
        if isinstance(lead, PooledSession) and lead.fused is not None:
            assert client.closing is not None
            for member in lead.fused:  # a whole group cannot step with a row gone: its sessions close together
                member.abort(*client.closing)
            if not any(other.group == client.group for other in self.sessions.values()):
                self._bundle_groups.discard(client.group)

    def awaited(self, client: PooledSession) -> bool:
        return client.failed is None and not client.finished

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
            "max_frame_bytes": self.max_frame_bytes(),
            "pace": self.config.pace,
            "numerics": self.numerics.to_json() if self.numerics is not None else None,
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
