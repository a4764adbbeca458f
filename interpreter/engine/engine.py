"""The conversation engine: conversations in the slots of a model's batched stages, one unit per round.

:class:`Engine` is the :class:`~.api.ConversationEngine` over a :class:`UnitModel` (a model's batched unit,
registered by name: :mod:`.registry`). It owns what does not depend on the model: conversation ids and their
slots, checking a round's inputs before anything runs (an unknown id, audio of the wrong length or type, a
decision the conversation cannot take: :class:`~.api.ConversationError`, nothing changed), unit numbering, the
round's stage times, what a failed round leaves (every conversation in it failed, refused until reset), and
admission: a conversation is admitted while a slot is free and the calibrated round time at one more
conversation stays under the cadence (:meth:`Engine.calibrate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from duplexcadence.interpreter.engine.api import (
    ConversationError,
    ConversationRefused,
    Decision,
    EngineCapacity,
    UnitInput,
    UnitOutput,
)

CADENCE_MS = 1000.0


class UnitResultLike(Protocol):
    """One unit of one conversation as a model reports it (the engine adds the ids, the text and the times)."""

    @property
    def kind(self) -> str: ...
    @property
    def text_tokens(self) -> tuple[int, ...]: ...
    @property
    def speech_tokens(self) -> tuple[int, ...]: ...
    @property
    def audio(self) -> np.ndarray: ...
    @property
    def end_of_turn(self) -> bool: ...


class StageTimesLike(Protocol):
    def as_dict(self) -> dict[str, float]: ...


class UnitModel(Protocol):
    """A model's duplex unit over slots, batched: what :class:`Engine` runs."""

    @property
    def name(self) -> str: ...
    @property
    def input_rate(self) -> int: ...
    @property
    def output_rate(self) -> int: ...
    @property
    def unit_samples(self) -> int: ...
    @property
    def slots(self) -> int: ...

    def start(self, slot: int, seed: int) -> None:
        """A fresh conversation in ``slot`` (its caches cleared, its generators seeded, its prompt prefilled)."""
        ...

    def refusal(self, slot: int, unit: UnitInput) -> str | None:
        """Why ``unit`` cannot be the next unit of the conversation in ``slot``; None when it can."""
        ...

    def run_units(
        self, slots: Sequence[int], inputs: Sequence[UnitInput]
    ) -> tuple[Sequence[UnitResultLike], StageTimesLike]: ...

    def release(self, slot: int) -> None: ...

    def bytes_per_conversation(self) -> int: ...

    def detokenize(self, tokens: tuple[int, ...]) -> str: ...


@attrs.define
class ConversationSlot:
    id: int
    slot: int
    seed: int
    units: int = 0
    failed: str | None = None


@attrs.frozen
class RoundModel:
    """Round time against the number of conversations, from calibration rounds: the slowest round measured at
    each count, and a line through them (``base_ms + per_conversation_ms * n``) for the counts between."""

    measured_ms: Mapping[int, float]
    base_ms: float
    per_conversation_ms: float

    @classmethod
    def fit(cls, measured: Mapping[int, float]) -> RoundModel:
        counts = sorted(measured)
        if len(counts) == 1:
            return cls(dict(measured), 0.0, measured[counts[0]] / counts[0])
        xs = np.array(counts, dtype=float)
        ys = np.array([measured[n] for n in counts], dtype=float)
        slope, intercept = np.polyfit(xs, ys, 1)
        slope = max(float(slope), 0.0)
        intercept = max(float(np.max(ys - slope * xs)), 0.0)  # the line stays at or above every measurement
        return cls(dict(measured), intercept, slope)

    def predict(self, conversations: int) -> float:
        return self.base_ms + self.per_conversation_ms * conversations


