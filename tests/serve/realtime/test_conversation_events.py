"""The conversation protocol's events without a model: `RealtimeConversation` fed client events and fake
`UnitOutput`s (what the queue has room for, output settings that follow the answers' order, refused and failed
units, malformed events), and `/v1/realtime` over a toy engine that refuses some units before running them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import websockets.sync.client

from duplexcadence.interpreter.engine.api import (
    LISTEN,
    SPEAK,
    ConversationError,
    Decision,
    EngineCapacity,
    UnitInput,
    UnitOutput,
)
from duplexcadence.interpreter.serve import messages as serve_messages
from duplexcadence.interpreter.serve.app import FrontLimits
from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig
from duplexcadence.interpreter.serve.realtime import audio, messages
from duplexcadence.interpreter.serve.realtime.app import EVENT_BYTES, make_conversation_app
from duplexcadence.interpreter.serve.realtime.conversation import (
    Configure,
    RealtimeConversation,
    Reset,
    Room,
    Send,
    Served,
    Unit,
)
from duplexcadence.interpreter.serve.realtime.events import SessionConfig
from duplexcadence.interpreter.serve.server import ServerThread

UNIT_SAMPLES = 1600
SERVED = Served("toy", 16000, 24000, UNIT_SAMPLES, 0.1, 4)
ROOM = Room(4, 4)


def conversation() -> RealtimeConversation:
    return RealtimeConversation(SERVED, conversation_id=0, seed=0)


def append(samples: int, rate_scale: float = 0.25, **fields) -> str:
    pcm = np.full(samples, int(rate_scale * 32767), "<i2")
    return json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm.tobytes()).decode(), **fields}
    )


def event(event_type: str, **fields) -> str:
    return json.dumps({"type": event_type, **fields})


def decision(kind: str = LISTEN, text=(), end: bool = False) -> str:
    return event("duplexcadence.decision", kind=kind, text=list(text), end_of_turn=end)


def update(**session) -> str:
    return event("session.update", session=session)


def output_rate(rate: int) -> dict:
    return {"output": {"format": {"type": "audio/pcm", "rate": rate}}}


def input_rate(rate: int) -> dict:
    return {"input": {"format": {"type": "audio/pcm", "rate": rate}}}


def speaking(audio_samples: int = 2400, text: str = "<11>", end: bool = False) -> UnitOutput:
    samples = np.linspace(-0.5, 0.5, audio_samples, dtype=np.float32)
    return UnitOutput(0, 0, SPEAK, (11,), text, (1,), samples, end)


def error_of(actions) -> dict:
    (action,) = actions
    assert isinstance(action, Send) and action.event["type"] == "error"
    return action.event["error"]


def state(protocol: RealtimeConversation) -> tuple:
    return (
        protocol.buffer.samples,
        protocol.units,
        list(protocol.decisions),
        protocol.config,
        protocol.inward.taken,
        protocol.inward.given,
    )


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


# --- what the queue has room for ---------------------------------------------------------------------------


def test_an_append_that_could_complete_more_units_than_the_room_is_refused_whole():
    protocol = conversation()
    protocol.receive(decision(), ROOM)
    protocol.receive(append(1000), ROOM)
    before = state(protocol)
    refusal = error_of(protocol.receive(append(3 * UNIT_SAMPLES, event_id="ev1"), Room(2, 4)))
    assert refusal == {
        "type": messages.INVALID_REQUEST,
        "code": messages.QUEUE_FULL,
        "message": messages.queue_full(4, 3, 2),
        "param": None,
        "event_id": "ev1",
    }
    assert state(protocol) == before
    units = protocol.receive(append(3 * UNIT_SAMPLES - 1000), Room(3, 4))
    assert [(u.number, u.input.decision) for u in units] == [(0, Decision(LISTEN)), (1, None), (2, None)]
    assert protocol.buffer.samples == 0


def test_with_a_resampler_an_append_counts_the_most_samples_it_could_give():
    protocol = conversation()
    protocol.receive(update(audio=input_rate(24000)), ROOM)
    protocol.receive(append(1200), ROOM)  # half a unit at 24 kHz, some of it held back by the filter
    held = protocol.buffer.samples
    assert protocol.units == 0 and held < UNIT_SAMPLES
    needed = (UNIT_SAMPLES - held) * 3 // 2  # 24 kHz samples that could complete the unit
    before = state(protocol)
    refusal = error_of(protocol.receive(append(needed), Room(0, 4)))
    assert (refusal["code"], refusal["message"]) == (messages.QUEUE_FULL, messages.queue_full(4, 1, 0))
    assert state(protocol) == before
    assert protocol.receive(append(4), Room(0, 4)) == []  # far from a unit: taken with no room
    assert protocol.inward.taken == 1204


def test_the_resamplers_bound_is_never_under_what_it_gives():
    rng = np.random.default_rng(0)
    for source, target in ((24000, 16000), (44100, 16000), (8000, 16000), (48000, 16000), (11025, 16000)):
        resampler = audio.Resampler(source, target)
        for count in rng.integers(0, 5000, 40):
            bound = resampler.most(int(count))
            assert len(resampler(np.zeros(int(count), np.float32))) <= bound
        bound = resampler.most(0)
        assert len(resampler(np.zeros(0, np.float32), last=True)) <= bound
    identity = audio.Resampler(16000, 16000)
    assert identity.most(1234) == 1234 and (identity.taken, identity.given) == (0, 0)


def test_a_commit_that_could_complete_more_units_than_the_room_is_refused():
    protocol = conversation()
    protocol.receive(update(audio=input_rate(24000)), ROOM)
    (unit,) = protocol.receive(append(5100), ROOM)  # 2.125 units at 24 kHz, some held back by the filter
    assert unit.number == 0 and protocol.buffer.samples < UNIT_SAMPLES
    before = state(protocol)
    refusal = error_of(protocol.receive(event("input_audio_buffer.commit", event_id="c1"), Room(1, 4)))
    assert (refusal["code"], refusal["message"], refusal["event_id"]) == (
        messages.QUEUE_FULL,
        messages.queue_full(4, 2, 1),
        "c1",
    )
    assert state(protocol) == before
    committed, *units = protocol.receive(event("input_audio_buffer.commit"), Room(2, 4))
    assert committed.event["type"] == "input_audio_buffer.committed"
    assert [u.number for u in units] == [1, 2] and protocol.buffer.samples == 0


def test_an_input_rate_change_that_could_complete_more_units_than_the_room_is_refused():
    protocol = conversation()
    protocol.receive(update(audio=input_rate(24000)), ROOM)
    protocol.receive(append(2400), ROOM)  # a unit, the filter holding some of it back
    assert protocol.units == 0
    before = state(protocol)
    refusal = error_of(protocol.receive(update(audio=input_rate(48000)), Room(0, 4)))
    assert (refusal["code"], refusal["message"]) == (messages.QUEUE_FULL, messages.queue_full(4, 1, 0))
    assert state(protocol) == before and protocol.config.input_rate == 24000
    actions = protocol.receive(update(audio=input_rate(48000)), Room(1, 4))
    assert [type(a) for a in actions][-1] is Configure and protocol.config.input_rate == 48000


def test_a_reset_while_the_resets_queued_are_at_the_depth_is_refused_before_anything_is_dropped():
    protocol = conversation()
    protocol.receive(decision(), ROOM)
    protocol.receive(append(UNIT_SAMPLES + 500), ROOM)
    before = state(protocol)
    refusal = error_of(protocol.receive(event("duplexcadence.reset", event_id="r1"), Room(4, 0)))
    assert refusal == {
        "type": messages.INVALID_REQUEST,
        "code": messages.QUEUE_FULL,
        "message": messages.resets_queue_full(4),
        "param": None,
        "event_id": "r1",
    }
    assert state(protocol) == before and protocol.units == 1
    assert protocol.receive(event("duplexcadence.reset"), Room(4, 1)) == [Reset()]
    assert (protocol.units, protocol.buffer.samples) == (0, 0)


# --- session.update takes effect in the answers' order -------------------------------------------------------


def test_a_session_update_applies_its_output_side_after_the_units_queued_before_it():
    protocol = conversation()
    (at_48k,) = protocol.receive(update(audio=output_rate(48000)), ROOM)
    assert types(protocol.configure(at_48k.config)) == ["session.updated"]
    (unit,) = protocol.receive(append(UNIT_SAMPLES), ROOM)
    assert isinstance(unit, Unit)
    actions = protocol.receive(update(output_modalities=["text"], audio=output_rate(16000)), ROOM)
    assert actions == [Configure(SessionConfig("toy", 16000, 16000, "text"))]
    assert protocol.config.modality == "text" and protocol.answering.modality == "audio"
    # the unit queued before the update is answered as 48 kHz audio, its response still open
    answered = protocol.answer(unit.number, speaking(), 0.01)
    assert types(answered) == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "duplexcadence.unit",
    ]
    first = answered[0]["response"]
    assert (first["output_modalities"], first["audio"]["output"]["format"]["rate"]) == (["audio"], 48000)
    # the update's turn: the open response completes at the old settings, then session.updated
    (configure,) = actions
    configured = protocol.configure(configure.config)
    assert types(configured) == [
        "response.output_audio.delta",  # the old resampler's tail
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
        "session.updated",
    ]
    assert configured[-2]["response"]["status"] == "completed"
    session = configured[-1]["session"]
    assert session["output_modalities"] == ["text"] and session["audio"]["output"]["format"]["rate"] == 16000
    deltas = [e for e in [*answered, *configured] if e["type"] == "response.output_audio.delta"]
    played = np.concatenate([audio.pcm16_samples(e["delta"]) for e in deltas])
    resampler = audio.Resampler(24000, 48000)
    made = [resampler(np.linspace(-0.5, 0.5, 2400, dtype=np.float32)), resampler(np.zeros(0, np.float32), last=True)]
    assert np.array_equal(played, audio.to_pcm16(np.concatenate(made))) and len(played) == 4800
    # the units after it: text only, in a new response
    later = protocol.answer(1, speaking(end=True), 0.01)
    assert "response.output_audio.delta" not in types(later) and "response.output_text.delta" in types(later)
    assert later[0]["response"]["id"] == "resp_1"


def test_a_session_update_with_the_same_output_leaves_the_open_response_open():
    protocol = conversation()
    protocol.answer(0, speaking(), 0.01)
    (configure,) = protocol.receive(update(audio=input_rate(24000)), ROOM)
    assert types(protocol.configure(configure.config)) == ["session.updated"]
    assert protocol.response is not None and protocol.response.id == "resp_0"


# --- units the engine refuses or fails -----------------------------------------------------------------------


def test_a_unit_the_engine_refuses_is_an_invalid_request_and_the_open_response_stays_open():
    protocol = conversation()
    protocol.answer(0, speaking(), 0.01)
    (refused,) = protocol.unit_refused(1, "conversation 0: a listening decision inside a speaking turn")
    assert refused["error"] == {
        "type": messages.INVALID_REQUEST,
        "code": messages.UNIT_REFUSED,
        "message": "unit 1 was refused and not run: conversation 0: a listening decision inside a speaking turn; "
        "the conversation is unchanged",
        "param": None,
        "event_id": None,
    }
    assert protocol.response is not None
    going_on = protocol.answer(2, speaking(end=True), 0.01)
    assert types(going_on)[:2] == ["response.output_audio_transcript.delta", "response.output_audio.delta"]
    assert going_on[-1]["response_id"] == "resp_0"


def test_a_unit_the_engine_fails_fails_the_open_response():
    protocol = conversation()
    protocol.answer(0, speaking(), 0.01)
    failed = protocol.unit_failed(1, "RuntimeError: the device fell over")
    assert types(failed)[-2:] == ["response.done", "error"]
    assert failed[-2]["response"]["status"] == "failed"
    assert (failed[-1]["error"]["type"], failed[-1]["error"]["code"]) == (messages.SERVER_ERROR, messages.UNIT_FAILED)


# --- malformed events ----------------------------------------------------------------------------------------


def test_json_nested_past_the_parsers_depth_is_invalid_json():
    protocol = conversation()
    before = state(protocol)
    text = '{"type":"x","a":' + "[" * 100000 + "]" * 100000 + "}"
    assert error_of(protocol.receive(text, ROOM)) == {
        "type": messages.INVALID_REQUEST,
        "code": messages.INVALID_JSON,
        "message": messages.invalid_json("nested deeper than JSON is read"),
        "param": None,
        "event_id": None,
    }
    assert state(protocol) == before


# --- /v1/realtime over a toy engine ----------------------------------------------------------------------------


class ToyEngine:
    """Conversations that listen, unit by unit; `check` refuses a speaking decision (as a model refuses a
    decision it cannot take) and a conversation failed by `fail_next`."""

    input_rate, output_rate, unit_samples = 16000, 24000, UNIT_SAMPLES

    def __init__(self) -> None:
        self.open_ids: dict[int, bool] = {}
        self.units: list[int] = []
        self.fail_next = False

    def open(self, seed: int = 0) -> int:
        self.open_ids[len(self.open_ids)] = False
        return len(self.open_ids) - 1

    def check(self, units) -> None:
        for conversation, unit in units.items():
            if self.open_ids[conversation]:
                raise ConversationError(f"conversation {conversation} failed (boom); reset it to go on", failed=True)
            if unit.decision is not None and unit.decision.kind == SPEAK:
                raise ConversationError(f"conversation {conversation}: speaking is not taken here")

    def step(self, units):
        self.check(units)
        if self.fail_next:
            self.fail_next = False
            for conversation in units:
                self.open_ids[conversation] = True
            raise RuntimeError("boom")
        self.units += list(units)
        return {c: UnitOutput(c, 0, LISTEN, (), "", (), np.zeros(0, np.float32), False) for c in units}

    def reset(self, conversation: int) -> None:
        self.open_ids[conversation] = False

    def close(self, conversation: int) -> None:
        pass

    def capacity(self) -> EngineCapacity:
        return EngineCapacity(4, len(self.open_ids), 4, 4, 0, None, 100.0)


@pytest.fixture
def toy_server():
    engine = ToyEngine()
    pool = ConversationPool(lambda: engine, "toy", ConversationPoolConfig(pace=None, latency_guard=False))
    app = make_conversation_app(pool, limits=FrontLimits(control_bytes=4096))
    with ServerThread(app) as running:
        yield running, engine


def test_the_event_limit_of_conversations_is_their_own_not_a_tails_control_limit(toy_server):
    running, _ = toy_server
    with websockets.sync.client.connect(running.ws_url("/v1/realtime")) as socket:
        assert json.loads(socket.recv())["type"] == "session.created"
        socket.send(decision())
        socket.send(append(UNIT_SAMPLES))  # about 4.3 k characters: over a tail's 4096
        assert json.loads(socket.recv())["type"] == "duplexcadence.unit"
        socket.send("x" * (EVENT_BYTES + 1))
        error = json.loads(socket.recv())["error"]
    assert (error["code"], error["message"]) == (
        messages.EVENT_TOO_LARGE,
        messages.event_too_large(EVENT_BYTES + 1, EVENT_BYTES),
    )


def test_a_unit_the_engine_refuses_is_unit_refused_and_a_failed_conversation_unit_failed(toy_server):
    running, engine = toy_server
    with websockets.sync.client.connect(running.ws_url("/v1/realtime")) as socket:
        socket.recv()
        socket.send(decision(SPEAK, (11,)))
        socket.send(append(UNIT_SAMPLES))
        refused = json.loads(socket.recv())
        socket.send(append(UNIT_SAMPLES))
        went_on = json.loads(socket.recv())
        engine.fail_next = True
        socket.send(append(UNIT_SAMPLES))
        failed = json.loads(socket.recv())
        socket.send(append(UNIT_SAMPLES))
        after = json.loads(socket.recv())
    assert (refused["error"]["type"], refused["error"]["code"]) == (messages.INVALID_REQUEST, messages.UNIT_REFUSED)
    assert refused["error"]["message"] == messages.unit_refused(0, "conversation 0: speaking is not taken here")
    assert (went_on["type"], went_on["unit"]) == ("duplexcadence.unit", 1)
    assert (failed["error"]["code"], after["error"]["code"]) == (messages.UNIT_FAILED, messages.UNIT_FAILED)
    assert "reset it to go on" in after["error"]["message"]


def test_the_pool_answers_a_failed_conversation_session_failed_and_a_refused_unit_bad_input():
    from duplexcadence.interpreter.serve.conversations import ConversationRounds

    engine = ToyEngine()
    rounds = ConversationRounds(engine)
    engine.open()
    silence = np.zeros(UNIT_SAMPLES, np.float32)
    refused = rounds.refusal(0, UnitInput(silence, Decision(SPEAK, (11,))))
    engine.open_ids[0] = True
    failed = rounds.refusal(0, UnitInput(silence))
    assert refused is not None and failed is not None
    assert (refused.code, failed.code) == (serve_messages.BAD_INPUT, serve_messages.SESSION_FAILED)
