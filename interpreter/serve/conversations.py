"""The conversation pool: one conversation engine on one device, its conversations advanced in rounds.

    pool = ConversationPool(engine_factory("minicpmo45", "cuda", 8, {}), "minicpmo45")
    await pool.start()                        # the engine built on the device thread (and calibrated, if asked)
    conversation = await pool.open(seed=3)    # AdmissionRefused when it does not fit
    output = await conversation.submit(UnitInput(audio))   # its UnitOutput
    await conversation.reset()                # barge-in
    await conversation.close()

The pool is the round scheduler (`scheduler.Scheduler`: queues, gather, rounds on the device thread, delivery,
admission and its latency guard, drain, the idle reaper, deadlines and metrics) with a conversation engine's round
as its runner (`ConversationRounds`: the round's resets and closes, then one `engine.step` over every
conversation that sent a unit). Admission is the engine's, in the scheduler's terms: the engine's slots, and,
once the engine is calibrated (`calibration`), its round model against the cadence less its headroom; the
engine's own refusal (`ConversationRefused`) is the last word.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from duplexcadence.interpreter.engine.api import (
    LISTEN,
    SPEAK,
    ConversationEngine,
    ConversationError,
    ConversationRefused,
    Decision,
    UnitInput,
)
from duplexcadence.interpreter.engine.registry import load_engine
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, AdmissionRule, TickModel
from duplexcadence.interpreter.serve.metrics import PoolMetrics
from duplexcadence.interpreter.serve.scheduler import RESET, Client, Round, RoundOutcome, Scheduler, TickError

GATHER_FRACTION = 0.05
UNIT = "conversation"


class EngineSetupError(LookupError):
    """An engine that cannot be built as named: the message says why."""


def option_value(text: str) -> Any:
    """A `--param` value as an engine keyword: a whole number, a number, true or false, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def engine_factory(
    target: str, device: str, conversations: int, params: Mapping[str, str]
) -> Callable[[], ConversationEngine]:
    """What builds the engine `target` names: a registered conversation engine, or `MODULE:FUNCTION` (a function
    of the user's that returns a `ConversationEngine`), called with `device=`, `conversations=` and `params` (each
    value read by `option_value`). EngineSetupError for a function that cannot be imported."""
    from duplexcadence.interpreter import tails

    options = {key: option_value(value) for key, value in params.items()}
    if ":" in target:
        module, _, function = target.partition(":")
        try:
            build = tails.import_function(module, function)
        except tails.ImportFailed as error:
            raise EngineSetupError(str(error)) from None
        return lambda: build(device=device, conversations=conversations, **options)
    return lambda: load_engine(target, device=device, conversations=conversations, **options)


def engine_name(target: str) -> str:
    """The name a pool serves `target` under: a registered engine's, or the FUNCTION of `MODULE:FUNCTION`."""
    return target.rpartition(":")[2]


def scripted_turn(conversation: int, unit: int) -> Decision:
    """The calibration's script: listen, then a turn of two units (the second ending it)."""
    step = unit % 3
    return Decision(LISTEN) if step == 0 else Decision(SPEAK, (11, 12, 13), end_of_turn=step == 2)


@attrs.frozen
class ConversationPoolConfig:
    """`queue_depth`: units a conversation may have queued beside the one in flight; `idle_timeout_s`: a
    conversation that sends nothing this long is closed; `gather_s`: how long a round may wait from its oldest
    unit for the other conversations' (None: 5 % of the cadence); `headroom`: the fraction of the cadence
    admission keeps free, given to the engine too when it has a `headroom` (the stock `Engine`: its own
    refusals then keep the same); `latency_guard`: also refuse while the p99 unit latency of the
    last 5 cadences is over the budget; `calibration`: conversation counts the engine's round model is timed at
    when the pool starts (`Engine.calibrate`, scripted turns; empty: admission by the slots and the guard);
    `freeze_gc` and `pace` (units stepped a cadence at most on average, after a burst of the queue depth): as
    `PoolConfig`'s."""

    queue_depth: int = 4
    idle_timeout_s: float = 30.0
    gather_s: float | None = None
    headroom: float = 0.15
    latency_guard: bool = True
    calibration: tuple[int, ...] = ()
    freeze_gc: bool = True
    pace: float | None = 2.0

    def problems(self) -> list[str]:
        found = []
        if self.queue_depth < 1:
            found.append(f"the queue depth must be at least 1, not {self.queue_depth}")
        if not self.idle_timeout_s > 0:
            found.append(f"the idle timeout must be above 0 s, not {self.idle_timeout_s}")
        if self.gather_s is not None and not self.gather_s >= 0:
            found.append(f"the gather time must be 0 s or more, not {self.gather_s}")
        if self.pace is not None and not self.pace > 0:
            found.append(f"the pace must be above 0 units a cadence, not {self.pace}")
        if not 0.0 <= self.headroom < 1.0:
            found.append(f"headroom must be from 0 to below 1, not {self.headroom}")
        return found


