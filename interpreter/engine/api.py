"""The conversation engine's contract: what a caller (an inference script, the server) gives it and gets back.

A *conversation* is one whole duplex dialogue with a speech model: every *unit* (one second of the user's
audio) the model listens (LISTEN: the audio encoder and the LLM's prefill) and either keeps listening or
speaks (SPEAK: the LLM's text tokens, the TTS's speech tokens, the token-to-audio tail's audio). An engine
holds many conversations on one device and advances every conversation that has a unit of audio by one
unit per :meth:`ConversationEngine.step`, each stage batched across the conversations that need it.

The records here name no model; a model plugs in through :class:`ConversationModel` (the engine's
stages for that model) and is registered by name like the tails are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
import numpy as np

LISTEN = "listen"
SPEAK = "speak"
UNIT_KINDS = (LISTEN, SPEAK)


@attrs.frozen
class Decision:
    """A unit's decision forced on the model, as upstream's ``force_listen`` forces one: listen, or speak
    ``text`` (token ids), ending the speaking turn after it when ``end_of_turn``. The model still runs its
    whole sampling every step (its state advances as it would); only the chosen tokens are replaced.
    Scripted conversations (benchmarks, models with random weights) drive the engine this way."""

    kind: str
    text: tuple[int, ...] = ()
    end_of_turn: bool = False

    def __attrs_post_init__(self) -> None:
        if self.kind not in UNIT_KINDS:
            raise ValueError(f"a decision is {' or '.join(map(repr, UNIT_KINDS))}, got {self.kind!r}")
        if self.kind == LISTEN and (self.text or self.end_of_turn):
            raise ValueError("a listening decision has no text and ends no turn")


@attrs.frozen
class UnitInput:
    """One unit of a conversation: ``audio``, float32 mono samples at the engine's input rate, exactly
    :attr:`ConversationEngine.unit_samples` of them; ``decision``, None for the model's own choice."""

    audio: np.ndarray
    decision: Decision | None = None


@attrs.frozen
class UnitOutput:
    """What one unit of one conversation produced.

    ``audio`` is float32 mono at the engine's output rate: empty while listening and where the tail holds
    samples back (its first chunk of a turn comes out in the unit that completes it). ``speech_tokens`` are
    the TTS's tokens of this unit (what the tail was fed), so the audio can be checked against the stock tail
    fed the same tokens. ``timing_ms`` is the wall time of each stage of the round this unit was part of
    (a batched stage's time is shared by its rows: each row reports the whole stage)."""

    conversation: int
    unit: int
    kind: str
    text_tokens: tuple[int, ...]
    text: str
    speech_tokens: tuple[int, ...]
    audio: np.ndarray
    end_of_turn: bool
    timing_ms: Mapping[str, float] = attrs.field(factory=dict)


class ConversationRefused(Exception):
    """A conversation the engine cannot take: ``reason`` says why, with the numbers."""

    def __init__(self, reason: str, numbers: Mapping[str, float | int] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.numbers = dict(numbers or {})


class ConversationError(Exception):
    """A request about a conversation that is not valid now (an unknown id, audio of the wrong length, a unit
    for a closed conversation). Nothing changed. ``failed``: the conversation failed in an earlier round and
    takes nothing but a reset."""

    def __init__(self, message: str, failed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed


@attrs.frozen
class EngineCapacity:
    """How many conversations the engine admits, and why: bytes per conversation from the plan, the device's
    free bytes, and the calibrated round time at that many conversations against the cadence."""

    conversations: int
    """Conversations admitted now (the smaller of the memory and the time limit)."""
    active: int
    memory_limit: int
    time_limit: int
    bytes_per_conversation: int
    round_ms_at_limit: float | None
    cadence_ms: float


class ConversationEngine(Protocol):
    """N conversations on one device, each advanced one unit per :meth:`step` (see the module docstring)."""

    input_rate: int
    """Samples per second of the user's audio (16 000 for MiniCPM-o 4.5)."""
    output_rate: int
    """Samples per second of the model's audio (24 000)."""
    unit_samples: int
    """Samples of user audio per unit (one second)."""

    def open(self, seed: int = 0) -> int:
        """A new conversation (its system prompt prefilled), its id; :class:`ConversationRefused` when it
        does not fit."""
        ...

    def step(self, units: Mapping[int, UnitInput]) -> dict[int, UnitOutput]:
        """One unit of each conversation in ``units``, every stage batched across them. Raises
        :class:`ConversationError` before anything changes when an id or an input is not valid."""
        ...

    def reset(self, conversation: int) -> None:
        """Barge-in: the conversation starts over from its system prompt (its audio history, caches and
        tail back to the start)."""
        ...

    def close(self, conversation: int) -> None:
        """Frees the conversation's slot."""
        ...

    def capacity(self) -> EngineCapacity: ...


class ConversationModel(Protocol):
    """A model's stages for the engine: registered by name (``duplexcadence.conversations`` entry points)."""

    name: str
    input_rate: int
    output_rate: int
    unit_samples: int

    def detokenize(self, tokens: tuple[int, ...]) -> str:
        """The text of ``tokens`` (the model's tokenizer where it has one)."""
        ...
