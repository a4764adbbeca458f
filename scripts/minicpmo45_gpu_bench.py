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
  ``--lanes 1,4``: lanes 1 is the runtime served in turn (``Session.step``, one session after the
  other); K > 1 loads the runtime with K lanes and serves each round with ONE
  ``Runtime.step_many`` call over all N sessions (sessions of different lanes run concurrently on
  K CUDA streams). Every lanes run is compared chunk by chunk with the stock run (the sessions stock
  reached) and with the first runtime run (every session).

    source scripts/device_setup.sh
    python scripts/minicpmo45_gpu_bench.py --json minicpmo45.json
    python scripts/minicpmo45_gpu_bench.py --part sessions --lanes 4 --runtime-sessions 8,12,16,20,24 --json l4.json
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
from duplexcadence.interpreter.runtime.verify import count_unequal, deterministic_cudnn

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
    """Every config timed first, then every config's GPU-busy profile (`bench.profile_all`): a profile
    leaves CUPTI attached to the process, and a config timed after one would pay for it on each launch."""

    def made(dtype: str, steps: int) -> bench.Subject:
        return subject_module.subject(
            device=DEVICE,
            seconds=seconds,
            dtype=dtype,
            steps=steps,
            prompt=PROMPT_FRAMES,
            reduced=int(CONFIG != RELEASED),
        )

    timed = []
    for dtype, steps in configs:
        log(f"bench {dtype} n={steps}")
        subject = made(dtype, steps)
        ticks = int(subject.ticks_per_second * seconds)
        timed.append((dtype, steps, ticks, bench.run(subject, ticks, progress=False, profile=False)))
        del subject
        free_device()
    rows = []
    for dtype, steps, ticks, results in timed:
        subject = made(dtype, steps)
        results = bench.profile_all(subject, results, ticks)
        print(bench.format_table(subject, results), flush=True)
        rows.append(bench.to_json(subject, results))
        del subject, results
        free_device()
    return rows


def session_tokens(index: int, chunks: int) -> torch.Tensor:
    return torch.randint(
        0, 6561, (chunks * CHUNK_TOKENS,), generator=torch.Generator().manual_seed(1000 + index), dtype=torch.int32
    )


def serve_in_turn(
    sessions: list,
    streams: list[torch.Tensor],
    position: list[int],
    count: int,
    rounds: int,
    outputs: list[list[torch.Tensor]],
    together=None,
) -> list[float]:
    """`rounds` rounds over the first `count` sessions; returns the wall ms of each round.

    `together` (a runtime's `Token2wavRuntime`): each round is one `step_new_many` over the sessions
    (the same host work per session as `push_tokens`: tokens to the device, pcm back to the host)."""
    walls = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        if together is not None:
            chunks = {}
            for index in range(count):
                chunk_index = position[index]
                window = streams[index][CHUNK_TOKENS * chunk_index : CHUNK_TOKENS * (chunk_index + 1)].tolist()
                chunks[sessions[index]] = torch.tensor([window], dtype=torch.int32).to(DEVICE)
                position[index] += 1
            pcm = together.step_new_many(chunks)
            for index in range(count):
                outputs[index].append(pcm[sessions[index]].cpu())
        else:
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


