"""A one-hour conversation of Moshi's Mimi decoder tail under DuplexCadence, beside moshi's own decode.

    python scripts/mimi_long_session.py --device cuda --seconds 3600 --out $OUT/mimi_long_session.json
    python scripts/mimi_long_session.py --device cpu --seconds 20 --out /tmp/mimi_long_session.json  # smoke

One DuplexCadence session decodes `seconds` x 12.5 frames of seeded random codes (45 000 for an hour),
one frame per step, never reset. moshi 0.2.13's streaming decode (`MoshiStockDecoder`, graphs off:
mode `eager_compiled_rope`, or `eager` when moshi's rope is not compiled) is stepped through every
frame too: its state after an hour is only the same if it saw the same hour. Every frame of both is
compared on the device without a host sync (a per-frame flag, read at the end), so the run checks
every frame, not only spot windows; the JSON also gives the mismatches inside three windows (the
first `--window` frames, those ending at the half-way mark, the last ones), as the spot checks.

Recorded: `torch.cuda.memory_allocated()` every `--every` frames (on CPU: the process's resident
set; both sides run in this process, so it counts moshi's allocations too), the runtime's graph counters at the start and the end, the address of every region of the
session and of every state tensor moshi keeps, at the start and the end. The result is written as
JSON to `--out` (default `$OUT/mimi_long_session.json`, else `./mimi_long_session.json`) and
summarised on stdout; the exit status is 0 when every check holds, 1 otherwise.

Checks (`checks` in the JSON): every compared frame `torch.equal`; no region or state tensor moved;
no graph captured after the session's start and every firing on the plan (on CUDA: every firing a
replay); allocated memory after the first `--every` frames never above its value then.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

FRAMES_PER_SECOND = 12.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--seconds", type=float, default=3600.0, help="seconds of conversation (12.5 frames each)")
    parser.add_argument("--every", type=int, default=125, help="record memory every N frames (default 125 = 10 s)")
    parser.add_argument("--window", type=int, default=200, help="frames in each spot-check window")
    parser.add_argument("--seed", type=int, default=1234, help="weights seed; the codes use seed + 1")
    parser.add_argument("--out", default=None, help="JSON result path")
    return parser.parse_args(argv)


def resident_bytes() -> int:
    """The process's resident set, from /proc (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def counters(runtime) -> dict:
    report = runtime.report()
    return {"graphs_captured": report.graphs_captured, "stage_graphs_covered": report.stage_graphs_covered,
            "graphs_planned": report.graphs_planned, "replays": report.replays,
            "eager_planned": report.eager_planned, "eager_off_plan": report.eager_off_plan,
            "blocked": [d.message for d in report.blocked]}


def state_pointers(mimi) -> dict[str, int]:
    from duplexcadence.examples.moshi import state

    return {entry.path: entry.tensor.data_ptr() for entry in state.decode_state_tensors(mimi)}


def windows(frames: int, size: int) -> dict[str, tuple[int, int]]:
    size = min(size, frames)
    half = frames // 2
    return {"start": (0, size), "half-way": (max(0, half - size), half), "end": (frames - size, frames)}


