"""A one-hour conversation of Moshi's Mimi decoder tail under DuplexCadence, beside moshi's own decode.

    python scripts/mimi_long_session.py --device cuda --seconds 3600 --stock-mode stock --max-wall 500 \
        --out mimi_long_session.json
    python scripts/mimi_long_session.py --device cpu --seconds 20 --out /tmp/mimi_long_session.json  # smoke

One DuplexCadence session decodes `seconds` x 12.5 frames of seeded random codes (45 000 for an hour),
one frame per step, never reset. moshi 0.2.13's streaming decode (`MoshiStockDecoder`) is stepped
through every frame too: its state after an hour is only the same if it saw the same hour. Its mode
(`--stock-mode`): `auto` (default) is the bit-identity reference of the benchmarks, moshi's graphs off
(`eager_compiled_rope` on CUDA when moshi compiles its rope, else `eager`). That side launches every
kernel from Python: about 11 ms a frame on the H200 (141.5 ms/s in `dsl bench moshi`), so an hour of
it takes 10 to 12 minutes. `stock` is moshi as shipped (its `CUDAGraphed` around the decoder
transformer and SEANet, compiled rope; `== stock eager` in the benchmarks), about 2.4 to 2.9 ms a frame: an
hour then fits in one GPU call. On CPU `stock` and `eager` are the same.

Every frame of both is compared on the device without a host sync (`ne(...).any()` into a per-frame
flag tensor; NaN is never equal, as in `torch.equal`); the flags are read at the checkpoints. The JSON
also gives the mismatches inside three windows (the first `--window` frames, those ending at the
half-way mark, the last ones), as the spot checks.

Recorded: `torch.cuda.memory_allocated()` every `--every` frames (on CPU: the process's resident
set; both sides run in this process, so it counts moshi's allocations too), the runtime's graph
counters, the address of every region of the session and of every state tensor moshi keeps, at the
start and at every checkpoint.

Checkpoints: at a memory sample (every `--every` frames) when `--checkpoint-s` seconds have passed
since the last one, at every tenth of the run, and at the end. Each one synchronizes once, reads the
flags, checks the addresses and writes the whole result so far to `--out` (default
`mimi_long_session.json`, else `./mimi_long_session.json`) atomically (a temporary file, then
`os.replace`), with `complete: false`; the last one has `complete: true`. A run killed from outside
keeps its last checkpoint. `--max-wall S` stops the run cleanly before S seconds from the script's
start (setup included) and writes the result with `complete: false`, `stopped: "max-wall"` and the
frames done; SIGTERM does the same (`stopped: "SIGTERM"`); an exception in the loop writes
`stopped: "error: ..."`, then propagates.

Checks (`checks` in the JSON, over the frames done): every compared frame `torch.equal`; no region or
state tensor moved at any checkpoint; no graph captured after the session's start and every firing on
the plan (on CUDA: every firing a replay); allocated memory after the first `--every` frames never
above its value then. Exit status: 0 when the run completed and every check holds, 1 when a check
failed, 2 when it stopped early with every check holding so far.
"""

from __future__ import annotations

import time

_PROCESS_STARTED = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

FRAMES_PER_SECOND = 12.5
STOCK_MODES = ("auto", "stock", "eager", "eager_compiled_rope", "graphed", "graphed_compiled_rope")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--seconds", type=float, default=3600.0, help="seconds of conversation (12.5 frames each)")
    parser.add_argument(
        "--stock-mode",
        default="auto",
        choices=STOCK_MODES,
        help="moshi side: auto (default: graphs off, the bit-identity reference), stock (as "
        "shipped, its own CUDA graphs), or another MoshiStockDecoder mode",
    )
    parser.add_argument("--every", type=int, default=125, help="record memory every N frames (default 125 = 10 s)")
    parser.add_argument("--window", type=int, default=200, help="frames in each spot-check window")
    parser.add_argument(
        "--checkpoint-s",
        type=float,
        default=15.0,
        help="write the result at the next memory sample once this many wall seconds have "
        "passed since the last write (default 15)",
    )
    parser.add_argument(
        "--max-wall",
        type=float,
        default=None,
        help="stop cleanly before this many seconds from the script's start (setup included) "
        "and write the result so far (default: no limit)",
    )
    parser.add_argument("--seed", type=int, default=1234, help="weights seed; the codes use seed + 1")
    parser.add_argument("--out", default=None, help="JSON result path")
    return parser.parse_args(argv)


