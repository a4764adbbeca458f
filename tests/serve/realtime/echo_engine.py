"""A small conversation engine of the tests' own (the `ConversationEngine` protocol, nothing else), importable by
name (`echo_engine:build`) where this folder is the working directory (Ray's replicas, `dsl serve`)."""

from __future__ import annotations

import numpy as np

from duplexcadence.interpreter.engine.api import (
    LISTEN,
    SPEAK,
    ConversationError,
    ConversationRefused,
    EngineCapacity,
    UnitInput,
    UnitOutput,
)
from duplexcadence.interpreter.serve.realtime import audio


class EchoEngine:
    """Speaks when a decision says so (else listens): 0.4 s of audio a speaking unit, a seeded function of the
    conversation's seed, its unit and the unit's input; text " w<token>" a token."""

    input_rate = 16000
    output_rate = 24000
    unit_samples = 16000

    def __init__(self, conversations: int = 2):
        self.slots = conversations
        self.open_ids: dict[int, tuple[int, int]] = {}  # id -> (seed, units)
        self.next_id = 0
        self.steps: list[list[int]] = []

    def open(self, seed: int = 0) -> int:
        if len(self.open_ids) >= self.slots:
            raise ConversationRefused(
                f"at capacity: {len(self.open_ids)} of {self.slots} conversations", {"conversations": self.slots}
            )
        self.next_id += 1
        self.open_ids[self.next_id] = (seed, 0)
        return self.next_id

    def step(self, units):
        for key, unit in units.items():
            if key not in self.open_ids:
                raise ConversationError(f"no conversation {key}")
            if unit.audio.shape != (self.unit_samples,):
                raise ConversationError(f"a unit is {self.unit_samples} samples, not {unit.audio.shape}")
        self.steps.append(sorted(units))
        return {key: self.one(key, unit) for key, unit in units.items()}

    def one(self, key: int, unit: UnitInput) -> UnitOutput:
        seed, count = self.open_ids[key]
        self.open_ids[key] = (seed, count + 1)
        decision = unit.decision
        kind = decision.kind if decision is not None else LISTEN
        tokens = decision.text if decision is not None else ()
        audio = np.zeros(0, np.float32)
        if kind == SPEAK:
            noise = np.random.default_rng([seed, count]).standard_normal(9600).astype(np.float32)
            audio = (0.2 * noise + float(unit.audio.mean())).astype(np.float32)
        return UnitOutput(
            conversation=key,
            unit=count,
            kind=kind,
            text_tokens=tokens,
            text="".join(f" w{t}" for t in tokens),
            speech_tokens=(),
            audio=audio,
            end_of_turn=decision.end_of_turn if decision is not None else False,
            timing_ms={"step": 1.0},
        )

    def reset(self, conversation: int) -> None:
        seed, _ = self.open_ids[conversation]
        self.open_ids[conversation] = (seed, 0)

    def close(self, conversation: int) -> None:
        del self.open_ids[conversation]

    def capacity(self) -> EngineCapacity:
        return EngineCapacity(self.slots, len(self.open_ids), self.slots, self.slots, 0, None, 1000.0)


def build(device: str = "cpu", conversations: int = 2, **options: str) -> EchoEngine:
    return EchoEngine(conversations)


def reference(seed: int, inputs: np.ndarray, decisions: list) -> tuple[np.ndarray, str]:
    """What the engine makes in-process of one conversation of PCM16 `inputs`: its audio as PCM16 and its text."""
    engine = EchoEngine(1)
    key = engine.open(seed)
    floats = inputs.astype(np.float32) / audio.PCM16_SCALE
    made, text = [], ""
    for number in range(len(floats) // engine.unit_samples):
        chunk = floats[number * engine.unit_samples : (number + 1) * engine.unit_samples]
        decision = decisions[number] if number < len(decisions) else None
        output = engine.step({key: UnitInput(chunk, decision)})[key]
        made.append(audio.to_pcm16(output.audio))
        text += output.text
    return np.concatenate(made), text
