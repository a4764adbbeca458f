"""One client's conversation as the protocol sees it: the client's events in, the units for the engine and the
server's events out. No socket and no engine here (`app.py` joins them).

    conversation = RealtimeConversation(served, conversation_id=0, seed=3)
    send(conversation.created())                                  # session.created
    for action in conversation.receive(text, Room(4, 4)):         # in order: Send, Unit, Reset, Configure
        ...
    send(conversation.answer(number, unit_output, latency_s))     # the response's events and duplexcadence.unit
    send(conversation.configure(config))                          # a Configure's turn: session.updated

The client's side (`config`, the buffer, the decisions, the unit numbers) changes as events arrive; the output's
side (`answering`: the output rate and modality, the open response) changes in the order the answers are sent,
so the units queued before a `session.update` are answered at the settings they were queued under.
"""

from __future__ import annotations

import collections
from typing import Any

import attrs
import numpy as np

from duplexcadence.interpreter.engine.api import LISTEN, SPEAK, Decision, UnitInput, UnitOutput
from duplexcadence.interpreter.serve.realtime import audio, events, messages
from duplexcadence.interpreter.serve.realtime.events import EventError

MAX_DECISIONS = 64


@attrs.frozen
class Served:
    """What the server serves a conversation: the model, the engine's rates and unit, the cadence and the units
    a conversation may have queued."""

    model: str
    input_rate: int
    output_rate: int
    unit_samples: int
    cadence_s: float
    queue_depth: int


@attrs.frozen
class Send:
    event: dict[str, Any]


@attrs.frozen
class Unit:
    """A unit for the engine: its number in the conversation and its input."""

    number: int
    input: UnitInput


@attrs.frozen
class Reset:
    """Barge-in: the engine starts the conversation over."""


@attrs.frozen
class Configure:
    """A `session.update` taken: the answers after the units queued before it are made at `config`
    (`RealtimeConversation.configure`, which says `session.updated`)."""

    config: events.SessionConfig


Action = Send | Unit | Reset | Configure


@attrs.frozen
class Room:
    """What a conversation may still queue: `units` for the engine and `resets`."""

    units: int
    resets: int


@attrs.define
class OpenResponse:
    id: str
    item_id: str
    text: list[str] = attrs.field(factory=list)
    units: int = 0


