"""MiniCPM-o 4.5 token2wav tail on the GPU: stock eager vs DuplexCadence, released sizes, P = 150.

Two parts, both in one process on one device, under deterministic cuDNN:

* ``bench``: the `dsl bench minicpmo45` subject for each dtype / n_timesteps (ms per duplex second,
  GPU busy, peak memory with weights, bit-identity of every chunk against stock eager, graphs);
* ``sessions``: sessions served in turn at the 1 s cadence. N sessions (distinct seeds and token
  streams, one voice), each second every session gets one chunk, one after the other; a round is
  the wall time of those N chunks. The largest N whose p99 round stays under 1 s is reported, for
  stock (``own_caches``: each session keeps its caches) and for the runtime (N session slots). Every
  runtime chunk is compared with ``torch.equal`` to the same session's chunk from the stock run
  (each stock session served in turn equals its solo run: its own caches and generator state).

    source scripts/device_setup.sh
    python scripts/minicpmo45_gpu_bench.py --json $OUT/minicpmo45.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

from duplexcadence.examples.minicpmo45 import bench as subject_module
from duplexcadence.examples.minicpmo45.cadence import load_runtime
from duplexcadence.examples.minicpmo45.model import RELEASED, build_tail, random_prompt
from duplexcadence.examples.minicpmo45.stock import CHUNK_TOKENS, StockToken2wavSession
from duplexcadence.interpreter import bench
from duplexcadence.interpreter.verify import deterministic_cudnn

PROMPT_FRAMES = 150
DEVICE = "cuda"
CONFIG = RELEASED


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_device() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def peak_allocated() -> int | None:
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else None


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def run_bench(configs: list[tuple[str, int]], seconds: int) -> list[dict]:
    rows = []
    for dtype, steps in configs:
        log(f"bench {dtype} n={steps}")
        subject = subject_module.subject(device=DEVICE, seconds=seconds, dtype=dtype, steps=steps, prompt=PROMPT_FRAMES,
                                         reduced=int(CONFIG != RELEASED))
        results = bench.run(subject, int(subject.ticks_per_second * seconds), progress=False)
        print(bench.format_table(subject, results), flush=True)
        rows.append(bench.to_json(subject, results))
        del subject, results
        free_device()
    return rows


def session_tokens(index: int, chunks: int) -> torch.Tensor:
    return torch.randint(0, 6561, (chunks * CHUNK_TOKENS,), generator=torch.Generator().manual_seed(1000 + index),
                         dtype=torch.int32)


def serve_in_turn(sessions: list, streams: list[torch.Tensor], position: list[int], count: int, rounds: int,
                  outputs: list[list[torch.Tensor]]) -> list[float]:
    """`rounds` rounds over the first `count` sessions; returns the wall ms of each round."""
    walls = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for index in range(count):
            chunk_index = position[index]
            window = streams[index][CHUNK_TOKENS * chunk_index : CHUNK_TOKENS * (chunk_index + 1)].tolist()
            (chunk,) = sessions[index].push_tokens(window)
            outputs[index].append(chunk)
            position[index] += 1
        sync()
        walls.append((time.perf_counter() - start) * 1000)
    return walls


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


def sweep(kind: str, make_session, counts: list[int], rounds: int, warmup: int, chunks: int) -> tuple[dict, list]:
    sessions, streams, position, outputs = [], [], [], []
    rows = []
    best = 0
    for count in counts:
        while len(sessions) < count:
            index = len(sessions)
            sessions.append(make_session(index))
            streams.append(session_tokens(index, chunks))
            position.append(0)
            outputs.append([])
        serve_in_turn(sessions, streams, position, count, warmup, outputs)
        walls = serve_in_turn(sessions, streams, position, count, rounds, outputs)
        row = {"sessions": count, "round_ms_median": sorted(walls)[len(walls) // 2], "round_ms_p99": p99(walls),
               "round_ms_max": max(walls)}
        rows.append(row)
        log(f"{kind}: {count} sessions in turn: round median {row['round_ms_median']:.1f} ms, p99 {row['round_ms_p99']:.1f} ms")
        if row["round_ms_p99"] >= 1000:
            break
        best = count
    return {"kind": kind, "rounds": rounds, "warmup_rounds": warmup, "max_sessions_p99_under_1s": best,
            "sweep": rows}, outputs


def run_sessions(dtype: str, steps: int, stock_counts: list[int], runtime_counts: list[int], rounds: int,
                 warmup: int) -> dict:
    float16 = dtype == "fp16"
    prompt = random_prompt(PROMPT_FRAMES, seed=4321, device=DEVICE)
    chunks = (rounds + warmup) * (len(runtime_counts) + 1)
    log(f"sessions in turn, stock, {dtype} n={steps}")
    reset_peak()
    stock_tail = build_tail(CONFIG, seed=1234, device=DEVICE, float16=float16)
    stock_result, stock_outputs = sweep(
        "stock", lambda i: StockToken2wavSession(stock_tail, prompt, n_timesteps=steps, session_seed=i, own_caches=True),
        stock_counts, rounds, warmup, chunks)
    stock_result["peak_allocated_bytes"] = peak_allocated()
    stock_tail = None
    free_device()
    log(f"sessions in turn, duplexcadence, {dtype} n={steps}")
    reset_peak()
    bound = load_runtime(build_tail(CONFIG, seed=1234, device=DEVICE, float16=float16), PROMPT_FRAMES, steps,
                         sessions=max(runtime_counts))
    runtime_result, runtime_outputs = sweep("duplexcadence", lambda i: bound.session(prompt, seed=i),
                                            runtime_counts, rounds, warmup, chunks)
    runtime_result["peak_allocated_bytes"] = peak_allocated()
    compared = mismatched = 0
    for mine, theirs in zip(runtime_outputs, stock_outputs):
        for chunk_mine, chunk_theirs in zip(mine, theirs):
            compared += 1
            mismatched += not torch.equal(chunk_mine, chunk_theirs)
    report = bound.runtime.report()
    result = {"dtype": dtype, "n_timesteps": steps, "prompt_frames": PROMPT_FRAMES, "stock": stock_result,
              "duplexcadence": runtime_result, "chunks_compared": compared, "chunks_not_equal": mismatched,
              "arena_bytes": report.arena_bytes, "graphs_captured": report.graphs_captured}
    ratio = runtime_result["max_sessions_p99_under_1s"] / max(1, stock_result["max_sessions_p99_under_1s"])
    log(f"sessions per GPU at 1 s (p99): stock {stock_result['max_sessions_p99_under_1s']}, duplexcadence "
        f"{runtime_result['max_sessions_p99_under_1s']} ({ratio:.1f}x); {compared} chunks compared, {mismatched} differ")
    bound = None
    free_device()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "bench", "sessions"), default="all")
    parser.add_argument("--seconds", type=int, default=10, help="duplex seconds per bench variant")
    parser.add_argument("--configs", default="fp32:10,fp32:5,fp16:10,fp16:5", help="DTYPE:STEPS,... for the bench")
    parser.add_argument("--sessions-config", default="fp32:10", help="DTYPE:STEPS for sessions in turn")
    parser.add_argument("--stock-sessions", default="1,2,3,4,5,6")
    parser.add_argument("--runtime-sessions", default="1,2,4,6,8,10,12,14,16,18,20")
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds per session count")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="the reduced CI tail on the CPU, P = 20, n from the configs (checks the script, times mean nothing)")
    default_json = os.path.join(os.environ["OUT"], "minicpmo45.json") if os.environ.get("OUT") else "minicpmo45_gpu.json"
    parser.add_argument("--json", default=default_json)
    args = parser.parse_args()
    global DEVICE, CONFIG, PROMPT_FRAMES
    if args.cpu_dry_run:
        DEVICE, CONFIG, PROMPT_FRAMES = "cpu", subject_module.REDUCED, 20
    elif not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    payload: dict = {"torch": torch.__version__, "cuda": torch.version.cuda,
                     "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
                     "cudnn": torch.backends.cudnn.version(), "prompt_frames": PROMPT_FRAMES}
    started = time.perf_counter()
    with deterministic_cudnn(), torch.no_grad():
        if args.part in ("all", "bench"):
            configs = [(item.split(":")[0], int(item.split(":")[1])) for item in args.configs.split(",")]
            payload["bench"] = run_bench(configs, args.seconds)
        if args.part in ("all", "sessions"):
            dtype, steps = args.sessions_config.split(":")
            payload["sessions_in_turn"] = run_sessions(
                dtype, int(steps), [int(v) for v in args.stock_sessions.split(",")],
                [int(v) for v in args.runtime_sessions.split(",")], args.rounds, args.warmup_rounds)
    payload["wall_seconds"] = time.perf_counter() - started
    with open(args.json, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
    log(f"wrote {args.json}")
    identical = all(v["bit_identical"] is not False for row in payload.get("bench", []) for v in row["variants"])
    identical &= payload.get("sessions_in_turn", {}).get("chunks_not_equal", 0) == 0
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
