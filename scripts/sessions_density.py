"""Sessions per GPU at the 1 s cadence for the Mimi decoder tail (PersonaPlex's): stock vs DuplexCadence lanes.

N sessions (Mimi instances with their own state and codes) over one set of weights. A round is one
second of audio for every session (13 frames, then 12, alternating: 12.5 Hz); its wall time is
measured from a synchronised start to a synchronised end. The largest N whose p99 round stays under
1 s is reported for:

* stock: N `PersonaPlexMimiDecoder`s (PersonaPlex's own state handling, its transformer graphs on
  CUDA as upstream) served in turn, each session its whole second, then the next;
* duplexcadence, lanes 1: one runtime with N session slots, served in turn with `Session.step`;
* duplexcadence, lanes K > 1: the runtime with K lanes, every frame ONE `Runtime.step_many` over the
  N sessions (sessions of different lanes run concurrently on K CUDA streams).

Every runtime frame is compared with `torch.equal` to the same session's stock frame (sessions stock
reached) and to the lanes-1 runtime (every session). JSON to --out.

    source scripts/device_setup.sh
    python scripts/sessions_density.py --lanes 1,2,4 --sessions 4,8,16,24,32 --out mimi_density.json
    python scripts/sessions_density.py --cpu-dry-run --out /tmp/density.json      # a smoke test, times mean nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from duplexcadence.examples.moshi.model import build_mimi, random_codes
from duplexcadence.examples.personaplex.cadence import load_runtime
from duplexcadence.examples.personaplex.stock import PersonaPlexMimiDecoder
from duplexcadence.interpreter.bench import fresh_peak
from duplexcadence.interpreter.runtime.verify import count_unequal, deterministic_cudnn

DEVICE = "cuda"
DRY_RUN = False


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def reset_peak() -> None:
    fresh_peak(torch.device(DEVICE))


def peak() -> int | None:
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else None


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


def round_frames(index: int) -> int:
    if DRY_RUN:
        return 2
    return 13 if index % 2 == 0 else 12


class Served:
    """N sessions of one kind, each with its own codes and position; `round()` serves one second."""

    def __init__(self, kind: str, lanes: int, make, step_one, step_all, codes_of):
        self.kind, self.lanes = kind, lanes
        self.make, self.step_one, self.step_all, self.codes_of = make, step_one, step_all, codes_of
        self.sessions: list = []
        self.codes: list[torch.Tensor] = []
        self.position: list[int] = []
        self.outputs: list[list[torch.Tensor]] = []
        self.rounds = 0

    def grow(self, count: int) -> None:
        while len(self.sessions) < count:
            index = len(self.sessions)
            self.sessions.append(self.make(index))
            self.codes.append(self.codes_of(index))
            self.position.append(0)
            self.outputs.append([])

    def round(self, count: int) -> float:
        frames = round_frames(self.rounds)
        self.rounds += 1
        sync()
        start = time.perf_counter()
        if self.step_all is None:  # in turn: each session its whole second
            for index in range(count):
                for _ in range(frames):
                    t = self.position[index]
                    self.outputs[index].append(self.step_one(self.sessions[index], self.codes[index][:, :, t : t + 1]))
                    self.position[index] += 1
        else:  # every frame, all sessions together
            for _ in range(frames):
                pcm = self.step_all(
                    {
                        self.sessions[i]: self.codes[i][:, :, self.position[i] : self.position[i] + 1]
                        for i in range(count)
                    }
                )
                for index in range(count):
                    self.outputs[index].append(pcm[self.sessions[index]])
                    self.position[index] += 1
        sync()
        return (time.perf_counter() - start) * 1000


def add_round_arguments(parser: argparse.ArgumentParser, rounds: int, dry_run: str, json_name: str) -> None:
    """The options every density script shares: rounds per count, the CPU dry run, the JSON path."""
    parser.add_argument("--rounds", type=int, default=rounds, help="measured rounds (seconds of audio) per count")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help=f"CPU, {dry_run}: checks the script (times mean nothing)"
    )
    default_out = os.path.join(os.environ["OUT"], json_name) if os.environ.get("OUT") else json_name
    parser.add_argument("--out", default=default_out)


def parse_counts(text: str) -> list[int]:
    return [int(value) for value in text.split(",")]


def session_codes(sweeps: list[list[int]], rounds: int, warmup: int):
    """`codes_of(i)`: session i's own seeded codes, long enough for every round the sweeps can run."""
    frames = 13 * (rounds + warmup) * (max(len(counts) for counts in sweeps) + 1) + 1
    return lambda index: random_codes(1, frames, seed=100 + index).to(DEVICE)


def write_results(payload: dict, baseline_kind: str, ratio_key: str, started: float, path: str) -> None:
    """Each result's sessions at 1 s as a ratio to `baseline_kind`'s (under `ratio_key`), the run's wall time,
    then the JSON to `path`."""
    best = next((r["max_sessions_p99_under_1s"] for r in payload["results"] if r["kind"] == baseline_kind), None)
    for result in payload["results"]:
        if best:
            result[ratio_key] = result["max_sessions_p99_under_1s"] / best
    payload["wall_seconds"] = time.perf_counter() - started
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
    log(f"wrote {path}")