class Engine:
    """Conversations on one device (see the module docstring)."""

    def __init__(self, model: UnitModel, cadence_ms: float = CADENCE_MS, headroom: float = 0.1) -> None:
        self.model = model
        self.input_rate = model.input_rate
        self.output_rate = model.output_rate
        self.unit_samples = model.unit_samples
        self.cadence_ms = cadence_ms
        self.headroom = headroom
        self.conversations: dict[int, ConversationSlot] = {}
        self.free_slots = list(range(model.slots))
        self.next_id = 1
        self.round_model: RoundModel | None = None
        self.rounds = 0

    # -- admission

    def time_limit(self) -> int:
        """Conversations whose predicted round stays under the cadence less the headroom (all slots before a
        calibration)."""
        if self.round_model is None:
            return self.model.slots
        budget = self.cadence_ms * (1.0 - self.headroom)
        fits = [n for n in range(1, self.model.slots + 1) if self.round_model.predict(n) <= budget]
        return max(fits, default=0)

    def capacity(self) -> EngineCapacity:
        time_limit = self.time_limit()
        limit = min(self.model.slots, time_limit)
        return EngineCapacity(
            conversations=limit,
            active=len(self.conversations),
            memory_limit=self.model.slots,
            time_limit=time_limit,
            bytes_per_conversation=self.model.bytes_per_conversation(),
            round_ms_at_limit=self.round_model.predict(limit) if self.round_model and limit else None,
            cadence_ms=self.cadence_ms,
        )

    def open(self, seed: int = 0) -> int:
        capacity = self.capacity()
        active = len(self.conversations)
        if not self.free_slots:
            raise ConversationRefused(
                f"all {self.model.slots} conversation slots are in use "
                f"({capacity.bytes_per_conversation} bytes each on the device)",
                {"active": active, "slots": self.model.slots},
            )
        if active + 1 > capacity.time_limit:
            assert self.round_model is not None
            raise ConversationRefused(
                f"{active + 1} conversations would take {self.round_model.predict(active + 1):.0f} ms a round, over "
                f"{self.cadence_ms * (1 - self.headroom):.0f} ms ({self.cadence_ms:.0f} ms cadence less "
                f"{self.headroom:.0%} headroom); {capacity.time_limit} fit",
                {"active": active, "predicted_ms": self.round_model.predict(active + 1), "limit": capacity.time_limit},
            )
        slot = self.free_slots.pop(0)
        try:
            self.model.start(slot, seed)
        except BaseException:
            self.free_slots.insert(0, slot)
            raise
        conversation = ConversationSlot(self.next_id, slot, seed)
        self.next_id += 1
        self.conversations[conversation.id] = conversation
        return conversation.id

    def reset(self, conversation: int) -> None:
        entry = self._get(conversation)
        try:
            self.model.start(entry.slot, entry.seed)
        except BaseException as error:  # the slot's state is part old, part new: only another reset recovers it
            entry.failed = f"its reset failed: {type(error).__name__}: {error}"
            raise
        entry.units = 0
        entry.failed = None

    def close(self, conversation: int) -> None:
        entry = self._get(conversation)
        self.model.release(entry.slot)
        del self.conversations[conversation]
        self.free_slots.append(entry.slot)
        self.free_slots.sort()

    def _get(self, conversation: int) -> ConversationSlot:
        entry = self.conversations.get(conversation)
        if entry is None:
            open_ids = sorted(self.conversations)
            raise ConversationError(f"no open conversation {conversation!r} (open: {open_ids or 'none'})")
        return entry

    # -- a round

    def check(self, units: Mapping[int, UnitInput]) -> None:
        """ConversationError for the first input of ``units`` that cannot run, naming the conversation."""
        if not units:
            raise ConversationError("a round needs the unit of at least one conversation")
        for conversation, unit in units.items():
            entry = self._get(conversation)
            if entry.failed is not None:
                raise ConversationError(
                    f"conversation {conversation} failed ({entry.failed}); reset it to go on", failed=True
                )
            if not isinstance(unit, UnitInput):
                raise ConversationError(
                    f"conversation {conversation}: a unit is a UnitInput, got {type(unit).__name__}"
                )
            audio = unit.audio
            if not isinstance(audio, np.ndarray) or audio.dtype != np.float32 or audio.shape != (self.unit_samples,):
                got = f"{audio.dtype} {list(audio.shape)}" if isinstance(audio, np.ndarray) else type(audio).__name__
                raise ConversationError(
                    f"conversation {conversation}: a unit's audio is float32 [{self.unit_samples}] "
                    f"({self.unit_samples / self.input_rate:g} s at {self.input_rate} Hz), got {got}"
                )
            if not np.isfinite(audio).all():
                raise ConversationError(f"conversation {conversation}: the audio holds NaN or infinite samples")
            if unit.decision is not None and not isinstance(unit.decision, Decision):
                raise ConversationError(f"conversation {conversation}: a decision is a Decision, got {unit.decision!r}")
            refusal = self.model.refusal(entry.slot, unit)
            if refusal is not None:
                raise ConversationError(f"conversation {conversation}: {refusal}")

    def step(self, units: Mapping[int, UnitInput]) -> dict[int, UnitOutput]:
        self.check(units)
        entries = [self.conversations[conversation] for conversation in units]
        try:
            results, times = self.model.run_units([entry.slot for entry in entries], list(units.values()))
        except BaseException as error:
            for entry in entries:
                entry.failed = f"{type(error).__name__}: {error}"
            raise
        self.rounds += 1
        timing = times.as_dict()
        outputs = {}
        for entry, result in zip(entries, results):
            outputs[entry.id] = UnitOutput(
                conversation=entry.id,
                unit=entry.units,
                kind=result.kind,
                text_tokens=result.text_tokens,
                text=self.model.detokenize(result.text_tokens),
                speech_tokens=result.speech_tokens,
                audio=result.audio,
                end_of_turn=result.end_of_turn,
                timing_ms=timing,
            )
            entry.units += 1
        return outputs

    # -- calibration

    def calibrate(
        self,
        counts: Sequence[int],
        rounds: int = 4,
        script: Callable[[int, int], Decision | None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> RoundModel:
        """Time ``rounds`` rounds at each of ``counts`` conversations (opened for it, closed after: the engine
        must be empty), the decisions of ``script(conversation, unit)`` (None: the model's own), and fit the
        round model admission reads."""
        if self.conversations:
            raise ConversationError(f"calibrate an empty engine: {len(self.conversations)} conversations are open")
        bad = [count for count in counts if not 1 <= count <= self.model.slots]
        if bad or not counts:
            raise ValueError(f"calibration counts must be 1..{self.model.slots}, got {list(counts)}")
        say = progress or (lambda message: None)
        previous, self.round_model = self.round_model, None  # every count must be admitted while it is measured
        generator = np.random.default_rng(0)
        measured: dict[int, float] = {}
        try:
            for count in counts:
                ids = [self.open(seed=index) for index in range(count)]
                slowest = 0.0
                try:
                    for unit in range(rounds):
                        audio = (0.1 * generator.standard_normal((count, self.unit_samples))).astype(np.float32)
                        inputs = {
                            cid: UnitInput(audio[index], script(index, unit) if script else None)
                            for index, cid in enumerate(ids)
                        }
                        started = time.perf_counter()
                        self.step(inputs)
                        slowest = max(slowest, (time.perf_counter() - started) * 1000)
                finally:
                    for cid in ids:
                        self.close(cid)
                measured[count] = slowest
                say(f"calibration: {count} conversation(s), slowest of {rounds} rounds {slowest:.0f} ms")
        except BaseException:
            self.round_model = previous  # a calibration that fails leaves admission as it was
            raise
        self.round_model = RoundModel.fit(measured)
        return self.round_model

    def describe(self) -> dict[str, Any]:
        capacity = self.capacity()
        return {"model": self.model.name, **attrs.asdict(capacity)}