class RealtimeConversation:
    """The protocol's state of one conversation (see the module docstring)."""

    def __init__(self, served: Served, conversation_id: int, seed: int):
        self.served = served
        self.conversation_id = conversation_id
        self.seed = seed
        self.config = events.SessionConfig(served.model, served.input_rate, served.output_rate)
        """The client's configuration: its input is read at it, `session.updated` shows it."""
        self.events = events.ServerEvents()
        self.buffer = audio.UnitBuffer(served.unit_samples)
        self.decisions: collections.deque[Decision] = collections.deque()
        self.inward = audio.Resampler(self.config.input_rate, served.input_rate)
        self.units = 0
        self.answering = self.config
        """The configuration the answers are made at (the output rate and modality)."""
        self.outward = audio.Resampler(served.output_rate, self.answering.output_rate)
        self.responses = 0
        self.response: OpenResponse | None = None

    # --- the client's side -----------------------------------------------------------------------------

    def created(self) -> dict[str, Any]:
        return self.events.make("session.created", session=self.session_json())

    def session_json(self, config: events.SessionConfig | None = None) -> dict[str, Any]:
        served = self.served
        return {
            **(config or self.config).to_json(),
            "id": f"sess_{self.conversation_id}",
            "duplexcadence": {
                "conversation": self.conversation_id,
                "seed": self.seed,
                "unit_samples": served.unit_samples,
                "input_rate": served.input_rate,
                "output_rate": served.output_rate,
                "cadence_s": served.cadence_s,
                "queue_depth": served.queue_depth,
            },
        }

    def receive(self, text: str, room: Room) -> list[Action]:
        """A client's text frame: what to do, in order. `room`: what the conversation may still queue. A refused
        event gives one `error` event and changes nothing."""
        try:
            event = events.read(text)
        except EventError as error:
            return [Send(self.events.error(error))]
        try:
            return self._handle(events.event_type(event), event, room)
        except EventError as error:
            quoted = event.get("event_id")
            error.client_event_id = quoted if isinstance(quoted, str) else None
            return [Send(self.events.error(error))]

    @staticmethod
    def refusal(error: EventError, numbers: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `error` event of a conversation refused before it opened; `numbers`: admission's, as
        `error.duplexcadence`."""
        event = events.ServerEvents().error(error)
        if numbers:
            event["error"]["duplexcadence"] = dict(numbers)
        return event

    def too_large(self, size: int, most: int) -> list[Action]:
        error = EventError(messages.EVENT_TOO_LARGE, messages.event_too_large(size, most))
        return [Send(self.events.error(error))]

    def binary(self, size: int) -> list[Action]:
        error = EventError(messages.BINARY_FRAME, messages.binary_frame(size))
        return [Send(self.events.error(error))]

    def _handle(self, kind: str, event: dict[str, Any], room: Room) -> list[Action]:
        if kind == events.APPEND:
            samples = events.appended_audio(event)
            self._check_room(self.buffer.samples + self.inward.most(len(samples)), room)
            return list(self._units(self.inward(samples)))
        if kind == events.SESSION_UPDATE:
            config = events.updated(self.config, event)
            if config.input_rate != self.config.input_rate:
                self._check_room(self.buffer.samples + self.inward.most(0), room)
            return [*self._set_config(config), Configure(config)]
        if kind == events.COMMIT:
            self._check_room(self.buffer.samples + self.inward.most(0), room, padded=True)
            units = self._units(self.inward(np.zeros(0, np.float32), last=True))
            self.inward = audio.Resampler(self.config.input_rate, self.served.input_rate)
            padded = self.buffer.pad()
            if padded is not None:
                units.append(self._unit(padded))
            if not units:
                raise EventError(messages.COMMIT_EMPTY, messages.commit_empty())
            item = f"item_unit_{units[-1].number}"
            return [Send(self.events.make("input_audio_buffer.committed", item_id=item, previous_item_id=None)), *units]
        if kind == events.CLEAR:
            self.buffer.clear()
            self.inward = audio.Resampler(self.config.input_rate, self.served.input_rate)
            return [Send(self.events.make("input_audio_buffer.cleared"))]
        if kind == events.DECISION:
            decision = events.decision(event)
            if len(self.decisions) >= MAX_DECISIONS:
                raise events.invalid("type", f"at most {MAX_DECISIONS} decisions wait for their units")
            self.decisions.append(decision)
            return []
        assert kind == events.RESET
        if room.resets < 1:
            raise EventError(messages.QUEUE_FULL, messages.resets_queue_full(self.served.queue_depth))
        self.buffer.clear()
        self.decisions.clear()
        self.units = 0
        self.inward = audio.Resampler(self.config.input_rate, self.served.input_rate)
        return [Reset()]

    def _check_room(self, samples: int, room: Room, padded: bool = False) -> None:
        """QUEUE_FULL when `samples` (at most, at the engine's rate) could complete more units than `room`
        has; `padded`: a partial unit is completed with silence."""
        whole, partial = divmod(samples, self.served.unit_samples)
        units = whole + (1 if padded and partial else 0)
        if units > room.units:
            raise EventError(messages.QUEUE_FULL, messages.queue_full(self.served.queue_depth, units, room.units))

    def _units(self, samples: np.ndarray) -> list[Unit]:
        return [self._unit(unit) for unit in self.buffer.add(samples)]

    def _unit(self, samples: np.ndarray) -> Unit:
        decision = self.decisions.popleft() if self.decisions else None
        unit = Unit(self.units, UnitInput(samples, decision))
        self.units += 1
        return unit

    def _set_config(self, config: events.SessionConfig) -> list[Action]:
        """Take `config` for the input; a new input rate first flushes the old stream into the buffer (the units
        it completes)."""
        actions: list[Action] = []
        if config.input_rate != self.config.input_rate:
            actions += self._units(self.inward(np.zeros(0, np.float32), last=True))
            self.inward = audio.Resampler(config.input_rate, self.served.input_rate)
        self.config = config
        return actions

    # --- the engine's side -----------------------------------------------------------------------------

    def answer(self, number: int, output: UnitOutput, latency_s: float) -> list[dict[str, Any]]:
        """The events of a unit's output: the response it opens, continues or ends, then `duplexcadence.unit`."""
        sent: list[dict[str, Any]] = []
        speaking = output.kind == SPEAK or len(output.audio) > 0
        if speaking and self.response is None:
            sent += self._open()
        response = self.response
        if speaking and response is not None:
            response.units += 1
            sent += self._deltas(response, output)
        response_id = response.id if speaking and response is not None else None
        if self.response is not None and (output.end_of_turn or output.kind == LISTEN):
            sent += self._close("completed")
        sent.append(
            self.events.make(
                "duplexcadence.unit",
                unit=number,
                kind=output.kind,
                response_id=response_id,
                text=output.text,
                text_tokens=list(output.text_tokens),
                audio_samples=len(output.audio),
                end_of_turn=output.end_of_turn,
                latency_ms=round(latency_s * 1000, 3),
                timing_ms=dict(output.timing_ms),
            )
        )
        return sent

    def configure(self, config: events.SessionConfig) -> list[dict[str, Any]]:
        """A `Configure`'s turn: the answers from here are made at `config`, then `session.updated`. A response
        open at another output rate or modality first completes at the old ones."""
        sent: list[dict[str, Any]] = []
        old = self.answering
        changed = (config.output_rate, config.modality) != (old.output_rate, old.modality)
        if changed and self.response is not None:
            sent += self._close("completed")
        self.answering = config
        if config.output_rate != old.output_rate:
            self.outward = audio.Resampler(self.served.output_rate, config.output_rate)
        return [*sent, self.events.make("session.updated", session=self.session_json(config))]

    def unit_refused(self, number: int, cause: str) -> list[dict[str, Any]]:
        """A unit the engine refused before running it: the conversation, and an open response, go on."""
        return [self.events.error(EventError(messages.UNIT_REFUSED, messages.unit_refused(number, cause)))]

    def unit_failed(self, number: int, cause: str) -> list[dict[str, Any]]:
        """A unit the engine failed: the open response fails with it."""
        error = EventError(messages.UNIT_FAILED, messages.unit_failed(number, cause), kind=messages.SERVER_ERROR)
        closing = self._close("failed") if self.response is not None else []
        return [*closing, self.events.error(error)]

    def was_reset(self) -> list[dict[str, Any]]:
        """The engine started the conversation over: the open response is cancelled."""
        closing = self._close("cancelled") if self.response is not None else []
        self.outward = audio.Resampler(self.served.output_rate, self.answering.output_rate)
        return [*closing, self.events.make("duplexcadence.reset.done")]

    def _part(self) -> str:
        return "audio" if self.answering.modality == events.AUDIO else "text"

    def _open(self) -> list[dict[str, Any]]:
        number = self.responses
        self.responses += 1
        response = self.response = OpenResponse(f"resp_{number}", f"item_resp_{number}")
        ids = {"response_id": response.id, "output_index": 0}
        return [
            self.events.make("response.created", response=self._response_json(response, "in_progress")),
            self.events.make("response.output_item.added", item=self._item_json(response, "in_progress"), **ids),
            self.events.make(
                "response.content_part.added",
                item_id=response.item_id,
                content_index=0,
                part={"type": self._part(), "transcript" if self._part() == "audio" else "text": ""},
                **ids,
            ),
        ]

    def _deltas(self, response: OpenResponse, output: UnitOutput) -> list[dict[str, Any]]:
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        sent = []
        if output.text:
            response.text.append(output.text)
            kind = "response.output_audio_transcript.delta" if self._part() == "audio" else "response.output_text.delta"
            sent.append(self.events.make(kind, delta=output.text, **ids))
        if self._part() == "audio":
            samples = self.outward(np.asarray(output.audio, dtype=np.float32))
            if len(samples):
                sent.append(self.events.make("response.output_audio.delta", delta=audio.encode_pcm16(samples), **ids))
        return sent

    def _close(self, status: str) -> list[dict[str, Any]]:
        response = self.response
        assert response is not None
        self.response = None
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        sent = []
        text = "".join(response.text)
        if self._part() == "audio":
            tail = self.outward(np.zeros(0, np.float32), last=True)
            self.outward = audio.Resampler(self.served.output_rate, self.answering.output_rate)
            if len(tail):
                sent.append(self.events.make("response.output_audio.delta", delta=audio.encode_pcm16(tail), **ids))
            sent.append(self.events.make("response.output_audio.done", **ids))
            sent.append(self.events.make("response.output_audio_transcript.done", transcript=text, **ids))
            part = {"type": "audio", "transcript": text}
        else:
            sent.append(self.events.make("response.output_text.done", text=text, **ids))
            part = {"type": "text", "text": text}
        sent.append(self.events.make("response.content_part.done", part=part, **ids))
        item_ids = {"response_id": response.id, "output_index": 0}
        sent.append(self.events.make("response.output_item.done", item=self._item_json(response, status), **item_ids))
        sent.append(self.events.make("response.done", response=self._response_json(response, status)))
        return sent

    def _item_json(self, response: OpenResponse, status: str) -> dict[str, Any]:
        done = status != "in_progress"
        text = "".join(response.text)
        content = (
            [
                {"type": "output_audio", "transcript": text}
                if self._part() == "audio"
                else {"type": "output_text", "text": text}
            ]
            if done
            else []
        )
        return {
            "id": response.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed" if done and status == "completed" else "incomplete" if done else "in_progress",
            "content": content,
        }

    def _response_json(self, response: OpenResponse, status: str) -> dict[str, Any]:
        done = status != "in_progress"
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": None,
            "conversation_id": f"conv_{self.conversation_id}",
            "output_modalities": [self.answering.modality],
            "output": [self._item_json(response, status)] if done else [],
            "audio": {"output": {"format": events.pcm_format(self.answering.output_rate)}},
            "usage": None,
            "metadata": None,
        }
