"""The tests' echo engine (echo_engine.py) and a server of it on a thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # echo_engine, by name, as the replicas and `dsl serve` import it
import echo_engine


@pytest.fixture
def echo_server(request):
    """The echo engine (2 conversations) behind the conversation server on a free port."""
    from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig
    from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
    from duplexcadence.interpreter.serve.server import ServerThread

    engine = echo_engine.EchoEngine(2)
    pool = ConversationPool(lambda: engine, "echo", ConversationPoolConfig(gather_s=0))
    with ServerThread(make_conversation_app(pool)) as running:
        running.engine = engine
        yield running