class PooledConversation(Client):
    """One client's conversation in the pool (its id is the engine's): its units run in the order submitted."""

    scheduler: ConversationPool

    def submit(self, unit: UnitInput) -> Any:
        """Queue one unit; a future of its `UnitOutput`. TickError at once for a full queue or a closed
        conversation (nothing queued)."""
        return self.queue_tick(unit)


class ConversationRounds:
    """The conversation engine's round: its resets and closes, then one `engine.step` of its units. A unit the
    engine refuses (`ConversationError`) is answered alone and the others step: `session-failed` for a
    conversation that failed before its reset, else `bad-input` (audio or a decision it cannot take; nothing
    changed). A step that raises fails every conversation in it."""

    unit = UNIT

    def __init__(self, engine: ConversationEngine):
        self.engine = engine

    def run(self, work: Round) -> RoundOutcome:
        engine = self.engine
        controls: list[tuple[Any, Any, BaseException | None]] = []
        for client, item in work.controls:
            try:
                (engine.reset if item.kind == RESET else engine.close)(client.id)
                controls.append((client, item, None))
            except Exception as error:
                controls.append((client, item, error))
        answers: dict[int, Any] = {}
        units = {}
        for client, item in work.ticks:
            refusal = self.refusal(client.id, item.inputs)
            if refusal is None:
                units[client.id] = item.inputs
            else:
                answers[client.id] = refusal
        failed: dict[Any, str] = {}
        started = time.perf_counter()
        if units:
            try:
                answers.update(engine.step(units))
            except Exception as error:  # the engine failed the round: its conversations need a reset
                cause = f"{type(error).__name__}: {error}"
                for client, _ in work.ticks:
                    if client.id in units:
                        answers[client.id] = TickError(messages.STAGE_FAILED, cause)
                        failed[client] = cause
        done = time.perf_counter()
        ticks = [(client, item, answers.get(client.id)) for client, item in work.ticks]
        return RoundOutcome(controls, ticks, failed, done - started, done, len(units), started)

    def refusal(self, conversation: int, unit: UnitInput) -> TickError | None:
        check = getattr(self.engine, "check", None)
        if check is None:
            return None
        try:
            check({conversation: unit})
        except ConversationError as error:
            return TickError(messages.SESSION_FAILED if error.failed else messages.BAD_INPUT, str(error))
        return None


