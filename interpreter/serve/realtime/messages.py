"""Every word the conversation protocol (`/v1/realtime`) says to a client: its error types and codes, and their
texts. Errors travel in `error` events, after OpenAI's Realtime API:
`{"type": "error", "event_id": ..., "error": {"type": TYPE, "code": CODE, "message": TEXT, "param": ..., "event_id":
the client event's}}`; docs/serving.md has a row for each code (tests/serve/test_realtime_protocol.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable

INVALID_REQUEST = "invalid_request_error"
"""The client's event was refused; the conversation is unchanged (OpenAI's error type)."""
SERVER_ERROR = "server_error"
"""The server could not do what a valid event asked (OpenAI's error type)."""
ADMISSION = "duplexcadence.admission"
"""The project's error type: the conversation was not admitted (the code says why, the message the numbers)."""

INVALID_JSON = "invalid_json"
BINARY_FRAME = "binary_frame"
EVENT_TOO_LARGE = "event_too_large"
UNKNOWN_EVENT = "unknown_event"
UNSUPPORTED_EVENT = "unsupported_event"
INVALID_VALUE = "invalid_value"
INVALID_AUDIO = "invalid_audio"
COMMIT_EMPTY = "input_audio_buffer_commit_empty"
QUEUE_FULL = "queue_full"
UNIT_REFUSED = "unit_refused"
UNIT_FAILED = "unit_failed"
MODEL_NOT_SERVED = "model_not_served"
BAD_SEED = "invalid_seed"

ERROR_CODES: dict[str, str] = {
    INVALID_JSON: "a text frame that is not one JSON object with a string `type`",
    BINARY_FRAME: "a binary frame: audio travels base64 in `input_audio_buffer.append`",
    EVENT_TOO_LARGE: "a text frame longer than the server reads as one event (append the audio in smaller pieces)",
    UNKNOWN_EVENT: "an event type this protocol does not have",
    UNSUPPORTED_EVENT: "an event of OpenAI's Realtime API that a full-duplex conversation does not take",
    INVALID_VALUE: "a field of a known event with a value it cannot take (`param` names it)",
    INVALID_AUDIO: "`audio` that is not base64 PCM16",
    COMMIT_EMPTY: "`input_audio_buffer.commit` with no audio buffered (OpenAI's code)",
    QUEUE_FULL: (
        "an event that could complete more units than the conversation may still queue (the queue depth), or a "
        "reset while as many resets are queued"
    ),
    UNIT_REFUSED: "the engine refused a unit before running it (a decision it cannot take); the conversation goes on",
    UNIT_FAILED: "the engine failed a unit (error type `server_error`); the conversation needs a reset",
    MODEL_NOT_SERVED: "a `model` query parameter naming another model than the one served",
    BAD_SEED: "a `seed` query parameter that is not a whole number",
}
"""Every code of an `invalid_request_error` or `server_error`. The `duplexcadence.admission` type carries the
serving layer's codes (`at-capacity`, `draining`), and a conversation the server closes carries the code of
why (`idle-timeout`, `shutting-down`, `internal`)."""

UNSUPPORTED = {
    "response.create": "the model takes its turns itself, every unit; send `duplexcadence.decision` to script one",
    "response.cancel": "the model takes its turns itself; `duplexcadence.reset` starts the conversation over",
    "conversation.item.create": "a conversation's items are its units of audio",
    "conversation.item.retrieve": "a conversation's items are its units of audio",
    "conversation.item.truncate": "a conversation's items are its units of audio",
    "conversation.item.delete": "a conversation's items are its units of audio",
    "output_audio_buffer.clear": "the server keeps no output buffer: audio is sent as each unit is made",
    "transcription_session.update": "this server holds conversations, not transcription sessions",
}
"""The client events of OpenAI's Realtime API this server answers with `unsupported_event`, and why."""


def invalid_json(problem: str) -> str:
    return f"the event is not valid: {problem}"


def binary_frame(size: int) -> str:
    return f"a binary frame ({size} bytes) is not an event: send audio as base64 PCM16 in `input_audio_buffer.append`"


def event_too_large(size: int, most: int) -> str:
    return f"an event of {size} characters is more than the {most} this server reads: append audio in smaller pieces"


def unknown_event(kind: str, known: Iterable[str]) -> str:
    return f"unknown event type {kind!r}; the events this server takes: {', '.join(sorted(known))}"


def unsupported_event(kind: str) -> str:
    return f"{kind!r} is not supported in a full-duplex conversation: {UNSUPPORTED[kind]}"


def invalid_value(param: str, problem: str) -> str:
    return f"{param}: {problem}"


def commit_empty() -> str:
    return "the input audio buffer is empty: append audio before committing it"


def queue_full(depth: int, units: int, room: int) -> str:
    return (
        f"this event could complete {units} units and {room} more of the {depth} a conversation may queue fit; "
        "nothing was taken: send audio at the pace of the conversation (one unit a cadence), in smaller appends"
    )


def resets_queue_full(depth: int) -> str:
    return (
        f"{depth} resets already wait for the engine: nothing was dropped; send the next after a "
        "`duplexcadence.reset.done`"
    )


def unit_refused(unit: int, cause: str) -> str:
    return f"unit {unit} was refused and not run: {cause}; the conversation is unchanged"


def unit_failed(unit: int, cause: str) -> str:
    return f"unit {unit} failed in the engine: {cause}; send `duplexcadence.reset` to start the conversation over"


def model_not_served(asked: str, served: str) -> str:
    return f"this server serves {served!r}, not {asked!r} (leave `model` out, or name {served!r})"


def bad_seed(text: str) -> str:
    return f"the seed must be a whole number, not {text!r}"