def resident_bytes() -> int:
    """The process's resident set, from /proc (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def counters(runtime) -> dict:
    report = runtime.report()
    return {
        "graphs_captured": report.graphs_captured,
        "stage_graphs_covered": report.stage_graphs_covered,
        "graphs_planned": report.graphs_planned,
        "replays": report.replays,
        "eager_planned": report.eager_planned,
        "eager_off_plan": report.eager_off_plan,
        "blocked": [d.message for d in report.blocked],
    }


def state_pointers(mimi) -> dict[str, int]:
    from duplexcadence.examples.moshi import state

    return {entry.path: entry.tensor.data_ptr() for entry in state.decode_state_tensors(mimi)}


def windows(frames: int, size: int) -> dict[str, tuple[int, int]]:
    size = min(size, frames)
    half = frames // 2
    return {"start": (0, size), "half-way": (max(0, half - size), half), "end": (frames - size, frames)}


def write_atomic(path: Path, result: dict) -> None:
    """Write the JSON to a temporary file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as file:
        file.write(json.dumps(result, indent=1) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def run(args: argparse.Namespace, out: Path, wall_started: float, stop: dict | None = None) -> dict:
    """Run the session; write the result to `out` at every checkpoint; return the last one.
    `stop["reason"]`, once set (by a signal handler), stops the loop at the next frame."""
    from duplexcadence.examples.moshi.cadence import load_runtime
    from duplexcadence.examples.moshi.model import build_mimi, moshi_torch_compile_enabled, random_codes
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder

    stop = {} if stop is None else stop
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    frames = int(args.seconds * FRAMES_PER_SECOND)
    codes = random_codes(1, frames, seed=args.seed + 1).to(device)
    mode = args.stock_mode
    if mode == "auto":
        mode = "eager_compiled_rope" if cuda and moshi_torch_compile_enabled() else "eager"
    deadline = None if args.max_wall is None else wall_started + args.max_wall

    def memory() -> int:
        return torch.cuda.memory_allocated(device) if cuda else resident_bytes()

    setup_started = time.perf_counter()
    mimi = build_mimi(seed=args.seed, device=device)
    runtime = load_runtime(mimi, 1, device=device)
    session = runtime.session()
    stock = MoshiStockDecoder(build_mimi(seed=args.seed, device=device), 1, mode=mode)
    if cuda:
        torch.cuda.synchronize(device)
    setup_s = time.perf_counter() - setup_started

    start_counters = counters(runtime)
    start_regions, start_state = session.data_ptrs(), state_pointers(mimi)
    moved_regions: set[str] = set()
    moved_state: set[str] = set()
    flags = torch.zeros(frames, dtype=torch.bool, device=device)
    shape_mismatches: list[int] = []
    samples: list[tuple[int, int]] = [(0, memory())]
    static = {
        "command": args.command,
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "moshi": _version("moshi"),
        "seconds": args.seconds,
        "frames": frames,
        "stock_mode": mode,
        "compared": "every frame (stock stepped through all frames)",
        "setup_s": round(setup_s, 3),
        "max_wall_s": args.max_wall,
    }
    checkpoints = 0
    write_s = 0.0  # the longest checkpoint so far: --max-wall keeps room for one more

    def snapshot(done: int, elapsed: float, complete: bool, stopped: str | None) -> dict:
        end_counters = counters(runtime)
        end_regions, end_state = session.data_ptrs(), state_pointers(mimi)
        moved_regions.update(k for k in start_regions if start_regions[k] != end_regions.get(k))
        moved_state.update(k for k in start_state if start_state[k] != end_state.get(k))
        flagged = torch.nonzero(flags[:done]).flatten().tolist()  # the one host sync of a checkpoint
        differing = sorted(set(flagged) | set(shape_mismatches))

        steady = [value for frame, value in samples if frame >= args.every]
        baseline = steady[0] if steady else samples[-1][1]
        growth = max(steady, default=baseline) - baseline
        spots = {
            name: {
                "frames": [lo, hi],
                "checked": max(0, min(hi, done) - lo),
                "mismatches": sum(lo <= t < hi for t in differing),
            }
            for name, (lo, hi) in windows(frames, args.window).items()
        }
        graphs_ok = (
            end_counters["graphs_captured"] == start_counters["graphs_captured"] and end_counters["eager_off_plan"] == 0
        )
        if cuda:
            graphs_ok = graphs_ok and end_counters["eager_planned"] == 0 and end_counters["replays"] > 0
        checks = {
            "every_frame_equal": not differing,
            "regions_stable": not moved_regions,
            "state_tensors_stable": not moved_state,
            "no_new_graphs_all_on_plan": graphs_ok,
            # on CPU the resident set also moves with the allocator's free lists: reported, not checked
            "no_memory_growth": growth <= 0 if cuda else None,
        }
        if not done:  # nothing stepped yet: nothing checked
            checks = dict.fromkeys(checks)
        return {
            **static,
            "complete": complete,
            "stopped": stopped,
            "frames_done": done,
            "seconds_done": round(done / FRAMES_PER_SECOND, 1),
            "checkpoints": checkpoints,
            "wall_s": round(time.perf_counter() - wall_started, 3),
            "elapsed_s": round(elapsed, 3),
            "ms_per_frame_both_sides": round(elapsed / max(done, 1) * 1000, 3),
            "mismatched_frames": len(differing),
            "first_mismatches": differing[:20],
            "spot_windows": spots,
            "memory": {
                "kind": "torch.cuda.memory_allocated" if cuda else "process resident set",
                "every_frames": args.every,
                "start": samples[0][1],
                "after_first_interval": baseline,
                "end": samples[-1][1],
                "max_after_first_interval": max(steady, default=baseline),
                "growth_after_first_interval": growth,
                "max_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
                "samples": [[frame, value] for frame, value in samples],
            },  # a copy, as of now
            "graphs_start": start_counters,
            "graphs_end": end_counters,
            "data_ptrs": {
                "regions_start": start_regions,
                "regions_end": end_regions,
                "state_moved": sorted(moved_state),
                "regions_moved": sorted(moved_regions),
            },
            "checks": checks,
            "ok": all(value is not False for value in checks.values()),
        }

    def checkpoint(done: int, complete: bool = False, stopped: str | None = None) -> dict:
        nonlocal checkpoints, write_s, last_write
        began = time.perf_counter()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - started
        checkpoints += 1
        result = snapshot(done, elapsed, complete, stopped)
        write_atomic(out, result)
        last_write = time.perf_counter()
        write_s = max(write_s, last_write - began)
        return result

    started = last_write = time.perf_counter()
    result = checkpoint(0)  # setup done: a result exists even if the first frames never finish
    progress = max(1, frames // 10)
    done = 0
    stopped = None
    try:
        with torch.no_grad():
            for t in range(frames):
                stopped = stop.get("reason")
                if stopped:
                    break
                # room for one more frame and the last checkpoint (the slowest so far, twice, and 1 s)
                if deadline is not None and time.perf_counter() + 2 * write_s + 1.0 >= deadline:
                    stopped = "max-wall"
                    break
                frame = codes[:, :, t : t + 1]
                actual = session.step(codes=frame)
                expected = stock.step(frame)
                if actual.shape != expected.shape or actual.dtype != expected.dtype:
                    shape_mismatches.append(t)
                else:  # on the device, no host sync: NaN != NaN, so a NaN is a mismatch as in torch.equal
                    flags[t] = actual.ne(expected).any()
                del actual, expected
                done = t + 1
                if done % args.every == 0 or done == frames:
                    samples.append((done, memory()))
                    at_progress = done % progress == 0
                    if at_progress or done == frames or time.perf_counter() - last_write >= args.checkpoint_s:
                        result = checkpoint(done, complete=done == frames)
                        if at_progress:
                            print(
                                f"  {done}/{frames} frames ({done / FRAMES_PER_SECOND:.0f} s of audio) in "
                                f"{result['elapsed_s']:.0f} s ({result['ms_per_frame_both_sides']:.2f} ms/frame); "
                                f"memory {samples[-1][1] / 2**20:.1f} MiB; mismatches "
                                f"{result['mismatched_frames']}",
                                flush=True,
                            )
    except BaseException as error:  # a stage raised, Ctrl-C: the result so far says where, then the error
        with contextlib.suppress(Exception):  # the device may be gone too; the last checkpoint stays on disk
            checkpoint(done, stopped=f"error: {error!r}")
        raise
    if not result["complete"]:  # stopped early (or no frames at all): the last word
        if samples[-1][0] != done:
            samples.append((done, memory()))
        result = checkpoint(done, complete=done == frames and stopped is None, stopped=stopped)
    return result


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def summary(result: dict) -> str:
    memory = result["memory"]
    lines = [
        f"Mimi long session: {result['frames_done']} of {result['frames']} frames "
        f"({result['seconds_done'] / 60:.1f} of {result['seconds'] / 60:.1f} min of audio) on "
        f"{result['device']}, stock {result['stock_mode']}; {result['elapsed_s']:.0f} s "
        f"({result['ms_per_frame_both_sides']:.2f} ms per frame, both sides)"
    ]
    if not result["complete"]:
        lines.append(
            f"  INCOMPLETE: stopped by {result['stopped'] or '?'} after {result['wall_s']:.0f} s "
            "(the checks below cover the frames done)"
        )
    lines += [
        f"  frames differing from stock: {result['mismatched_frames']} of {result['frames_done']} "
        f"(windows: "
        + ", ".join(
            f"{name} {w['frames'][0]}-{w['frames'][1]} ({w['checked']} checked): {w['mismatches']}"
            for name, w in result["spot_windows"].items()
        )
        + ")",
        f"  {memory['kind']}: start {memory['start'] / 2**20:.1f} MiB, after {memory['every_frames']} frames "
        f"{memory['after_first_interval'] / 2**20:.1f} MiB, end {memory['end'] / 2**20:.1f} MiB, growth after "
        f"that {memory['growth_after_first_interval']} bytes",
        f"  graphs captured: {result['graphs_start']['graphs_captured']} at start, "
        f"{result['graphs_end']['graphs_captured']} at end; replays {result['graphs_end']['replays']}, eager "
        f"{result['graphs_end']['eager_planned']} planned + {result['graphs_end']['eager_off_plan']} off-plan",
        f"  moved: regions {result['data_ptrs']['regions_moved'] or 'none'}, "
        f"state tensors {result['data_ptrs']['state_moved'] or 'none'}",
        "  checks: "
        + ", ".join(
            f"{name} {'-' if value is None else 'ok' if value else 'FAILED'}"
            for name, value in result["checks"].items()
        ),
        f"  {'FAILED' if not result['ok'] else 'OK' if result['complete'] else 'OK so far (incomplete)'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """`started`: the perf_counter the --max-wall budget counts from (default: now)."""
    started = time.perf_counter() if started is None else started
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.command = " ".join(["python scripts/mimi_long_session.py", *argv])
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "mimi_long_session.json")
    stop: dict = {}

    def on_term(signum, _frame):
        stop["reason"] = signal.Signals(signum).name

    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        result = run(args, out, started, stop)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(summary(result))
    print(f"  result: {out}")
    if not result["ok"]:
        return 1
    return 0 if result["complete"] else 2


if __name__ == "__main__":
    sys.exit(main(started=_PROCESS_STARTED))