class ConversationPool(Scheduler):
    """Conversations of one engine on one device (see the module docstring). `build` makes the engine (called on
    the device thread); `name` is the model's."""

    config: ConversationPoolConfig

    def __init__(
        self, build: Callable[[], ConversationEngine], name: str, config: ConversationPoolConfig | None = None
    ):
        config = config or ConversationPoolConfig()
        problems = config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        super().__init__(config)
        self.build = build
        self.name = name
        self.engine: ConversationEngine | None = None
        self.abandoned: set[asyncio.Task] = set()
        """The closes of conversations opened for a caller that was cancelled."""

    @property
    def started(self) -> bool:
        return self.rule is not None

    @property
    def cadence_s(self) -> float:
        engine = self._engine()
        return engine.unit_samples / engine.input_rate

    def _engine(self) -> ConversationEngine:
        assert self.engine is not None, "start() the pool first"
        return self.engine

    async def start(self) -> None:
        """Build the engine on the device thread (and calibrate it), then start the rounds."""
        self.open_device()
        assert self.executor is not None
        try:
            self.engine = await self.run_on_device(self._load)
        except BaseException:
            self.executor.shutdown(wait=False)
            raise
        engine = self.engine
        capacity = engine.capacity()
        round_model = getattr(engine, "round_model", None)
        model = (
            TickModel(round_model.base_ms / 1000, round_model.per_conversation_ms / 1000, UNIT, points(round_model))
            if round_model is not None
            else TickModel(0.0, 0.0, UNIT)
        )
        period = self.cadence_s
        rule = AdmissionRule(
            capacity.memory_limit,
            None,
            model,
            period,
            self.config.headroom,
            round_model is not None,
            self.config.latency_guard,
            client=UNIT,
        )
        metrics = PoolMetrics(period)
        metrics.slots.set(capacity.memory_limit)
        self.begin(ConversationRounds(engine), rule, metrics, self.config.gather_s, GATHER_FRACTION)

    def _load(self) -> ConversationEngine:
        engine = self.build()
        if hasattr(engine, "headroom"):  # the engine's own refusals keep the headroom admission keeps
            engine.headroom = self.config.headroom
        if self.config.calibration:
            engine.calibrate(self.config.calibration, script=scripted_turn)  # type: ignore[attr-defined]
        return engine

    async def open(self, seed: int = 0) -> PooledConversation:
        """A new conversation; AdmissionRefused (with the numbers) when the pool or the engine does not take it,
        or when the pool began to stop or shut down while the engine opened it (closed again on the device)."""
        refusal = self.admission_refusal()
        if refusal is not None:
            raise self.refused(refusal)
        engine = self._engine()
        self.opening += 1
        try:
            opening = asyncio.ensure_future(self.run_on_device(engine.open, seed))
            try:
                conversation_id = await asyncio.shield(opening)
            except asyncio.CancelledError:
                opening.add_done_callback(self._close_abandoned)
                raise
            except ConversationRefused as refused:
                raise self.refused(await self.engine_refusal(refused)) from None
            if self.stopping or self.shutting_down:
                await self._close_on_device(conversation_id)
                refusal = self.admission_refusal()
                assert refusal is not None
                raise self.refused(refusal)
        finally:
            self.opening -= 1
        conversation = PooledConversation(self, conversation_id, seed)
        self.add(conversation)
        return conversation

    async def engine_refusal(self, refused: ConversationRefused) -> AdmissionRefused:
        """The engine's refusal with the engine's numbers: its open conversations, what it admits, its slots,
        the round it predicts (0 before a calibration), its cadence and headroom."""
        engine = self._engine()
        capacity = await self.run_on_device(engine.capacity)
        predicted_ms = refused.numbers.get("predicted_ms")
        round_model = getattr(engine, "round_model", None)
        if predicted_ms is None and round_model is not None:
            predicted_ms = round_model.predict(capacity.active + 1)
        return AdmissionRefused(
            messages.AT_CAPACITY,
            refused.reason,
            capacity.active,
            capacity.conversations,
            capacity.memory_limit,
            (predicted_ms or 0.0) / 1000,
            capacity.cadence_ms / 1000,
            getattr(engine, "headroom", self.config.headroom),
        )

    async def _close_on_device(self, conversation_id: int) -> None:
        if self.device_stopped:
            return  # the engine is gone with the device thread
        try:
            await self.run_on_device(self._engine().close, conversation_id)
        except Exception as error:
            self.keep_unreleased(f"conversation {conversation_id}", error)

    def _close_abandoned(self, opening: asyncio.Future) -> None:
        """An open whose caller was cancelled: the conversation it opened, if any, closed on the device."""
        if opening.cancelled() or opening.exception() is not None:
            return
        task = self.loop.create_task(self._close_on_device(opening.result()))
        self.abandoned.add(task)
        task.add_done_callback(self.abandoned.discard)

    def capacity_json(self) -> dict[str, Any]:
        """`/v1/capacity` and a replica's routing stats: the scheduler's `Capacity` (its `sessions` the open
        conversations, `free` those it admits now) and the engine's `EngineCapacity` under `engine`."""
        return {**self.capacity().to_json(), "engine": attrs.asdict(self._engine().capacity())}

    def describe(self) -> str:
        """The start-up lines: what the engine admits and the admission model."""
        engine, capacity = self._engine(), self._engine().capacity()
        assert self.rule is not None
        return "\n".join(
            [
                f"serving conversations of '{self.name}': {capacity.conversations} at most (memory limit "
                f"{capacity.memory_limit}, time limit {capacity.time_limit}); a unit of {engine.unit_samples} "
                f"samples at {engine.input_rate} Hz in, {engine.output_rate} Hz out",
                self.rule.model.describe(),
                str(self.capacity()),
            ]
        )


def points(round_model: Any) -> tuple[tuple[int, float], ...]:
    return tuple((count, ms / 1000) for count, ms in sorted(round_model.measured_ms.items()))