def sweep(served: Served, counts: list[int], rounds: int, warmup: int) -> dict:
    rows, best = [], 0
    for count in counts:
        started = time.perf_counter()
        served.grow(count)
        log(f"{served.kind}: {count} sessions ready ({time.perf_counter() - started:.1f} s)")
        for _ in range(warmup):
            served.round(count)
        walls = [served.round(count) for _ in range(rounds)]
        row = {
            "sessions": count,
            "round_ms_median": sorted(walls)[len(walls) // 2],
            "round_ms_p99": p99(walls),
            "round_ms_max": max(walls),
        }
        rows.append(row)
        log(
            f"{served.kind}: {count} sessions: round median {row['round_ms_median']:.1f} ms, p99 "
            f"{row['round_ms_p99']:.1f} ms"
        )
        if row["round_ms_p99"] >= 1000 and not DRY_RUN:
            break
        best = count
    return {
        "kind": served.kind,
        "lanes": served.lanes,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "max_sessions_p99_under_1s": best,
        "sweep": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock-sessions", default="1,2,4,6,8,10,12")
    parser.add_argument("--sessions", default="4,8,12,16,24,32", help="session counts for the runtime")
    parser.add_argument("--lanes", default="1,2,4", help="K,...: 1 = in turn with Session.step; K > 1 = step_many")
    parser.add_argument("--no-stock", action="store_true", help="skip stock (frames compared with lanes 1 only)")
    add_round_arguments(parser, 6, "3 sessions, 2 rounds of 2 frames", "mimi_density.json")
    args = parser.parse_args()
    global DEVICE, DRY_RUN
    if args.cpu_dry_run:
        DEVICE, DRY_RUN = "cpu", True
        args.stock_sessions, args.sessions, args.lanes, args.rounds, args.warmup_rounds = "3", "3", "1,2", 1, 1
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --cpu-dry-run)", file=sys.stderr)
        return 2
    stock_counts, counts, lanes_list = map(parse_counts, (args.stock_sessions, args.sessions, args.lanes))
    codes_of = session_codes([counts, stock_counts], args.rounds, args.warmup_rounds)

    payload: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "tail": "PersonaPlex Mimi decoder, fp32, B=1, one instance per session",
        "frames_per_round": "13, 12 alternating (12.5 Hz)",
        "results": [],
    }
    started = time.perf_counter()
    outputs: dict[str, list] = {}
    with deterministic_cudnn(), torch.no_grad():
        if not args.no_stock:
            reset_peak()
            mimi = build_mimi(seed=1234, device=DEVICE)
            served = Served(
                "stock",
                0,
                lambda i: PersonaPlexMimiDecoder(mimi, 1),
                lambda decoder, codes: decoder.decode(codes),
                None,
                codes_of,
            )
            result = sweep(served, stock_counts, args.rounds, args.warmup_rounds)
            result["peak_allocated_bytes"] = peak()
            payload["results"].append(result)
            outputs["stock"] = served.outputs
            del served, mimi
        for lanes in lanes_list:
            reset_peak()
            slots = max(counts)
            runtime = load_runtime(build_mimi(seed=1234, device=DEVICE), 1, device=DEVICE, sessions=slots, lanes=lanes)
            kind = f"duplexcadence, {lanes} lane{'s' if lanes > 1 else ''}"
            served = Served(
                kind,
                lanes,
                lambda i, runtime=runtime: runtime.session(),
                lambda s, codes: s.step(codes=codes),
                None
                if lanes == 1
                else lambda steps, runtime=runtime: runtime.step_many({s: {"codes": c} for s, c in steps.items()}),
                codes_of,
            )
            result = sweep(served, counts, args.rounds, args.warmup_rounds)
            report = runtime.report()
            result.update(
                {
                    "peak_allocated_bytes": peak(),
                    "session_slots": slots,
                    "arena_bytes": report.arena_bytes,
                    "session_bytes": report.session_bytes,
                    "scratch_bytes_per_lane": report.scratch_bytes,
                    "arena_bytes_per_session": report.arena_bytes / slots,
                    "graphs_captured": report.graphs_captured,
                    "capture_seconds": report.capture_seconds,
                    "eager_off_plan": report.eager_off_plan,
                }
            )
            for name, reference in outputs.items():
                compared, mismatched = count_unequal(served.outputs, reference)
                result[f"frames_compared_with_{name}"] = compared
                result[f"frames_not_equal_to_{name}"] = mismatched
                log(f"{kind} vs {name}: {compared} frames compared, {mismatched} differ")
            if lanes == 1:
                outputs["duplexcadence, 1 lane"] = served.outputs
            payload["results"].append(result)
            log(
                f"{kind}: {result['max_sessions_p99_under_1s']} sessions at 1 s (p99); arena "
                f"{report.arena_bytes / 2**20:.1f} MiB for {slots} slots"
            )
            del served, runtime
    write_results(payload, "stock", "ratio_to_stock", started, args.out)
    differ = sum(v for r in payload["results"] for k, v in r.items() if k.startswith("frames_not_equal"))
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
