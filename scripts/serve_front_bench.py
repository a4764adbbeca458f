"""The server's front on its own: frames per second and server CPU per frame, with almost no device work.

The tail is a Mimi-shaped null decoder (a `.clock` written here: codes i64[B, 8, 1] in, pcm f32[B, 1, 1920]
out, one state row per session, a hook that adds and broadcasts): the pool, the lockstep or lanes mode, the
runtime's `step_many` and the websocket front all run as they do for Mimi, with the frames Mimi's have, but
a round's compute is microseconds (`--unit-ms` adds that long a firing, waited without the GIL, as a GPU's
work is waited for). The server runs in this process (uvicorn on a thread, the pool's device thread beside
it); `--workers` load-generator processes drive the sessions, unpaced (each sends its next tick once the last
is answered: the rate is the front's own limit) or `--paced` (a tick every 80 ms, as live streams: the
latency is what counts). Measured over the run:

* frames/s: ticks answered per second over all sessions;
* server µs per frame: this process's CPU time per tick answered, and the part of it on the event loop's
  thread and on the device thread (read from /proc);
* client latency p50 / p99 (send to answer).

On a shared machine compare runs of one invocation (ratios), not absolute numbers.

    python scripts/serve_front_bench.py --mode lockstep --sessions 64,128 --out /tmp/front.json
    python scripts/serve_front_bench.py --mode lanes --sessions 16 --workers 2 --out /tmp/front.json
    python scripts/serve_front_bench.py --mode lockstep --sessions 128 --loop asyncio   # against uvloop
    python scripts/serve_front_bench.py --mode lockstep --sessions 256 --bundle 32         # 32 sessions a websocket
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.app import make_app
from duplexcadence.interpreter.serve.deadlines import quantile
from duplexcadence.interpreter.serve.loadgen import run_load
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ServerThread
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

NULL_CLOCK = """# A Mimi-shaped null decoder: Mimi's frames, one state row per session, almost no compute.
cadence 1 s
param B = 1
clock frame = 12.5 Hz
clock sample = frame * 1920
region codes : i64[B, 8, time] on frame input
region pcm : f32[B, 1, time] on sample output
region level : f32[B, 1] start zeros
stage decode on frame {
    hook decode
    read codes
    update level
    write pcm +1920
}
"""


UNIT_SECONDS = 0.0
"""Seconds a firing of the null decoder waits (without the GIL): `--unit-ms`."""


def decode(model, codes: torch.Tensor, level: torch.Tensor):
    if UNIT_SECONDS:
        time.sleep(UNIT_SECONDS)
    level = level + codes[:, 0, :].to(level.dtype)
    return level, level.unsqueeze(-1).expand(-1, 1, 1920)


def codes(seed: int, tick: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + tick)
    return {"codes": torch.randint(0, 2048, (1, 8, 1), generator=generator)}


def null_tail(folder: str) -> ServedTail:
    path = Path(folder) / "null_mimi.clock"
    path.write_text(NULL_CLOCK)

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        import duplexcadence

        runtime = duplexcadence.Runtime.load(
            path,
            torch.nn.Module(),
            params={"B": rows or 1},
            device="cpu",
            hooks={"decode": decode},
            sessions=sessions,
            lanes=lanes,
        )
        return LoadedTail(runtime)

    return ServedTail("null-mimi", load, device="cpu", inputs=codes)


def thread_cpu_s(native_id: int | None) -> float:
    """User + system CPU seconds of one thread of this process (0 when unknown)."""
    if native_id is None:
        return 0.0
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_id(name_prefix: str) -> int | None:
    return next((t.native_id for t in threading.enumerate() if t.name.startswith(name_prefix)), None)


def worker(url: str, sessions: int, ticks: int, first_seed: int, out: str, paced: bool, bundle: int) -> None:
    async def barrier() -> None:
        print("open", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        delay = float(line) - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    report = asyncio.run(
        run_load(url, sessions, ticks, codes, paced=paced, first_seed=first_seed, before_start=barrier, bundle=bundle)
    )
    Path(out).write_text(json.dumps(report.to_json()))


def drive(
    url: str,
    sessions: int,
    ticks: int,
    workers: int,
    folder: str,
    paced: bool,
    loop_name: str = "duplexcadence-uvicorn",
    bundle: int = 1,
) -> tuple[list[float], float, dict]:
    """Run `sessions` sessions from `workers` processes (in bundles of `bundle`, whole ones to each process);
    their latencies, the wall time, CPU use."""
    whole = math.ceil(sessions / bundle)
    per_worker = [min(sessions, (whole // workers + (i < whole % workers)) * bundle) for i in range(workers)]
    per_worker = [max(0, min(count, sessions - sum(per_worker[:i]))) for i, count in enumerate(per_worker)]
    processes, outputs, first = [], [], 0
    for index, count in enumerate(c for c in per_worker if c):
        out = os.path.join(folder, f"front-{sessions}-{index}.json")
        command = [sys.executable, os.path.abspath(__file__), "--worker", url, str(count), str(ticks), str(first), out]
        command += ["paced" if paced else "unpaced", str(bundle)]
        processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        outputs.append(out)
        first += count
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "open":
            raise RuntimeError("a load-generator process failed to open its sessions")
    loop_thread, device_thread = thread_id(loop_name), thread_id("duplexcadence-device")
    start = time.time() + 0.3
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(f"{start}\n")
        process.stdin.flush()
    time.sleep(max(0.0, start - time.time()))
    cpu = (time.process_time(), thread_cpu_s(loop_thread), thread_cpu_s(device_thread))
    began = time.perf_counter()
    latencies: list[float] = []
    ended = []
    for process, out in zip(processes, outputs):
        if process.wait(timeout=900) != 0:
            raise RuntimeError(f"a load-generator process exited with {process.returncode}")
        data = json.loads(Path(out).read_text())
        ended.append(began + data["wall_s"])
        for entry in data["per_session"]:
            latencies += entry["latencies_s"]
        if data["errors"] or data["refused"]:
            raise RuntimeError(f"sessions failed: errors {data['errors']}, refused {data['refused']}")
    wall = max(ended) - began
    used = {
        "process_s": time.process_time() - cpu[0],
        "loop_s": thread_cpu_s(loop_thread) - cpu[1],
        "device_s": thread_cpu_s(device_thread) - cpu[2],
    }
    return latencies, wall, used


def measure(args: argparse.Namespace, sessions: int, folder: str) -> dict:
    served = null_tail(folder)
    rows = args.rows if args.mode == "lockstep" else None
    slots = math.ceil(sessions / rows) if rows else sessions
    pool = SessionPool(
        served,
        PoolConfig(
            slots=slots,
            lanes=min(args.lanes, slots),
            lockstep=rows,
            tick_model=TickModel(0.0001, 0.0001),
            enforce_tick_budget=False,
            idle_timeout_s=600,
            gather_s=None if args.gather_ms is None else args.gather_ms / 1000,
            pace=None,  # unpaced sessions measure the front's own limit
        ),
    )
    with ServerThread(make_app(pool), log_level="warning", loop=args.loop) as server:
        latencies, wall, used = drive(
            server.ws_url(), sessions, args.ticks, args.workers, folder, args.paced, bundle=args.bundle
        )
    rounds = [seconds for _, seconds in pool.round_log]
    frames = len(latencies)
    return {
        "sessions": sessions,
        "mode": args.mode,
        "rows": rows,
        "paced": args.paced,
        "unit_ms": args.unit_ms,
        "missed": sum(1 for value in latencies if value > 0.08),
        "frames": frames,
        "wall_s": wall,
        "frames_per_s": frames / wall,
        "server_us_per_frame": 1e6 * used["process_s"] / frames,
        "loop_us_per_frame": 1e6 * used["loop_s"] / frames,
        "device_thread_us_per_frame": 1e6 * used["device_s"] / frames,
        "rounds": len(rounds),
        "round_p50_s": quantile(rounds, 0.5),
        "latency_p50_s": quantile(latencies, 0.5),
        "latency_p99_s": quantile(latencies, 0.99),
        "event_loop": event_loop_name(args.loop),
    }


def event_loop_name(loop: str) -> str:
    """The event loop uvicorn runs for `--loop` ("auto": uvloop where it is installed)."""
    if loop != "auto":
        return loop
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, sessions, ticks, first, out, pacing, bundle = sys.argv[2:9]
        worker(url, int(sessions), int(ticks), int(first), out, pacing == "paced", int(bundle))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("lockstep", "lanes"), default="lockstep")
    parser.add_argument("--rows", type=int, default=32, help="rows of a lockstep group (32)")
    parser.add_argument("--lanes", type=int, default=4, help="lanes (4)")
    parser.add_argument(
        "--sessions", type=lambda text: [int(n) for n in text.split(",")], default=[64], help="session counts (64)"
    )
    parser.add_argument("--ticks", type=int, default=100, help="ticks per session (100)")
    parser.add_argument("--workers", type=int, default=2, help="load-generator processes (2)")
    parser.add_argument("--gather-ms", type=float, default=None, help="the pool's gather time (5%% of the period)")
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="uvicorn's event loop")
    parser.add_argument("--paced", action="store_true", help="a tick every 80 ms per session (default: unpaced)")
    parser.add_argument("--unit-ms", type=float, default=0.0, help="device time a firing waits, GIL released (0)")
    parser.add_argument("--bundle", type=int, default=1, help="sessions per websocket (/v1/bundle; 1: one each)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.bundle < 1:
        parser.error(f"--bundle takes 1 or more sessions a websocket, not {args.bundle}")
    global UNIT_SECONDS
    UNIT_SECONDS = args.unit_ms / 1000
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for sessions in args.sessions:
            rows.append(measure(args, sessions, folder))
            row = rows[-1]
            print(
                f"{row['mode']} {row['sessions']} sessions: {row['frames_per_s']:.0f} frames/s, server "
                f"{row['server_us_per_frame']:.0f} us/frame (loop {row['loop_us_per_frame']:.0f}, device thread "
                f"{row['device_thread_us_per_frame']:.0f}), p50 {1000 * row['latency_p50_s']:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print(
        "| mode | sessions | paced | unit ms | frames/s | server µs/frame | loop µs/frame | device thread µs/frame "
        "| p50 ms | p99 ms | over 80 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(
            f"| {row['mode']} | {row['sessions']} | {'yes' if row['paced'] else 'no'} | {row['unit_ms']:g} | "
            f"{row['frames_per_s']:.0f} | {row['server_us_per_frame']:.0f} | "
            f"{row['loop_us_per_frame']:.0f} | {row['device_thread_us_per_frame']:.0f} | "
            f"{1000 * row['latency_p50_s']:.1f} | {1000 * row['latency_p99_s']:.1f} | {row['missed']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
