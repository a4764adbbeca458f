"""`dsl loadgen --conversations` against a conversation server of an engine that needs no model: units the
engine refuses settle the run, the API key is sent, a refused handshake is an error in the report, and the
command's output format and the tail options it refuses."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from duplexcadence.interpreter.cli import main as cli
from duplexcadence.interpreter.engine.api import LISTEN, SPEAK, ConversationError, EngineCapacity, UnitOutput
from duplexcadence.interpreter.serve.access import API_KEY_ENV, AccessPolicy
from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig
from duplexcadence.interpreter.serve.realtime import messages
from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
from duplexcadence.interpreter.serve.realtime.loadgen import Script, run_conversations
from duplexcadence.interpreter.serve.server import ServerThread

KEY = "loadgen-key"


class ListeningEngine:
    """Conversations that listen; a speaking decision is refused before it runs."""

    input_rate, output_rate, unit_samples = 16000, 24000, 1600

    def __init__(self) -> None:
        self.opened = 0

    def open(self, seed: int = 0) -> int:
        self.opened += 1
        return self.opened

    def check(self, units) -> None:
        for conversation, unit in units.items():
            if unit.decision is not None and unit.decision.kind == SPEAK:
                raise ConversationError(f"conversation {conversation}: speaking is not taken here")

    def step(self, units):
        self.check(units)
        return {c: UnitOutput(c, 0, LISTEN, (), "", (), np.zeros(0, np.float32), False) for c in units}

    def reset(self, conversation: int) -> None:
        pass

    def close(self, conversation: int) -> None:
        pass

    def capacity(self) -> EngineCapacity:
        return EngineCapacity(4, 0, 4, 4, 0, None, 100.0)


@pytest.fixture
def server():
    config = ConversationPoolConfig(pace=None, latency_guard=False, idle_timeout_s=60, freeze_gc=False)
    pool = ConversationPool(ListeningEngine, "listening", config)
    with ServerThread(make_conversation_app(pool, access=AccessPolicy(api_keys=(KEY,)))) as running:
        yield running


def test_units_the_engine_refuses_settle_the_conversation_with_their_errors(server, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    script = Script(listen=1, speak=2)  # units 1, 2, 4, 5 speak: refused
    report = asyncio.run(asyncio.wait_for(run_conversations(server.ws_url("/v1/realtime"), 1, 6, script, False), 30))
    summary = report.to_json()
    assert (summary["opened"], summary["units_answered"], len(summary["errors"])) == (1, 2, 4)
    assert summary["errors"][0] == (
        f"{messages.UNIT_REFUSED}: " + messages.unit_refused(1, "conversation 1: speaking is not taken here")
    )


def test_without_the_key_each_conversation_has_the_refused_handshake_in_its_errors(server, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    report = asyncio.run(asyncio.wait_for(run_conversations(server.ws_url("/v1/realtime"), 2, 1), 30))
    assert report.to_json()["errors"] == ["connection: the server refused the websocket: HTTP 401"] * 2
    assert report.lines()[1].endswith("errors: 2")


def test_the_key_is_given_by_the_variable(server, monkeypatch, capsys):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    argv = ["loadgen", server.url(), "--conversations", "2", "--units", "2", "--speak-units", "0", "--no-pace"]
    assert cli.main([*argv, "--output-format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["opened"], printed["units_answered"], printed["errors"]) == (2, 4, [])


def test_the_tail_options_are_refused_with_conversations(capsys):
    argv = ["loadgen", "ws://127.0.0.1:9", "--conversations", "2", "--sessions", "3", "--verify"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "dsl loadgen: error: --sessions does not apply to --conversations; --verify does not apply to "
        "--conversations (conversations take --units, --listen-units, --speak-units, --own-turns, --seed, "
        "--no-pace, --output-format and --json)\n"
    )
