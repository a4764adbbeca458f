"""MiniCPM-o 4.5's conversation engine at the reduced sizes on the CPU (2 conversations, 2 ODE steps), behind the
conversation server on a thread, shared by the session's tests; and what the engine makes of a conversation
in-process, on the same engine, for the tests to compare the server's answers with."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import numpy as np
import pytest

from duplexcadence.interpreter.engine.api import Decision, UnitInput, UnitOutput
from duplexcadence.interpreter.serve.realtime import audio

ENGINE_OPTIONS = {"sizes": "reduced", "n_timesteps": "2"}
"""`--param` options of the tests' engine (as `dsl serve` takes them)."""
API_KEY = "realtime-test-key"
"""The server asks for it on every route but /healthz and the page (`dsl serve --api-key ... --open-route /`)."""


def needs_engine() -> None:
    pytest.importorskip("transformers")
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo (scripts/model-pins.txt)")


class EngineServer:
    """The server (`ServerThread`) of the engine, and its pool."""

    key = API_KEY

    def __init__(self, running, pool):
        self.running = running
        self.pool = pool
        self.references: dict[tuple, list[UnitOutput]] = {}

    def url(self, path: str = "") -> str:
        return self.running.url(path)

    def ws_url(self, path: str = "/v1/realtime") -> str:
        return self.running.ws_url(path)

    def connect(self, path: str = "/v1/realtime", **options):
        """A websocket (websockets' sync client) to `path`, with the key."""
        import websockets.sync.client

        headers = {"Authorization": f"Bearer {API_KEY}"}
        return websockets.sync.client.connect(self.ws_url(path), additional_headers=headers, **options)

    def idle(self, timeout: float = 60.0) -> None:
        """Wait until every conversation of the server has closed."""
        deadline = time.monotonic() + timeout
        while self.pool.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.pool.sessions, "a conversation of an earlier test is still open"

    def reference(self, seed: int, pcm16: np.ndarray, decisions: tuple) -> list[UnitOutput]:
        """What the engine makes in-process of a conversation of `seed` fed PCM16 `pcm16` unit by unit with
        `decisions`: a conversation opened on the same engine, on its device thread, while the server holds
        none (remembered for the session)."""
        key = (seed, pcm16.tobytes(), decisions)
        if key not in self.references:
            self.idle()
            engine = self.pool.engine
            floats = pcm16.astype(np.float32) / audio.PCM16_SCALE
            size = engine.unit_samples

            def run() -> list[UnitOutput]:
                conversation = engine.open(seed)
                try:
                    return [
                        engine.step({conversation: UnitInput(floats[n * size : (n + 1) * size], decision)})[
                            conversation
                        ]
                        for n, decision in enumerate(decisions)
                    ]
                finally:
                    engine.close(conversation)

            self.references[key] = asyncio.run(self.pool.run_on_device(run))
        return self.references[key]

    @staticmethod
    def spoken(outputs: list[UnitOutput]) -> np.ndarray:
        """The audio of `outputs` as a client receives it (PCM16)."""
        return np.concatenate([audio.to_pcm16(output.audio) for output in outputs])


@pytest.fixture
def engine_installed() -> None:
    """Skips where MiniCPM-o 4.5's model packages are not installed."""
    needs_engine()


@pytest.fixture(scope="session")
def engine_server():
    needs_engine()
    from duplexcadence.interpreter.serve.access import AccessPolicy
    from duplexcadence.interpreter.serve.conversations import (
        ConversationPool,
        ConversationPoolConfig,
        engine_factory,
    )
    from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
    from duplexcadence.interpreter.serve.server import ServerThread

    build = engine_factory("minicpmo45", "cpu", 2, ENGINE_OPTIONS)
    pool = ConversationPool(build, "minicpmo45", ConversationPoolConfig(gather_s=0, idle_timeout_s=300))
    access = AccessPolicy(api_keys=(API_KEY,), open_routes=("/healthz", "/"))
    with ServerThread(make_conversation_app(pool, access=access)) as running:
        yield EngineServer(running, pool)


@pytest.fixture
def decisions():
    """Decision records by name: LISTEN, SPEAK (11, 12), END (13 and the end of the turn)."""
    return {"LISTEN": Decision("listen"), "SPEAK": Decision("speak", (11, 12)), "END": Decision("speak", (13,), True)}
