"""The events of the conversation protocol, after OpenAI's Realtime API: reading a client's event (a refusal is an
`EventError`, and reading changes nothing), the session's configuration, and the server's events with their ids.

The client events this server takes are `CLIENT_EVENTS`; the OpenAI events it refuses, with why, are
`messages.UNSUPPORTED`. The project's own events are prefixed `duplexcadence.`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import attrs
import numpy as np

from duplexcadence.interpreter.engine.api import Decision
from duplexcadence.interpreter.serve.realtime import audio, messages

SESSION_UPDATE = "session.update"
APPEND = "input_audio_buffer.append"
COMMIT = "input_audio_buffer.commit"
CLEAR = "input_audio_buffer.clear"
DECISION = "duplexcadence.decision"
RESET = "duplexcadence.reset"
CLIENT_EVENTS = (SESSION_UPDATE, APPEND, COMMIT, CLEAR, DECISION, RESET)

AUDIO = "audio"
TEXT = "text"
OPENAI_DEFAULT_RATE = 24000
"""The rate of OpenAI's `audio/pcm` (and of the older `pcm16`), taken where a format names no rate."""
MAX_TEXT_TOKENS = 4096


class EventError(Exception):
    """A client event refused: the `error` event's `type`, `code`, `message` and `param`."""

    def __init__(self, code: str, message: str, param: str | None = None, kind: str = messages.INVALID_REQUEST):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.kind = kind
        self.client_event_id: str | None = None
        """The refused event's `event_id`, where it has one."""


@attrs.frozen
class SessionConfig:
    """What a client has configured: its audio's rates and the output modality (`audio`: audio with its
    transcript; `text`: text only)."""

    model: str
    input_rate: int
    output_rate: int
    modality: str = AUDIO

    def to_json(self) -> dict[str, Any]:
        """The `session` object of `session.created` and `session.updated` (without the project's fields)."""
        return {
            "type": "realtime",
            "object": "realtime.session",
            "model": self.model,
            "output_modalities": [self.modality],
            "audio": {
                "input": {"format": pcm_format(self.input_rate), "transcription": None, "turn_detection": None},
                "output": {"format": pcm_format(self.output_rate), "voice": None},
            },
        }


def pcm_format(rate: int) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": rate}


def read(text: str) -> dict[str, Any]:
    """A text frame as a JSON object."""
    try:
        event = json.loads(text)
    except ValueError as error:
        raise EventError(messages.INVALID_JSON, messages.invalid_json(f"not JSON ({error})")) from None
    except RecursionError:
        raise EventError(messages.INVALID_JSON, messages.invalid_json("nested deeper than JSON is read")) from None
    if not isinstance(event, dict):
        raise EventError(messages.INVALID_JSON, messages.invalid_json(f"a JSON {type(event).__name__}, not an object"))
    return event


def event_type(event: dict[str, Any]) -> str:
    """The type of an event this server takes."""
    kind = event.get("type")
    if not isinstance(kind, str):
        raise EventError(messages.INVALID_JSON, messages.invalid_json("no string `type`"), "type")
    if kind in messages.UNSUPPORTED:
        raise EventError(messages.UNSUPPORTED_EVENT, messages.unsupported_event(kind), "type")
    if kind not in CLIENT_EVENTS:
        raise EventError(messages.UNKNOWN_EVENT, messages.unknown_event(kind, CLIENT_EVENTS), "type")
    return kind


def invalid(param: str, problem: str) -> EventError:
    return EventError(messages.INVALID_VALUE, messages.invalid_value(param, problem), param)


def updated(config: SessionConfig, event: dict[str, Any]) -> SessionConfig:
    """The configuration `session.update` asks for. Fields of OpenAI's session that have no meaning here (the
    voice, instructions, tools, turn detection) are taken and have no effect."""
    session = event.get("session")
    if not isinstance(session, dict):
        raise invalid("session", "must be an object")
    if session.get("type", "realtime") != "realtime":
        raise invalid("session.type", f"this server holds 'realtime' sessions, not {session.get('type')!r}")
    changes: dict[str, Any] = {}
    modalities = session.get("output_modalities")
    if modalities is not None:
        if modalities not in ([AUDIO], [TEXT]):
            raise invalid("session.output_modalities", f"must be ['audio'] or ['text'], not {modalities!r}")
        changes["modality"] = modalities[0]
    section = session.get("audio", {})
    if not isinstance(section, dict):
        raise invalid("session.audio", "must be an object")
    for side, field in (("input", "input_rate"), ("output", "output_rate")):
        part = section.get(side, {})
        if not isinstance(part, dict):
            raise invalid(f"session.audio.{side}", "must be an object")
        if "format" in part:
            changes[field] = format_rate(part["format"], f"session.audio.{side}.format")
        legacy = session.get(f"{side}_audio_format")  # the Realtime API's beta sessions
        if legacy is not None:
            if legacy != "pcm16":
                raise invalid(f"session.{side}_audio_format", f"only 'pcm16' is served, not {legacy!r}")
            changes[field] = OPENAI_DEFAULT_RATE
    return attrs.evolve(config, **changes)


def format_rate(value: object, param: str) -> int:
    if not isinstance(value, dict):
        raise invalid(param, "must be an object such as {'type': 'audio/pcm', 'rate': 16000}")
    if value.get("type") != "audio/pcm":
        raise invalid(f"{param}.type", f"only 'audio/pcm' (PCM16) is served, not {value.get('type')!r}")
    rate = value.get("rate", OPENAI_DEFAULT_RATE)
    problem = audio.rate_problem(rate)
    if problem is not None:
        raise invalid(f"{param}.rate", problem)
    assert isinstance(rate, int)
    return rate


def appended_audio(event: dict[str, Any]) -> np.ndarray:
    """`input_audio_buffer.append`'s samples, float32."""
    try:
        return audio.decode_pcm16(event.get("audio"))
    except audio.AudioError as error:
        raise EventError(messages.INVALID_AUDIO, str(error), "audio") from None


def decision(event: dict[str, Any]) -> Decision:
    """`duplexcadence.decision`: `kind` ("listen" or "speak"), `text` (token ids), `end_of_turn`."""
    text = event.get("text", [])
    if not isinstance(text, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in text):
        raise invalid("text", "must be a list of token ids (whole numbers from 0)")
    if len(text) > MAX_TEXT_TOKENS:
        raise invalid("text", f"at most {MAX_TEXT_TOKENS} tokens a unit, not {len(text)}")
    end = event.get("end_of_turn", False)
    if not isinstance(end, bool):
        raise invalid("end_of_turn", f"must be true or false, not {end!r}")
    try:
        return Decision(event.get("kind"), tuple(text), end)  # type: ignore[arg-type]
    except ValueError as error:
        raise invalid("kind" if event.get("kind") not in ("listen", "speak") else "text", str(error)) from None


class ServerEvents:
    """The server's events of one conversation, each with its own `event_id`."""

    def __init__(self) -> None:
        self._ids = itertools.count()

    def make(self, event_type: str, /, **fields: Any) -> dict[str, Any]:
        return {"type": event_type, "event_id": f"event_{next(self._ids)}", **fields}

    def error(self, error: EventError) -> dict[str, Any]:
        """The `error` event of `error` (quoting the refused event's `event_id`)."""
        return self.make(
            "error",
            error={
                "type": error.kind,
                "code": error.code,
                "message": error.message,
                "param": error.param,
                "event_id": error.client_event_id,
            },
        )