def sweep(
    kind: str, make_session, counts: list[int], rounds: int, warmup: int, chunks: int, together=None
) -> tuple[dict, list]:
    sessions, streams, position, outputs = [], [], [], []
    rows = []
    best = 0
    for count in counts:
        started = time.perf_counter()
        while len(sessions) < count:
            index = len(sessions)
            sessions.append(make_session(index))
            streams.append(session_tokens(index, chunks))
            position.append(0)
            outputs.append([])
        log(f"{kind}: {count} sessions ready ({time.perf_counter() - started:.1f} s to add sessions)")
        serve_in_turn(sessions, streams, position, count, warmup, outputs, together)
        walls = serve_in_turn(sessions, streams, position, count, rounds, outputs, together)
        row = {
            "sessions": count,
            "round_ms_median": sorted(walls)[len(walls) // 2],
            "round_ms_p99": p99(walls),
            "round_ms_max": max(walls),
        }
        rows.append(row)
        log(
            f"{kind}: {count} sessions {'together' if together is not None else 'in turn'}: round median {row['round_ms_median']:.1f} ms, p99 {row['round_ms_p99']:.1f} ms"
        )
        if row["round_ms_p99"] >= 1000:
            break
        best = count
    return {
        "kind": kind,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "max_sessions_p99_under_1s": best,
        "sweep": rows,
    }, outputs


def run_lanes(
    dtype: str,
    steps: int,
    lanes: int,
    runtime_counts: list[int],
    rounds: int,
    warmup: int,
    chunks: int,
    prompt,
    references: dict[str, list],
) -> dict:
    """The runtime with `lanes` lanes, every round one `step_new_many` over all sessions."""
    log(f"sessions together, duplexcadence with {lanes} lanes, {dtype} n={steps}")
    reset_peak()
    sessions = max(runtime_counts)
    bound = load_runtime(
        build_tail(CONFIG, seed=1234, device=DEVICE, float16=dtype == "fp16"),
        PROMPT_FRAMES,
        steps,
        sessions=sessions,
        lanes=lanes,
    )
    result, outputs = sweep(
        f"duplexcadence {lanes} lanes",
        lambda i: bound.session(prompt, seed=i),
        runtime_counts,
        rounds,
        warmup,
        chunks,
        together=bound,
    )
    report = bound.runtime.report()
    peak = peak_allocated()
    result.update(
        {
            "lanes": lanes,
            "session_slots": sessions,
            "peak_allocated_bytes": peak,
            "arena_bytes": report.arena_bytes,
            "session_bytes": report.session_bytes,
            "scratch_bytes_per_lane": report.scratch_bytes,
            "arena_bytes_per_session": report.arena_bytes / sessions,
            "peak_allocated_bytes_per_session": None if peak is None else peak / sessions,
            "graphs_captured": report.graphs_captured,
            "capture_seconds": report.capture_seconds,
        }
    )
    for name, reference in references.items():
        compared, mismatched = count_unequal(outputs, reference)
        result[f"chunks_compared_with_{name}"] = compared
        result[f"chunks_not_equal_to_{name}"] = mismatched
        log(f"{lanes} lanes vs {name}: {compared} chunks compared, {mismatched} differ")
    log(
        f"{lanes} lanes: {result['max_sessions_p99_under_1s']} sessions at 1 s (p99); arena "
        f"{report.arena_bytes / 2**20:.0f} MiB ({report.arena_bytes / sessions / 2**20:.1f} MiB per session slot)"
    )
    bound = None
    free_device()
    return result


def run_sessions(
    dtype: str,
    steps: int,
    stock_counts: list[int],
    runtime_counts: list[int],
    rounds: int,
    warmup: int,
    lanes: list[int] = (1,),
) -> dict:
    float16 = dtype == "fp16"
    prompt = random_prompt(PROMPT_FRAMES, seed=4321, device=DEVICE)
    chunks = (rounds + warmup) * (len(runtime_counts) + 1)
    log(f"sessions in turn, stock, {dtype} n={steps}")
    reset_peak()
    stock_tail = build_tail(CONFIG, seed=1234, device=DEVICE, float16=float16)
    stock_result, stock_outputs = sweep(
        "stock",
        lambda i: StockToken2wavSession(stock_tail, prompt, n_timesteps=steps, session_seed=i, own_caches=True),
        stock_counts,
        rounds,
        warmup,
        chunks,
    )
    stock_result["peak_allocated_bytes"] = peak_allocated()
    stock_tail = None
    free_device()
    result = {
        "dtype": dtype,
        "n_timesteps": steps,
        "prompt_frames": PROMPT_FRAMES,
        "stock": stock_result,
        "chunks_compared": 0,
        "chunks_not_equal": 0,
    }
    stock_best = stock_result["max_sessions_p99_under_1s"]  # 0: fewer than the smallest count tried

    def ratio_text(sessions: int) -> str:
        if not stock_best:
            return f"no ratio: stock missed 1 s at {min(stock_counts)} sessions, its smallest count tried"
        return f"{sessions / stock_best:.1f}x"

    references = {"stock": stock_outputs}
    if 1 in lanes:
        log(f"sessions in turn, duplexcadence, {dtype} n={steps}")
        reset_peak()
        bound = load_runtime(
            build_tail(CONFIG, seed=1234, device=DEVICE, float16=float16),
            PROMPT_FRAMES,
            steps,
            sessions=max(runtime_counts),
        )
        runtime_result, runtime_outputs = sweep(
            "duplexcadence", lambda i: bound.session(prompt, seed=i), runtime_counts, rounds, warmup, chunks
        )
        runtime_result["peak_allocated_bytes"] = peak_allocated()
        compared, mismatched = count_unequal(runtime_outputs, stock_outputs)
        report = bound.runtime.report()
        result.update(
            {
                "duplexcadence": runtime_result,
                "chunks_compared": compared,
                "chunks_not_equal": mismatched,
                "arena_bytes": report.arena_bytes,
                "graphs_captured": report.graphs_captured,
            }
        )
        log(
            f"sessions per GPU at 1 s (p99): stock {stock_best}, duplexcadence "
            f"{runtime_result['max_sessions_p99_under_1s']} ({ratio_text(runtime_result['max_sessions_p99_under_1s'])}); "
            f"{compared} chunks compared, "
            f"{mismatched} differ"
        )
        references["duplexcadence in turn"] = runtime_outputs
        bound = None
        free_device()
    result["duplexcadence_lanes"] = {}
    for count in (k for k in lanes if k > 1):
        lane_result = run_lanes(dtype, steps, count, runtime_counts, rounds, warmup, chunks, prompt, references)
        lane_result["ratio_to_stock"] = lane_result["max_sessions_p99_under_1s"] / stock_best if stock_best else None
        result["duplexcadence_lanes"][str(count)] = lane_result
        result["chunks_not_equal"] += sum(v for k, v in lane_result.items() if k.startswith("chunks_not_equal"))
        log(
            f"sessions per GPU at 1 s (p99): stock {stock_best}, duplexcadence with "
            f"{count} lanes {lane_result['max_sessions_p99_under_1s']} "
            f"({ratio_text(lane_result['max_sessions_p99_under_1s'])})"
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "bench", "sessions"), default="all")
    parser.add_argument("--seconds", type=int, default=10, help="duplex seconds per bench variant")
    parser.add_argument("--configs", default="fp32:10,fp32:5,fp16:10,fp16:5", help="DTYPE:STEPS,... for the bench")
    parser.add_argument("--sessions-config", default="fp32:10", help="DTYPE:STEPS for sessions in turn")
    parser.add_argument("--stock-sessions", default="1,2,3,4,5,6")
    parser.add_argument("--runtime-sessions", default="1,2,4,6,8,10,12,14,16,18,20")
    parser.add_argument(
        "--lanes",
        default="1",
        help="K,... for the runtime: 1 = sessions in turn (Session.step); K > 1 = K lanes, each round "
        "one Runtime.step_many over all sessions",
    )
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds per session count")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="the reduced CI tail on the CPU, P = 20, n from the configs (checks the script, times mean nothing)",
    )
    default_json = (
        os.path.join(os.environ["OUT"], "minicpmo45.json") if os.environ.get("OUT") else "minicpmo45_gpu.json"
    )
    parser.add_argument("--json", default=default_json)
    args = parser.parse_args()
    global DEVICE, CONFIG, PROMPT_FRAMES
    if args.cpu_dry_run:
        DEVICE, CONFIG, PROMPT_FRAMES = "cpu", subject_module.REDUCED, 20
    elif not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    payload: dict = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "cudnn": torch.backends.cudnn.version(),
        "prompt_frames": PROMPT_FRAMES,
    }
    started = time.perf_counter()
    with deterministic_cudnn(), torch.no_grad():
        # Sessions first: the bench's GPU-busy profile leaves CUPTI attached to the process, and every launch
        # timed after it pays CUPTI's callbacks (interpreter/bench/profile.py).
        if args.part in ("all", "sessions"):
            dtype, steps = args.sessions_config.split(":")
            payload["sessions_in_turn"] = run_sessions(
                dtype,
                int(steps),
                [int(v) for v in args.stock_sessions.split(",")],
                [int(v) for v in args.runtime_sessions.split(",")],
                args.rounds,
                args.warmup_rounds,
                [int(v) for v in args.lanes.split(",")],
            )
        if args.part in ("all", "bench"):
            configs = [(item.split(":")[0], int(item.split(":")[1])) for item in args.configs.split(",")]
            if DEVICE == "cpu" and any(dtype == "fp16" for dtype, _ in configs):
                log("the fp16 tail runs under CUDA autocast: the CPU dry run leaves its configs out")
                configs = [(dtype, steps) for dtype, steps in configs if dtype != "fp16"]
            payload["bench"] = run_bench(configs, args.seconds)
    payload["wall_seconds"] = time.perf_counter() - started
    with open(args.json, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
    log(f"wrote {args.json}")
    identical = all(v["bit_identical"] is not False for row in payload.get("bench", []) for v in row["variants"])
    identical &= payload.get("sessions_in_turn", {}).get("chunks_not_equal", 0) == 0
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
