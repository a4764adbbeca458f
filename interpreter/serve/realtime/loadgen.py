"""N scripted conversations against a conversation server (`/v1/realtime`), over loopback or a network.

    report = await run_conversations("ws://127.0.0.1:8000/v1/realtime", conversations=8, units=20)
    print("\\n".join(report.lines()))

Every conversation opens together, reads the unit and rates from its `session.created`, and sends its own
seeded audio (PCM16 at the engine's input rate) in 100 ms appends; paced, at the cadence (one unit of audio a
unit's time, as a microphone would), else each unit as soon as the one before it was answered. Each unit is
scripted (`duplexcadence.decision`, `script`: listen, then speak for `turn` units, the last ending the turn), so
a model with random weights speaks too. A unit's latency runs from the send of its last append to its
`duplexcadence.unit` event, end to end; over the cadence it is late.

An error that answers a unit instead of its `duplexcadence.unit` (`unit_failed`, `unit_refused`, `queue_full`)
settles it and is counted in the errors; a conversation ends once all its units are settled or the server closes
it. With `DUPLEXCADENCE_API_KEY` set, each websocket sends `Authorization: Bearer KEY`. A conversation that
cannot connect, is refused at the handshake or loses its connection has that in its errors, so the report is
always made.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import time
from typing import Any

import attrs
import numpy as np
import websockets
import websockets.exceptions

from duplexcadence.interpreter.engine.api import LISTEN, SPEAK, Decision
from duplexcadence.interpreter.serve.access import API_KEY_ENV
from duplexcadence.interpreter.serve.realtime import audio, messages

SETTLING_CODES = (messages.UNIT_FAILED, messages.UNIT_REFUSED, messages.QUEUE_FULL)
"""The error codes that answer a unit (or the audio of one) instead of its `duplexcadence.unit`."""

CHUNK_S = 0.1


@attrs.frozen
class Script:
    """Each conversation's decisions, unit by unit: `listen` units, then `speak` units of `tokens` (the last
    ending the turn), over and over (no `speak`: it listens throughout); `own`: the model decides every unit."""

    listen: int = 1
    speak: int = 2
    tokens: tuple[int, ...] = (11, 12, 13)
    own: bool = False

    def choice(self, unit: int) -> Decision | None:
        """The decision of the conversation's unit `unit` (None: the model's own)."""
        if self.own:
            return None
        step = unit % max(1, self.listen + self.speak)
        if step < self.listen or not self.speak:
            return Decision(LISTEN)
        return Decision(SPEAK, self.tokens, end_of_turn=step == self.listen + self.speak - 1)

    def event(self, unit: int) -> dict[str, Any] | None:
        """The `duplexcadence.decision` event of unit `unit` (None: none sent)."""
        decision = self.choice(unit)
        if decision is None:
            return None
        fields = {"kind": decision.kind, "text": list(decision.text), "end_of_turn": decision.end_of_turn}
        return {"type": "duplexcadence.decision", **fields}


@attrs.define
class ConversationRun:
    seed: int
    refused: str | None = None
    latencies: list[float] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    audio: list[np.ndarray] = attrs.field(factory=list)
    units: int = 0
    spoken_units: int = 0
    cadence_s: float | None = None


@attrs.frozen
class ConversationLoadReport:
    conversations: int
    units: int
    paced: bool
    cadence_s: float | None
    """The server's (None when no conversation opened)."""
    runs: tuple[ConversationRun, ...]
    seconds: float

    @property
    def latencies(self) -> list[float]:
        return sorted(latency for run in self.runs for latency in run.latencies)

    def quantile(self, q: float) -> float | None:
        ordered = self.latencies
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, max(0, math.ceil(round(q * len(ordered), 9)) - 1))]

    @property
    def late(self) -> int:
        cadence = self.cadence_s
        return 0 if cadence is None else sum(latency > cadence for latency in self.latencies)

    @property
    def refused(self) -> int:
        return sum(run.refused is not None for run in self.runs)

    @property
    def errors(self) -> int:
        return sum(len(run.errors) for run in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "opened": self.conversations - self.refused,
            "refused": self.refused,
            "refusals": [run.refused for run in self.runs if run.refused is not None],
            "units_per_conversation": self.units,
            "units_answered": len(self.latencies),
            "units_spoken": sum(run.spoken_units for run in self.runs),
            "paced": self.paced,
            "cadence_s": self.cadence_s,
            "unit_latency_p50_s": self.quantile(0.5),
            "unit_latency_p99_s": self.quantile(0.99),
            "unit_latency_max_s": self.latencies[-1] if self.latencies else None,
            "units_over_cadence": self.late,
            "errors": [error for run in self.runs for error in run.errors],
            "seconds": self.seconds,
        }

    def lines(self) -> list[str]:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.1f} ms"

        refusals = sorted({run.refused for run in self.runs if run.refused is not None})
        return [
            f"conversations: {self.conversations - self.refused} of {self.conversations} opened; refused: "
            + ("; ".join(refusals) if refusals else "none"),
            f"units: {len(self.latencies)} answered ({self.units} per conversation, "
            f"{'paced at the cadence' if self.paced else 'unpaced'}) in {self.seconds:.1f} s; errors: {self.errors}",
            f"unit latency end to end: p50 {ms(self.quantile(0.5))}, p99 {ms(self.quantile(0.99))}, max "
            f"{ms(self.latencies[-1] if self.latencies else None)}; over the {ms(self.cadence_s)} cadence: {self.late}",
        ]


