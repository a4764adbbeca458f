"""/v1/realtime through the unmodified `openai` SDK's Realtime client, against the tests' echo engine: a
conversation's events and audio, the events it refuses (each answered by an `error` event, the conversation
unchanged), resampling, barge-in, admission."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import websockets.sync.client
from echo_engine import reference

from duplexcadence.interpreter.engine.api import Decision
from duplexcadence.interpreter.serve.realtime import audio, messages

openai = pytest.importorskip("openai")

DOC = Path(__file__).resolve().parents[3] / "docs" / "serving.md"
SPEAK = {"type": "duplexcadence.decision", "kind": "speak", "text": [4, 5]}
END = {"type": "duplexcadence.decision", "kind": "speak", "text": [6], "end_of_turn": True}
LISTEN = {"type": "duplexcadence.decision", "kind": "listen"}


def pcm(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(rate * seconds)) * 2000).astype("<i2")


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.tobytes()).decode()


def connect(server, **query):
    client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused")
    return client.realtime.connect(model="echo", extra_query=query)


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


def test_a_conversation_through_the_openai_sdk_equals_the_engine_in_process(echo_server):
    sent = pcm(3.0, seed=1)
    with connect(echo_server, seed=7) as connection:
        created = connection.recv()
        assert created.type == "session.created"
        assert created.session.audio.input.format.rate == 16000
        assert created.session.audio.output.format.rate == 24000
        for decision in (LISTEN, SPEAK, END):
            connection.send(decision)
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
    decisions = [Decision("listen"), Decision("speak", (4, 5)), Decision("speak", (6,), True)]
    expected_audio, expected_text = reference(7, sent, decisions)
    assert np.array_equal(spoken(events), expected_audio)
    done = events[kinds.index("response.output_audio_transcript.done")]
    assert done.transcript == expected_text == " w4 w5 w6"
    final = events[kinds.index("response.done")].response
    assert final.status == "completed" and final.output[0].content[0].transcript == expected_text
    units = [event for event in events if event.type == "duplexcadence.unit"]
    assert [(u.unit, u.kind, u.audio_samples) for u in units] == [
        (0, "listen", 0),
        (1, "speak", 9600),
        (2, "speak", 9600),
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


def test_malformed_events_get_an_error_event_and_leave_the_conversation_unchanged(echo_server):
    sent = pcm(2.0, seed=2)
    with websockets.sync.client.connect(echo_server.ws_url("/v1/realtime?seed=4")) as socket:
        assert json.loads(socket.recv())["type"] == "session.created"
        socket.send(json.dumps(SPEAK))
        socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(sent[:10000])}))
        for number, (text, _, _) in enumerate(BAD_EVENTS):
            socket.send(
                text if not text.startswith("{") else json.dumps({**json.loads(text), "event_id": f"bad{number}"})
            )
        socket.send(b"\x00\x01")
        socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(sent[10000:])}))
        answers = []
        while not any(answer["type"] == "duplexcadence.unit" and answer["unit"] == 1 for answer in answers):
            answers.append(json.loads(socket.recv()))
    errors = [answer for answer in answers if answer["type"] == "error"]
    expected = [(code, param) for _, code, param in BAD_EVENTS] + [(messages.BINARY_FRAME, None)]
    assert [(error["error"]["code"], error["error"]["param"]) for error in errors] == expected
    assert all(error["error"]["type"] == messages.INVALID_REQUEST for error in errors)
    assert [error["error"]["event_id"] for error in errors[3:5]] == ["bad3", "bad4"]
    assert "'input_audio_buffer.appendd'" in errors[3]["error"]["message"]
    deltas = [audio.pcm16_samples(a["delta"]) for a in answers if a["type"] == "response.output_audio.delta"]
    expected_audio, _ = reference(4, sent, [Decision("speak", (4, 5))])
    assert np.array_equal(np.concatenate(deltas), expected_audio)
    assert [a["unit"] for a in answers if a["type"] == "duplexcadence.unit"] == [0, 1]


def test_audio_at_another_rate_is_resampled_the_same_however_it_is_cut(echo_server):
    sent = pcm(2.5, seed=3, rate=24000)
    made = []
    for cut in (2400, 7000):
        with connect(echo_server, seed=1) as connection:
            connection.recv()
            connection.session.update(
                session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}
            )
            assert connection.recv().session.audio.input.format.rate == 24000
            connection.send(SPEAK)
            connection.send(SPEAK)
            for start in range(0, len(sent), cut):
                connection.input_audio_buffer.append(audio=b64(sent[start : start + cut]))
            connection.input_audio_buffer.commit()
            events = events_until_units(connection, 3)
            assert "input_audio_buffer.committed" in [event.type for event in events]
            made.append(spoken(events))
    assert np.array_equal(made[0], made[1]) and len(made[0]) == 2 * 9600
    floats = sent.astype(np.float32) / audio.PCM16_SCALE
    resampled = audio.Resampler(24000, 16000)(floats, last=True)
    assert len(resampled) == 40000  # 2.5 s at 16 kHz: two units and a half, the half padded by the commit


def test_output_at_another_rate_and_text_only(echo_server):
    with connect(echo_server) as connection:
        connection.recv()
        connection.input_audio_buffer.commit()
        error = connection.recv()
        assert (error.type, error.error.code) == ("error", messages.COMMIT_EMPTY)
        connection.session.update(session={"audio": {"output": {"format": {"type": "audio/pcm", "rate": 48000}}}})
        connection.recv()
        connection.send(END)
        connection.input_audio_buffer.append(audio=b64(pcm(1.0)))
        events = events_until_units(connection, 1)
        assert len(spoken(events)) == 2 * 9600  # 0.4 s at 48 kHz
        connection.session.update(session={"output_modalities": ["text"]})
        connection.send(END)
        connection.input_audio_buffer.append(audio=b64(pcm(1.0)))
        events = events_until_units(connection, 1)
    kinds = [event.type for event in events]
    assert "response.output_audio.delta" not in kinds
    assert [event.delta for event in events if event.type == "response.output_text.delta"] == [" w6"]
    assert [event.text for event in events if event.type == "response.output_text.done"] == [" w6"]


def test_reset_cancels_the_response_and_starts_the_conversation_over(echo_server):
    sent = pcm(1.0, seed=5)
    with connect(echo_server, seed=2) as connection:
        connection.recv()
        connection.send(SPEAK)
        connection.input_audio_buffer.append(audio=b64(sent))
        first = spoken(events_until_units(connection, 1))
        connection.input_audio_buffer.append(audio=b64(sent[:4000]))  # a partial unit, dropped by the reset
        connection.send({"type": "duplexcadence.reset"})
        events = [connection.recv()]
        while events[-1].type != "duplexcadence.reset.done":
            events.append(connection.recv())
        connection.send(SPEAK)
        connection.input_audio_buffer.append(audio=b64(sent))
        again = events_until_units(connection, 1)
    assert [event.type for event in events][-2:] == ["response.done", "duplexcadence.reset.done"]
    assert events[-2].response.status == "cancelled"
    assert again[-1].unit == 0
    assert np.array_equal(spoken(again), first)  # the engine started over: the same first unit


def test_a_conversation_over_capacity_is_refused_with_the_numbers(echo_server):
    with connect(echo_server) as one, connect(echo_server) as two:
        assert one.recv().type == two.recv().type == "session.created"
        with websockets.sync.client.connect(echo_server.ws_url("/v1/realtime")) as third:
            refusal = json.loads(third.recv())
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                third.recv()
    assert refusal["error"]["type"] == messages.ADMISSION and refusal["error"]["code"] == "at-capacity"
    assert refusal["error"]["message"] == "at capacity: 2 of 2 conversations"
    assert refusal["error"]["duplexcadence"] == {"conversations": 2}
    assert closed.value.rcvd.code == 1013


def test_another_model_or_a_bad_seed_is_refused(echo_server):
    for query, code, text in (
        ("model=gpt-realtime", messages.MODEL_NOT_SERVED, "this server serves 'echo', not 'gpt-realtime'"),
        ("seed=x", messages.BAD_SEED, "the seed must be a whole number, not 'x'"),
    ):
        with websockets.sync.client.connect(echo_server.ws_url(f"/v1/realtime?{query}")) as socket:
            error = json.loads(socket.recv())["error"]
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                socket.recv()
        assert error["code"] == code and error["message"].startswith(text)
        assert closed.value.rcvd.code == 1008


def test_every_error_code_has_its_row_in_the_docs():
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


def test_the_docs_python_client_holds_a_conversation(echo_server, capsys):
    (block,) = re.findall(r"```py\n(.*?)```", DOC.read_text(), flags=re.S)
    block = block.replace("http://127.0.0.1:8000/v1", echo_server.url("/v1")).replace('"minicpmo45"', '"echo"')
    exec(compile(block, "docs/serving.md:py", "exec"), {"__name__": "serving_doc"})
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in printed[:3]] == ["unit 0: listen", "unit 1: speak", "unit 2: speak"]
    assert printed[3] == "19200 samples of speech: ' w11 w12 w11 w12'"
