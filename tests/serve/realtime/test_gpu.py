"""On a CUDA device: MiniCPM-o 4.5's conversation engine (released sizes) behind /v1/realtime, two conversations
at once through the `openai` SDK's Realtime client, each conversation's audio equal to the same two conversations
stepped together in-process on the same engine (the server's rounds batch the two as the in-process steps do)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import numpy as np
import pytest

from duplexcadence.interpreter.serve.realtime import audio
from duplexcadence.interpreter.serve.realtime.loadgen import Script, unit_audio

pytestmark = pytest.mark.gpu
UNITS = 4
SCRIPT = Script(listen=1, speak=2)


def test_two_conversations_through_the_server_equal_the_engine_in_process(engine_installed):
    openai = pytest.importorskip("openai")
    from duplexcadence.interpreter.engine.api import UnitInput
    from duplexcadence.interpreter.serve.conversations import ConversationPool, ConversationPoolConfig, engine_factory
    from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
    from duplexcadence.interpreter.serve.server import ServerThread

    pool = ConversationPool(engine_factory("minicpmo45", "cuda", 2, {}), "minicpmo45", ConversationPoolConfig())
    seeds = (31, 32)
    heard: dict[int, list[np.ndarray]] = {seed: [] for seed in seeds}
    both_open = threading.Barrier(len(seeds))

    def converse(server: ServerThread, seed: int) -> None:
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="unused")
        with client.realtime.connect(model="minicpmo45", extra_query={"seed": seed}) as connection:
            session = connection.recv().session.duplexcadence
            both_open.wait(60)  # the units of both go to the same rounds (the gather waits for each open one)
            for number in range(UNITS):
                connection.send(SCRIPT.event(number))
                pcm = unit_audio(seed, number, session["unit_samples"])
                connection.input_audio_buffer.append(audio=base64.b64encode(pcm.tobytes()).decode())
            units = 0
            for event in connection:
                if event.type == "response.output_audio.delta":
                    heard[seed].append(audio.pcm16_samples(event.delta))
                units += event.type == "duplexcadence.unit"
                if units == UNITS:
                    return

    with ServerThread(make_conversation_app(pool)) as server:
        threads = [threading.Thread(target=converse, args=(server, seed)) for seed in seeds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        deadline = time.monotonic() + 60
        while pool.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        engine = pool.engine

        def in_process() -> dict[int, np.ndarray]:
            ids = {seed: engine.open(seed) for seed in seeds}
            made: dict[int, list[np.ndarray]] = {seed: [] for seed in seeds}
            for number in range(UNITS):
                step = {
                    ids[seed]: UnitInput(
                        unit_audio(seed, number, engine.unit_samples).astype(np.float32) / audio.PCM16_SCALE,
                        SCRIPT.choice(number),
                    )
                    for seed in seeds
                }
                outputs = engine.step(step)
                for seed in seeds:
                    made[seed].append(audio.to_pcm16(outputs[ids[seed]].audio))
            for key in ids.values():
                engine.close(key)
            return {seed: np.concatenate(parts) for seed, parts in made.items()}

        expected = asyncio.run(pool.run_on_device(in_process))
    for seed in seeds:
        assert len(expected[seed]) > 0
        assert np.array_equal(np.concatenate(heard[seed]), expected[seed])