def unit_audio(seed: int, unit: int, samples: int) -> np.ndarray:
    """A conversation's unit of input audio, PCM16 (seeded noise at a speaking level)."""
    return (np.random.default_rng([seed, unit]).standard_normal(samples) * 3000).astype("<i2")


async def converse(
    url: str, seed: int, units: int, script: Script, paced: bool, record: bool, api_key: str | None = None
) -> ConversationRun:
    """One conversation; a connection that fails, is refused at the handshake or is lost goes into its errors."""
    run = ConversationRun(seed)
    try:
        await talk(run, url, units, script, paced, record, api_key)
    except websockets.exceptions.InvalidStatus as error:
        run.errors.append(f"connection: the server refused the websocket: HTTP {error.response.status_code}")
    except (websockets.exceptions.WebSocketException, OSError) as error:
        run.errors.append(f"connection: {type(error).__name__}: {error}")
    return run


async def talk(
    run: ConversationRun, url: str, units: int, script: Script, paced: bool, record: bool, api_key: str | None
) -> None:
    seed = run.seed
    key = api_key or os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    address = f"{url}{'&' if '?' in url else '?'}seed={seed}"
    async with websockets.connect(address, max_size=None, additional_headers=headers) as socket:
        first = json.loads(await socket.recv())
        if first["type"] == "error":
            run.refused = f"{first['error']['code']}: {first['error']['message']}"
            return
        session = first["session"]["duplexcadence"]
        unit_samples, rate = session["unit_samples"], session["input_rate"]
        cadence = run.cadence_s = unit_samples / rate
        chunk = int(CHUNK_S * rate)
        sent_at: dict[int, float] = {}
        settled = 0
        progress = asyncio.Event()

        async def receive() -> None:
            nonlocal settled
            try:
                async for message in socket:
                    event = json.loads(message)
                    if event["type"] == "duplexcadence.unit":
                        number = event["unit"]
                        if number in sent_at:
                            run.latencies.append(time.perf_counter() - sent_at[number])
                        run.units += 1
                        run.spoken_units += event["kind"] == "speak"
                        settled += 1
                    elif event["type"] == "error":
                        run.errors.append(f"{event['error']['code']}: {event['error']['message']}")
                        settled += event["error"]["code"] in SETTLING_CODES
                    elif record and event["type"] == "response.output_audio.delta":
                        run.audio.append(audio.pcm16_samples(event["delta"]))
                    progress.set()
                    if settled >= units:
                        return
            finally:
                progress.set()

        async def answered(count: int) -> None:
            """Until `count` units are settled or the server stopped answering."""
            while settled < count and not receiver.done():
                progress.clear()
                await progress.wait()

        receiver = asyncio.create_task(receive())
        try:
            start = time.perf_counter()
            for number in range(units):
                decision = script.event(number)
                if decision is not None:
                    await socket.send(json.dumps(decision))
                samples = unit_audio(seed, number, unit_samples)
                for offset in range(0, unit_samples, chunk):
                    if paced:
                        delay = start + number * cadence + (offset + chunk) / rate - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    piece = samples[offset : offset + chunk].tobytes()
                    await socket.send(
                        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
                    )
                sent_at[number] = time.perf_counter()
                if not paced:
                    await answered(number + 1)
                if receiver.done():
                    break
        except BaseException:
            receiver.cancel()  # the connection's error is the sender's to report
            raise
        await receiver
        if settled < units:
            run.errors.append(f"the server closed the conversation with {units - settled} of {units} units unsettled")


async def run_conversations(
    url: str,
    conversations: int,
    units: int,
    script: Script | None = None,
    paced: bool = True,
    first_seed: int = 0,
    record: bool = False,
    api_key: str | None = None,
) -> ConversationLoadReport:
    """`conversations` conversations of `units` units each, together (see the module docstring); `record` keeps
    each conversation's audio (PCM16) in its run; `api_key`: the server's (None: `DUPLEXCADENCE_API_KEY`'s, if
    set)."""
    script = script or Script()
    start = time.perf_counter()
    runs = await asyncio.gather(
        *(converse(url, first_seed + index, units, script, paced, record, api_key) for index in range(conversations))
    )
    cadence = next((run.cadence_s for run in runs if run.cadence_s is not None), None)
    return ConversationLoadReport(conversations, units, paced, cadence, tuple(runs), time.perf_counter() - start)
