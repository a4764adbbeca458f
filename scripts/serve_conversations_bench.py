"""Conversations per GPU through the server, beside the engine's own in-process figure.

One engine is built (`--engine`: a registered conversation engine, or MODULE:FUNCTION; `--param K=V` its
keywords) with room for the largest count, and for each conversation count N, growing until one fails:

* in-process: N conversations opened on the engine and stepped together, one `engine.step` over all N a unit,
  each unit scripted as `dsl loadgen --conversations` scripts it (listen, speak, speak and end the turn) on the
  same seeded audio, paced at the cadence: a unit's latency is its round's wall time (the audio is all there
  when the round starts);
* server: the same engine behind `/v1/realtime` (the conversation pool and its websocket front, uvicorn on a
  thread of this process), N conversations from `run_conversations` over loopback, paced at the cadence: a
  unit's latency runs from the send of its last 100 ms append to its `duplexcadence.unit` event, end to end.

Each conversation's audio through the server is compared with its audio in-process (`audio_equal_conversations`):
equal where the server's rounds group the units as the in-process steps do (its gather and pace usually do),
counted rather than required, since a row's arithmetic may depend on the rows stepped beside it.

N passes when every conversation opened, no error came back and the p99 unit latency is under the cadence. The
conversations per GPU are the largest N that passes, in-process and through the server; the server's overhead
at N is its p50 less the in-process p50, also as a fraction of the cadence.

    python scripts/serve_conversations_bench.py --engine minicpmo45 --counts 1,2,4,6,8 --units 20 --json conv.json
    python scripts/serve_conversations_bench.py --cpu-dry-run --json /tmp/conv.json      # a smoke test, times mean nothing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import sys
import time
from typing import Any

import numpy as np

from duplexcadence.interpreter.engine.api import UnitInput
from duplexcadence.interpreter.serve.conversations import (
    ConversationPool,
    ConversationPoolConfig,
    engine_factory,
    engine_name,
)
from duplexcadence.interpreter.serve.realtime.app import make_conversation_app
from duplexcadence.interpreter.serve.realtime.audio import PCM16_SCALE, to_pcm16
from duplexcadence.interpreter.serve.realtime.loadgen import Script, run_conversations, unit_audio
from duplexcadence.interpreter.serve.server import ServerThread


def quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(round(q * len(ordered), 9)) - 1))]


def in_process(engine: Any, count: int, units: int, script: Script, first_seed: int) -> dict[str, Any]:
    """`count` conversations stepped together on `engine` (on the pool's device thread, the server idle), paced at
    the cadence; each unit's latency is its round's time. The audio each conversation spoke, as PCM16."""
    opened, refused = [], None
    for index in range(count):
        try:
            opened.append((engine.open(first_seed + index), first_seed + index))
        except Exception as error:  # the engine's refusal, with its numbers
            refused = str(error)
            break
    cadence = engine.unit_samples / engine.input_rate
    latencies: list[float] = []
    spoken: dict[int, list[np.ndarray]] = {seed: [] for _, seed in opened}
    try:
        if refused is None:
            start = time.perf_counter()
            for number in range(units):
                delay = start + (number + 1) * cadence - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                decision = script.choice(number)
                samples = {seed: unit_audio(seed, number, engine.unit_samples) for _, seed in opened}
                step = {
                    key: UnitInput(samples[seed].astype(np.float32) / PCM16_SCALE, decision) for key, seed in opened
                }
                began = time.perf_counter()
                outputs = engine.step(step)
                latencies += [time.perf_counter() - began] * count
                for key, seed in opened:
                    spoken[seed].append(to_pcm16(outputs[key].audio))
    finally:
        for key, _ in opened:
            engine.close(key)
    return {
        **summary(latencies, cadence, refused, errors=0),
        "audio": {seed: join(parts) for seed, parts in spoken.items()},
    }


def join(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, "<i2")


def summary(latencies: list[float], cadence: float, refused: str | None, errors: int) -> dict[str, Any]:
    p99 = quantile(latencies, 0.99)
    return {
        "refused": refused,
        "errors": errors,
        "units": len(latencies),
        "p50_s": quantile(latencies, 0.5),
        "p99_s": p99,
        "max_s": max(latencies) if latencies else None,
        "over_cadence": sum(latency > cadence for latency in latencies),
        "passes": refused is None and errors == 0 and p99 is not None and p99 < cadence,
    }


def through_server(server: ServerThread, count: int, units: int, script: Script, first_seed: int) -> dict[str, Any]:
    report = asyncio.run(
        run_conversations(
            server.ws_url("/v1/realtime"), count, units, script, paced=True, first_seed=first_seed, record=True
        )
    )
    found = report.to_json()
    refusals = found["refusals"]
    result = summary(report.latencies, report.cadence_s or 1.0, refusals[0] if refusals else None, report.errors)
    audio = {run.seed: join(run.audio) for run in report.runs if run.refused is None}
    return {**result, "errors_text": found["errors"][:5], "audio": audio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="minicpmo45")
    parser.add_argument("--param", action="append", default=[], metavar="K=V")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--units", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True, metavar="PATH")
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help="reduced sizes on the CPU, counts 1,2, 2 units (listen, speak)"
    )
    args = parser.parse_args(argv)
    params = dict(pair.split("=", 1) for pair in args.param)
    counts = [int(text) for text in args.counts.split(",")]
    if args.cpu_dry_run:
        args.device, counts, args.units = "cpu", [1, 2], 2
        params.setdefault("sizes", "reduced")
        params.setdefault("n_timesteps", "2")
    engine = engine_factory(args.engine, args.device, max(counts), params)()
    script = Script(listen=1, speak=1) if args.cpu_dry_run else Script()
    pool = ConversationPool(lambda: engine, engine_name(args.engine), ConversationPoolConfig())
    rows = []
    with ServerThread(make_conversation_app(pool)) as server:
        for count in counts:
            direct = asyncio.run(pool.run_on_device(in_process, engine, count, args.units, script, args.seed))
            served = through_server(server, count, args.units, script, args.seed)
            mine, theirs = direct.pop("audio"), served.pop("audio")
            row: dict[str, Any] = {
                "conversations": count,
                "in_process": direct,
                "server": served,
                "audio_equal_conversations": sum(
                    seed in theirs and np.array_equal(mine[seed], theirs[seed]) for seed in mine
                ),
            }
            if direct["p50_s"] is not None and served["p50_s"] is not None:
                row["overhead_p50_s"] = served["p50_s"] - direct["p50_s"]
                row["overhead_fraction_of_cadence"] = row["overhead_p50_s"] * engine.input_rate / engine.unit_samples
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not (direct["passes"] or served["passes"]):
                break
    result = {
        "engine": args.engine,
        "params": params,
        "device": args.device,
        "units": args.units,
        "rows": rows,
        "conversations_in_process": max((r["conversations"] for r in rows if r["in_process"]["passes"]), default=0),
        "conversations_through_server": max((r["conversations"] for r in rows if r["server"]["passes"]), default=0),
        "environment": environment(args.device),
        "command": " ".join(sys.argv),
    }
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=1)
    print(
        f"conversations at p99 under the cadence: in-process {result['conversations_in_process']}, "
        f"through the server {result['conversations_through_server']}"
    )
    return 0


def environment(device: str) -> dict[str, Any]:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name()
    return found


if __name__ == "__main__":
    sys.exit(main())