def run(args: argparse.Namespace) -> dict:
    from duplexcadence.examples.moshi.cadence import load_runtime
    from duplexcadence.examples.moshi.model import build_mimi, moshi_torch_compile_enabled, random_codes
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    frames = int(args.seconds * FRAMES_PER_SECOND)
    codes = random_codes(1, frames, seed=args.seed + 1).to(device)
    mode = "eager_compiled_rope" if device.type == "cuda" and moshi_torch_compile_enabled() else "eager"

    def memory() -> int:
        return torch.cuda.memory_allocated(device) if device.type == "cuda" else resident_bytes()

    setup_started = time.perf_counter()
    mimi = build_mimi(seed=args.seed, device=device)
    runtime = load_runtime(mimi, 1, device=device)
    session = runtime.session()
    stock = MoshiStockDecoder(build_mimi(seed=args.seed, device=device), 1, mode=mode)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    setup_s = time.perf_counter() - setup_started

    start_counters = counters(runtime)
    start_regions, start_state = session.data_ptrs(), state_pointers(mimi)
    flags = torch.zeros(frames, dtype=torch.bool, device=device)
    shape_mismatches: list[int] = []
    samples: list[tuple[int, int]] = [(0, memory())]
    started = time.perf_counter()
    progress = max(1, frames // 10)
    with torch.no_grad():
        for t in range(frames):
            frame = codes[:, :, t:t + 1]
            actual = session.step(codes=frame)
            expected = stock.step(frame)
            if actual.shape != expected.shape or actual.dtype != expected.dtype:
                shape_mismatches.append(t)
            else:
                flags[t] = (actual != expected).any() | (actual.isnan().any())  # torch.equal: NaN never equal
            del actual, expected
            if (t + 1) % args.every == 0 or t + 1 == frames:
                samples.append((t + 1, memory()))
            if (t + 1) % progress == 0:
                elapsed = time.perf_counter() - started
                print(f"  {t + 1}/{frames} frames ({(t + 1) / FRAMES_PER_SECOND:.0f} s of audio) in "
                      f"{elapsed:.0f} s; memory {samples[-1][1] / 2**20:.1f} MiB", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    end_counters = counters(runtime)
    end_regions, end_state = session.data_ptrs(), state_pointers(mimi)
    differing = sorted(set(torch.nonzero(flags).flatten().tolist()) | set(shape_mismatches))

    steady = [value for frame, value in samples if frame >= args.every]
    baseline = steady[0] if steady else samples[-1][1]
    growth = max(steady, default=baseline) - baseline
    spots = {name: {"frames": [lo, hi], "mismatches": sum(lo <= t < hi for t in differing)}
             for name, (lo, hi) in windows(frames, args.window).items()}
    graphs_ok = (end_counters["graphs_captured"] == start_counters["graphs_captured"]
                 and end_counters["eager_off_plan"] == 0)
    if device.type == "cuda":
        graphs_ok = graphs_ok and end_counters["eager_planned"] == 0 and end_counters["replays"] > 0
    checks = {
        "every_frame_equal": not differing,
        "regions_stable": end_regions == start_regions,
        "state_tensors_stable": end_state == start_state,
        "no_new_graphs_all_on_plan": graphs_ok,
        # on CPU the resident set also moves with the allocator's free lists: reported, not checked
        "no_memory_growth": growth <= 0 if device.type == "cuda" else None,
    }
    return {
        "command": args.command,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "moshi": _version("moshi"),
        "seconds": args.seconds,
        "frames": frames,
        "stock_mode": mode,
        "compared": "every frame (stock stepped through all frames)",
        "setup_s": round(setup_s, 3),
        "elapsed_s": round(elapsed, 3),
        "ms_per_frame_both_sides": round(elapsed / max(frames, 1) * 1000, 3),
        "mismatched_frames": len(differing),
        "first_mismatches": differing[:20],
        "spot_windows": spots,
        "memory": {"kind": "torch.cuda.memory_allocated" if device.type == "cuda" else "process resident set",
                   "every_frames": args.every, "start": samples[0][1], "after_first_interval": baseline,
                   "end": samples[-1][1], "max_after_first_interval": max(steady, default=baseline),
                   "growth_after_first_interval": growth,
                   "max_allocated": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                   "samples": samples},
        "graphs_start": start_counters,
        "graphs_end": end_counters,
        "data_ptrs": {"regions_start": start_regions, "regions_end": end_regions,
                      "state_moved": sorted(k for k in start_state if start_state[k] != end_state.get(k)),
                      "regions_moved": sorted(k for k in start_regions if start_regions[k] != end_regions.get(k))},
        "checks": checks,
        "ok": all(value is not False for value in checks.values()),
    }


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def summary(result: dict) -> str:
    memory = result["memory"]
    lines = [f"Mimi long session: {result['frames']} frames ({result['seconds'] / 60:.1f} min of audio) on "
             f"{result['device']}, stock {result['stock_mode']}; {result['elapsed_s']:.0f} s "
             f"({result['ms_per_frame_both_sides']:.2f} ms per frame, both sides)",
             f"  frames differing from stock: {result['mismatched_frames']} of {result['frames']} "
             f"(windows: " + ", ".join(f"{name} {w['frames'][0]}-{w['frames'][1]}: {w['mismatches']}"
                                      for name, w in result["spot_windows"].items()) + ")",
             f"  {memory['kind']}: start {memory['start'] / 2**20:.1f} MiB, after {memory['every_frames']} frames "
             f"{memory['after_first_interval'] / 2**20:.1f} MiB, end {memory['end'] / 2**20:.1f} MiB, growth after "
             f"that {memory['growth_after_first_interval']} bytes",
             f"  graphs captured: {result['graphs_start']['graphs_captured']} at start, "
             f"{result['graphs_end']['graphs_captured']} at end; replays {result['graphs_end']['replays']}, eager "
             f"{result['graphs_end']['eager_planned']} planned + {result['graphs_end']['eager_off_plan']} off-plan",
             f"  moved: regions {result['data_ptrs']['regions_moved'] or 'none'}, "
             f"state tensors {result['data_ptrs']['state_moved'] or 'none'}",
             "  checks: " + ", ".join(f"{name} {'-' if value is None else 'ok' if value else 'FAILED'}"
                                      for name, value in result["checks"].items()),
             f"  {'OK' if result['ok'] else 'FAILED'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.command = " ".join(["python scripts/mimi_long_session.py", *argv])
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "mimi_long_session.json")
    result = run(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    print(f"  result: {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
