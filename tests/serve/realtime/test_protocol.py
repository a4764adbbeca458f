"""/v1/realtime through the unmodified `openai` SDK's Realtime client (pinned in the test extra), against
MiniCPM-o 4.5's conversation engine at the reduced sizes on the CPU: a conversation of several units whose audio
and text equal what the engine makes of it in-process; the events it refuses, each answered by an `error` event
with the conversation unchanged; audio at other rates; barge-in; text only; admission."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import websockets.sync.client

from duplexcadence.interpreter.engine.api import Decision
from duplexcadence.interpreter.serve.realtime import audio, messages

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[3] / "docs" / "serving.md"
LISTEN, SPEAK, END = Decision("listen"), Decision("speak", (11, 12)), Decision("speak", (11, 12), True)


def event_of(decision: Decision) -> dict:
    fields = {"kind": decision.kind, "text": list(decision.text), "end_of_turn": decision.end_of_turn}
    return {"type": "duplexcadence.decision", **fields}


def pcm(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(rate * seconds)) * 2000).astype("<i2")


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.tobytes()).decode()


def connect(server, **query):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key=server.key)
    return client.realtime.connect(model="minicpmo45", extra_query=query)


def events_until_units(connection, units: int) -> list:
    found, seen = [], 0
    for event in connection:
        found.append(event)
        seen += event.type == "duplexcadence.unit"
        if seen == units:
            return found
    raise AssertionError("the connection closed first")


def spoken(events) -> np.ndarray:
    deltas = [audio.pcm16_samples(event.delta) for event in events if event.type == "response.output_audio.delta"]
    return np.concatenate(deltas) if deltas else np.zeros(0, "<i2")


def test_a_conversation_through_the_openai_sdk_equals_the_engine_in_process(engine_server):
    engine_server.idle()
    sent, script = pcm(3.0, seed=1), (LISTEN, SPEAK, END)
    with connect(engine_server, seed=7) as connection:
        created = connection.recv()
        assert created.type == "session.created"
        assert (created.session.audio.input.format.rate, created.session.audio.output.format.rate) == (16000, 24000)
        for decision in script:
            connection.send(event_of(decision))
        for start in range(0, len(sent), 3200):  # 200 ms appends
            connection.input_audio_buffer.append(audio=b64(sent[start : start + 3200]))
        events = events_until_units(connection, 3)
    kinds = [event.type for event in events]
    assert kinds == [
        "duplexcadence.unit",
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "duplexcadence.unit",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
        "duplexcadence.unit",
    ]
    expected = engine_server.reference(7, sent, script)
    assert np.array_equal(spoken(events), engine_server.spoken(expected))
    text = "".join(output.text for output in expected)
    assert text.startswith("<11><12><11><12>")
    assert events[kinds.index("response.output_audio_transcript.done")].transcript == text
    final = events[kinds.index("response.done")].response
    assert final.status == "completed" and final.output[0].content[0].transcript == text
    units = [event for event in events if event.type == "duplexcadence.unit"]
    assert [(u.unit, u.kind, u.audio_samples) for u in units] == [
        (n, o.kind, len(o.audio)) for n, o in enumerate(expected)
    ]
    assert units[1].response_id == final.id and units[0].response_id is None


BAD_EVENTS = [
    ("not json", messages.INVALID_JSON, None),
    ("[1, 2]", messages.INVALID_JSON, None),
    ('{"type": 3}', messages.INVALID_JSON, "type"),
    ('{"type": "input_audio_buffer.appendd"}', messages.UNKNOWN_EVENT, "type"),
    ('{"type": "response.create"}', messages.UNSUPPORTED_EVENT, "type"),
    ('{"type": "input_audio_buffer.append", "audio": "not base64!"}', messages.INVALID_AUDIO, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "AAAA"}', messages.INVALID_AUDIO, "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 12}', messages.INVALID_AUDIO, "audio"),
    ('{"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 7}}}}}',
     messages.INVALID_VALUE, "session.audio.input.format.rate"),
    ('{"type": "session.update", "session": {"audio": {"output": {"format": {"type": "audio/pcmu"}}}}}',
     messages.INVALID_VALUE, "session.audio.output.format.type"),
    ('{"type": "session.update", "session": {"output_modalities": ["video"]}}',
     messages.INVALID_VALUE, "session.output_modalities"),
    ('{"type": "duplexcadence.decision", "kind": "shout"}', messages.INVALID_VALUE, "kind"),
    ('{"type": "duplexcadence.decision", "kind": "listen", "text": [1]}', messages.INVALID_VALUE, "text"),
    ('{"type": "duplexcadence.decision", "kind": "speak", "text": [-1]}', messages.INVALID_VALUE, "text"),
]  # fmt: skip


def test_malformed_events_get_an_error_event_and_leave_the_conversation_unchanged(engine_server):
    engine_server.idle()
    sent = pcm(1.0, seed=2)
    with engine_server.connect("/v1/realtime?seed=4") as socket:
        assert json.loads(socket.recv())["type"] == "session.created"
        socket.send(json.dumps(event_of(END)))
        socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(sent[:10000])}))
        for number, (text, _, _) in enumerate(BAD_EVENTS):
            socket.send(
                text if not text.startswith("{") else json.dumps({**json.loads(text), "event_id": f"bad{number}"})
            )
        socket.send(b"\x00\x01")
        socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(sent[10000:])}))
        answers = []
        while not answers or answers[-1]["type"] != "duplexcadence.unit":
            answers.append(json.loads(socket.recv()))
    errors = [answer for answer in answers if answer["type"] == "error"]
    expected = [(code, param) for _, code, param in BAD_EVENTS] + [(messages.BINARY_FRAME, None)]
    assert [(error["error"]["code"], error["error"]["param"]) for error in errors] == expected
    assert all(error["error"]["type"] == messages.INVALID_REQUEST for error in errors)
    assert [error["error"]["event_id"] for error in errors[3:5]] == ["bad3", "bad4"]
    assert errors[3]["error"]["message"].startswith("unknown event type 'input_audio_buffer.appendd'; the events")
    deltas = [audio.pcm16_samples(a["delta"]) for a in answers if a["type"] == "response.output_audio.delta"]
    assert np.array_equal(np.concatenate(deltas), engine_server.spoken(engine_server.reference(4, sent, (END,))))
    assert answers[-1]["unit"] == 0 and answers[-1]["kind"] == "speak"


def test_audio_at_another_rate_is_resampled_into_whole_units_and_committed(engine_server):
    engine_server.idle()
    with connect(engine_server, seed=1) as connection:
        connection.recv()
        at_24k = {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}
        connection.session.update(session={"type": "realtime", "audio": at_24k})
        assert connection.recv().session.audio.input.format.rate == 24000
        for _ in range(3):
            connection.send(event_of(LISTEN))
        sent = pcm(2.5, seed=3, rate=24000)
        for start in range(0, len(sent), 2400):
            connection.input_audio_buffer.append(audio=b64(sent[start : start + 2400]))
        connection.input_audio_buffer.commit()
        events = events_until_units(connection, 3)
    kinds = [event.type for event in events]
    assert kinds.count("duplexcadence.unit") == 3 and "input_audio_buffer.committed" in kinds
    assert kinds.index("input_audio_buffer.committed") > kinds.index("duplexcadence.unit")  # after unit 0, 1 s in


def test_the_resampler_gives_the_same_samples_however_the_stream_is_cut():
    sent = np.random.default_rng(5).standard_normal(24000 * 2).astype(np.float32)
    made = []
    for cut in (480, 2400, 7001):
        resampler = audio.Resampler(24000, 16000)
        pieces = [resampler(sent[start : start + cut]) for start in range(0, len(sent), cut)]
        made.append(np.concatenate([*pieces, resampler(np.zeros(0, np.float32), last=True)]))
    assert all(np.array_equal(made[0], other) for other in made[1:]) and len(made[0]) == 32000


def test_reset_starts_the_conversation_over_and_another_output_rate_and_text_only(engine_server):
    engine_server.idle()
    sent = pcm(1.0, seed=5)
    with connect(engine_server, seed=2) as connection:
        connection.recv()
        connection.send(event_of(END))
        connection.input_audio_buffer.append(audio=b64(sent))
        first = events_until_units(connection, 1)
        connection.input_audio_buffer.append(audio=b64(sent[:4000]))  # a partial unit, dropped by the reset
        connection.send({"type": "duplexcadence.reset"})
        assert connection.recv().type == "duplexcadence.reset.done"
        connection.session.update(session={"audio": {"output": {"format": {"type": "audio/pcm", "rate": 48000}}}})
        connection.recv()
        connection.send(event_of(END))
        connection.input_audio_buffer.append(audio=b64(sent))
        again = events_until_units(connection, 1)
        connection.session.update(session={"output_modalities": ["text"]})
        connection.recv()
        connection.send(event_of(END))
        connection.input_audio_buffer.append(audio=b64(sent))
        text_only = events_until_units(connection, 1)
    (expected,) = engine_server.reference(2, sent, (END,))
    assert np.array_equal(spoken(first), audio.to_pcm16(expected.audio))
    assert again[-1].unit == 0  # the units count from 0 again
    at_48k = audio.Resampler(24000, 48000)
    assert np.array_equal(
        spoken(again),
        audio.to_pcm16(np.concatenate([at_48k(expected.audio), at_48k(np.zeros(0, np.float32), last=True)])),
    )
    kinds = [event.type for event in text_only]
    assert "response.output_audio.delta" not in kinds and "response.output_text.done" in kinds
    assert "".join(e.delta for e in text_only if e.type == "response.output_text.delta") == text_only[-1].text


def test_a_conversation_over_capacity_is_refused_with_the_numbers(engine_server):
    engine_server.idle()
    with connect(engine_server) as one, connect(engine_server) as two:
        assert one.recv().type == two.recv().type == "session.created"
        with engine_server.connect() as third:
            refusal = json.loads(third.recv())
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                third.recv()
    assert refusal["error"]["type"] == messages.ADMISSION and refusal["error"]["code"] == "at-capacity"
    assert refusal["error"]["message"] == (
        "at capacity: 2 of 2 conversations, predicted tick 0.0 ms of 1000 ms (headroom 15%); all 2 conversation "
        "slots are taken"
    )
    numbers = {"sessions": 2, "capacity": 2, "slots": 2, "predicted_tick_s": 0.0, "tick_period_s": 1.0}
    assert refusal["error"]["duplexcadence"] == {**numbers, "headroom": 0.15}
    assert closed.value.rcvd.code == 1013


def test_the_api_key_and_the_origin_are_checked_before_a_conversation_opens(engine_server):
    with pytest.raises(websockets.exceptions.InvalidStatus) as no_key:
        websockets.sync.client.connect(engine_server.ws_url())
    with pytest.raises(websockets.exceptions.InvalidStatus) as cross_site:
        engine_server.connect(origin="http://elsewhere.example")
    assert (no_key.value.response.status_code, cross_site.value.response.status_code) == (401, 403)
    protocol = f"openai-insecure-api-key.{engine_server.key}"  # a browser's way to send it
    with websockets.sync.client.connect(engine_server.ws_url(), subprotocols=[protocol]) as socket:
        assert json.loads(socket.recv())["type"] == "session.created"
    engine_server.idle()


def test_another_model_or_a_bad_seed_is_refused(engine_server):
    for query, code, text in (
        ("model=gpt-realtime", messages.MODEL_NOT_SERVED, "this server serves 'minicpmo45', not 'gpt-realtime'"),
        ("seed=x", messages.BAD_SEED, "the seed must be a whole number, not 'x'"),
    ):
        with engine_server.connect(f"/v1/realtime?{query}") as socket:
            error = json.loads(socket.recv())["error"]
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                socket.recv()
        assert error["code"] == code and error["message"].startswith(text)
        assert closed.value.rcvd.code == 1008


def test_the_docs_python_client_holds_a_conversation(engine_server, capsys):
    engine_server.idle()
    (block,) = re.findall(r"```py\n(.*?)```", DOC.read_text(), flags=re.S)
    block = block.replace("http://127.0.0.1:8000/v1", engine_server.url("/v1")).replace(
        '"unused"', repr(engine_server.key)
    )
    exec(compile(block, "docs/serving.md:py", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    expected = engine_server.reference(3, np.zeros(48000, "<i2"), (LISTEN, SPEAK, END))
    assert [line.split(",")[0] for line in printed[:3]] == [f"unit {n}: {o.kind}" for n, o in enumerate(expected)]
    text = "".join(output.text for output in expected)
    assert printed[3] == f"{len(engine_server.spoken(expected))} samples of speech: {text!r}"


def test_every_error_code_and_event_has_its_row_in_the_docs():
    text = DOC.read_text()
    section = text[text.index("## Conversations") :]
    for code in messages.ERROR_CODES:
        assert f"| `{code}` |" in section, code
    for kind in messages.UNSUPPORTED:
        assert f"`{kind}`" in section, kind
    for name in re.findall(
        r'"(duplexcadence\.[a-z._]+)"', (Path(audio.__file__).parent / "conversation.py").read_text()
    ):
        assert f"`{name}`" in section, name


def test_a_unit_the_engine_fails_is_an_error_event_and_a_reset_recovers(engine_server, monkeypatch):
    engine_server.idle()
    model = engine_server.pool.engine.model
    run_units = model.run_units
    calls = []

    def fails_once(slots, inputs):
        calls.append(len(inputs))
        if len(calls) == 1:
            raise RuntimeError("the device fell over")
        return run_units(slots, inputs)

    monkeypatch.setattr(model, "run_units", fails_once)
    unit = pcm(1.0, seed=6)
    with connect(engine_server, seed=9) as connection:
        connection.recv()
        connection.send(event_of(LISTEN))
        connection.input_audio_buffer.append(audio=b64(unit))
        failed = connection.recv()
        connection.send(event_of(LISTEN))
        connection.input_audio_buffer.append(audio=b64(unit))
        refused = connection.recv()
        connection.send({"type": "duplexcadence.reset"})
        assert connection.recv().type == "duplexcadence.reset.done"
        connection.send(event_of(LISTEN))
        connection.input_audio_buffer.append(audio=b64(unit))
        recovered = events_until_units(connection, 1)
    assert (failed.type, failed.error.type, failed.error.code) == ("error", "server_error", messages.UNIT_FAILED)
    assert failed.error.message.startswith("unit 0 failed in the engine: RuntimeError: the device fell over;")
    assert refused.error.code == messages.UNIT_FAILED and "reset it to go on" in refused.error.message
    assert (recovered[-1].unit, recovered[-1].kind) == (0, "listen") and calls == [1, 1]
