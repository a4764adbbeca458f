"""Sessions per GPU through the server: `dsl serve`'s pool behind its websocket front, driven over loopback.

For each configuration the server runs in this process (uvicorn on a thread, the pool's device thread beside
it), with admission's tick budget off so that the sweep finds the limit itself; admission's own limit (the
calibrated tick model, 15 % headroom) is reported beside. For each session count N, growing until one fails:

* direct: N sessions stepped in-process on the pool's device thread, one `Runtime.step_many` a round over the
  sessions (in lockstep: over ceil(N / rows) full groups), outputs to the host: the round time with no server;
* server: N sessions over websockets, all starting together and paced at the tick period (a live stream): the
  sampled sessions (`--sample`) from this process, the others from `--workers` load-generator processes (so
  that the clients do not share the server's interpreter); tick latency from each send to its answer;
* direct again (the two direct passes bracket the server pass: drift shows as their difference).

N passes when every session opened, no tick failed and the p99 tick latency over all sessions is under the
tick period (1 s for MiniCPM-o's chunks, 80 ms for a Mimi frame). The sampled sessions' outputs are then
compared, every tick with `torch.equal`:

* in lanes, with the session's inputs run alone through the tail's stock loop (must be equal);
* in lockstep, with the tail's own batched decode of the session's group (`ServedTail.stock_group`: moshi's
  batched streaming decode, every member's inputs in its row, idle rows zeros; must be equal), and, as a
  separate count, with a batch-1 decode of the session alone (batch-32 kernels need not match it: reported,
  not required to be 0).

The server's overhead at N is its p50 tick latency less the direct p50 round. The server's own numbers over
the pass come from its `/metrics`: its rounds (`server_rounds`, `server_round_mean_s`), its tick latency
(`server_tick_mean_s`, arrival at the pool to outputs on the host) and the part of it before the tick's round
starts (`server_wait_mean_s`: the gather, the rest of a lockstep group, the round before it). With the server
in this process, `latency_guard_open_sessions` is the largest count up to which the pool's p99 tick latency
(`server_tick_p99_s`) stayed within the budget: where admission's latency guard still admits, beside the
model's limit (`admission_capacity_sessions`).

`--workers` is the number of load-generator processes. `--bundle K` drives the sessions in bundles of K, a
websocket each (`/v1/bundle`): one bundle from this process (its first `--sample` sessions recorded), the others
whole from the load-generator processes; `server_whole_group_ticks` counts the lockstep groups a bundle's
tick stepped whole (from `/metrics`, 0 when no bundle filled whole groups). A configuration may sweep lanes
(each count in its own server per lanes value); `--lanes`, `--counts` and `--option K=V` (a tail option, as
`dsl serve --param`) override a configuration's.

    source scripts/device_setup.sh
    python scripts/serve_bench.py --out serve_bench.json                         # every configuration
    python scripts/serve_bench.py --configs moshi-lockstep --out serve_mimi.json
    python scripts/serve_bench.py --configs moshi-lockstep --bundle 32 --gather-ms 12 --counts 512,640,768 \
        --out serve_mimi_bundle32.json                                          # 32 sessions a websocket
    python scripts/serve_bench.py --configs minicpmo45 --option istft=torch --counts 28 --out eager_istft.json
    python scripts/serve_bench.py --configs minicpmo45-lanes --out serve_minicpmo45_lanes.json
    python scripts/serve_bench.py --cpu-dry-run --out /tmp/serve_bench.json           # a smoke test, times mean nothing

`--loadgen-worker` is the mode the script starts its load-generator processes in.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

import attrs
import torch

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.serve.admission import AdmissionRule
from duplexcadence.interpreter.serve.app import make_app
from duplexcadence.interpreter.serve.deadlines import quantile
from duplexcadence.interpreter.serve.loadgen import (
    SessionLoad,
    compare_groups_with_stock,
    compare_with_stock,
    run_load,
)
from duplexcadence.interpreter.serve.modes import unit_count
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.server import ServerThread
from duplexcadence.interpreter.serve.tail import served_tail

HEADROOM = 0.15
SAMPLE_SEEDS = 900_000
"""The sampled sessions' seeds start here (the workers' at 0)."""


@attrs.frozen
class Config:
    name: str
    tail: str
    options: dict[str, str]
    lanes: int
    lockstep: int | None
    counts: tuple[int, ...]
    ticks: int
    description: str
    direct_rounds: int = 20
    lane_sweep: tuple[int, ...] = ()
    """Lanes to run the sweep at, one server each (empty: `lanes` alone)."""


GPU_CONFIGS = {
    "minicpmo45": Config(
        "minicpmo45",
        "minicpmo45",
        {"steps": "10", "prompt": "150", "dtype": "fp32", "istft": "captured"},
        8,
        None,
        (16, 24, 32, 34, 36, 38, 40, 42),
        10,
        "MiniCPM-o 4.5 token2wav, fp32, n=10, P=150, 8 lanes; a tick is a 1 s chunk of 25 tokens",
        direct_rounds=5,
    ),
    "minicpmo45-lanes": Config(
        "minicpmo45-lanes",
        "minicpmo45",
        {"steps": "10", "prompt": "150", "dtype": "fp32", "istft": "captured"},
        4,
        None,
        (32, 34, 36, 38, 40, 42),
        10,
        "MiniCPM-o 4.5 token2wav, fp32, n=10, P=150, at 4 and at 8 lanes; a tick is a 1 s chunk of 25 tokens",
        direct_rounds=3,
        lane_sweep=(4, 8),
    ),
    "moshi-lockstep": Config(
        "moshi-lockstep",
        "moshi",
        {},
        4,
        32,
        (32, 64, 128, 192, 256, 320, 384, 448, 512, 576, 640, 704, 768),
        40,
        "Moshi's Mimi decoder, fp32, lockstep groups of 32 in 4 lanes; a tick is an 80 ms frame",
        direct_rounds=10,
    ),
    "moshi-lanes": Config(
        "moshi-lanes",
        "moshi",
        {},
        4,
        None,
        (8, 16, 32, 48, 64, 80, 96, 112, 128),
        50,
        "Moshi's Mimi decoder, fp32, one session a slot, 4 lanes; a tick is an 80 ms frame",
    ),
}

DRY_CONFIGS = {
    "toy": Config("toy", "toy", {}, 2, None, (1, 2), 3, "the toy tail on the CPU (dry run)"),
    "moshi-lanes": Config("moshi-lanes", "moshi", {}, 2, None, (1, 2), 2, "Mimi, lanes, on the CPU (dry run)"),
    "moshi-lockstep": Config("moshi-lockstep", "moshi", {}, 1, 2, (1, 3), 2, "Mimi, lockstep 2, CPU (dry run)"),
    "toy-lanes": Config(
        "toy-lanes", "toy", {}, 1, None, (1, 2), 2, "toy, at 1 and 2 lanes (dry run)", lane_sweep=(1, 2)
    ),
    "minicpmo45": Config(
        "minicpmo45", "minicpmo45", {"reduced": "1", "prompt": "20", "steps": "2"}, 1, None, (1,), 2, "reduced, CPU"
    ),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


# --- the load-generator worker ---------------------------------------------------------------------


async def wait_for_start_line() -> None:
    """The barrier of a worker: say its sessions are open, then wait for the start time on stdin."""
    print("open", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    delay = float(line) - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


def loadgen_worker(
    url: str, tail: str, options: str, sessions: int, ticks: int, first_seed: int, out: str, bundle: int
) -> None:
    """`--loadgen-worker`: `sessions` paced sessions from `first_seed` (in bundles of `bundle` when over 1),
    their report as JSON to `out`."""
    served = served_tail(tail, params=json.loads(options), device="cpu")
    report = asyncio.run(
        run_load(
            url,
            sessions,
            ticks,
            served.inputs,
            paced=True,
            first_seed=first_seed,
            before_start=wait_for_start_line,
            bundle=bundle,
        )
    )
    with open(out, "w") as handle:
        json.dump(report.to_json(), handle)


# --- one session count -----------------------------------------------------------------------------


async def direct_rounds(pool: SessionPool, sessions: int, rounds: int) -> list[float]:
    """Seconds of `rounds` rounds of `sessions` sessions stepped on the device thread with no server."""
    inputs = pool.served.inputs

    def timed() -> list[float]:
        mode = pool.mode
        units = mode.calibration_units(unit_count(mode, sessions))
        times = []
        try:
            for round_index in range(rounds + 2):  # two warm-up rounds
                ticks = mode.unit_ticks(units, inputs)
                started = time.perf_counter()
                result = mode.step(ticks)
                elapsed = time.perf_counter() - started
                if result.errors:
                    raise RuntimeError(next(iter(result.errors.values())).message)
                if round_index >= 2:
                    times.append(elapsed)
        finally:
            mode.release_calibration(units)
        return times

    return await pool.run_on_device(timed)


async def server_pass(
    url: str, config: Config, sessions: int, sample: int, workers: int, folder: str, bundle: int = 1
) -> tuple[list[SessionLoad], dict]:
    """`sessions` paced sessions over websockets: `sample` recorded here, the rest from worker processes.
    With `bundle` > 1 the sessions go in bundles of that many, a websocket each (`/v1/bundle`): one bundle
    here, `sample` of its sessions recorded, the other bundles spread whole over the worker processes."""
    if not workers:
        here = sessions
    else:
        here = min(bundle if bundle > 1 else sample, sessions)
    rest = sessions - here
    processes, outputs = [], []
    if bundle > 1 and workers:
        whole = math.ceil(rest / bundle)
        counts = [(whole // workers + (i < whole % workers)) * bundle for i in range(workers)]
        per_worker = [max(0, min(count, rest - sum(counts[:i]))) for i, count in enumerate(counts)]
    else:
        per_worker = [rest // workers + (i < rest % workers) for i in range(workers)] if workers else []
    first = 0
    for index, count in enumerate(c for c in per_worker if c):
        path = os.path.join(folder, f"worker-{sessions}-{index}.json")
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--loadgen-worker",
            url,
            config.tail,
            json.dumps(config.options),
            str(count),
            str(config.ticks),
            str(first),
            path,
            str(bundle),
        ]
        first += count
        processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        outputs.append(path)
    served = served_tail(config.tail, params=config.options, device="cpu")

    async def barrier() -> None:
        loop = asyncio.get_running_loop()
        for process in processes:
            assert process.stdout is not None and process.stdin is not None
            line = await loop.run_in_executor(None, process.stdout.readline)
            if line.strip() != "open":
                raise RuntimeError(f"a load-generator process failed to open its sessions ({line!r})")
        start = time.time() + 0.5
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(f"{start}\n")
            process.stdin.flush()
        await asyncio.sleep(max(0.0, start - time.time()))

    report = await run_load(
        url,
        here,
        config.ticks,
        served.inputs,
        paced=True,
        record=min(sample, here),
        first_seed=SAMPLE_SEEDS if workers else 0,
        before_start=barrier,
        bundle=bundle,
    )
    loads = list(report.per_session)
    loop = asyncio.get_running_loop()
    for process, path in zip(processes, outputs):
        # waited for off the event loop: with --server-fronts the pool serving the other processes runs on it
        if await loop.run_in_executor(None, process.wait, 600) != 0:
            raise RuntimeError(f"a load-generator process exited with {process.returncode}")
        with open(path) as handle:
            data = json.load(handle)
        for entry in data["per_session"]:
            loads.append(
                SessionLoad(
                    entry["seed"],
                    entry["ticks"],
                    tuple(entry["errors"]),
                    tuple(entry["latencies_s"]),
                    entry["blocked"],
                    entry["refused"],
                    group=entry.get("group"),
                    row=entry.get("row"),
                )
            )
    return loads, {"here": here, "workers": len(outputs)}


async def measure(
    pool: SessionPool,
    url: str,
    config: Config,
    lanes: int,
    args: argparse.Namespace,
    served: Any,
) -> dict:
    """The sweep of one server."""
    period = pool.tick_period_s
    label = f"{config.name} ({lanes} lanes)"
    rule = pool.rule
    assert rule is not None
    enforced = AdmissionRule(rule.slots, rule.rows, rule.model, period, HEADROOM)  # the bench serves with it off
    admission = enforced.capacity()
    rows, best, guard_open = [], 0, None
    guard_closed = False
    for sessions in args.counts or config.counts:
        rounds = args.direct_rounds or config.direct_rounds
        before = await direct_rounds(pool, sessions, rounds)
        rounds_at = len(pool.round_log)
        ticks_at = len(pool.tick_latencies)
        loop = asyncio.get_running_loop()
        counted = await loop.run_in_executor(None, server_counts, url)
        loads, where = await server_pass(url, config, sessions, args.sample, args.workers, args.folder, args.bundle)
        server_rounds = [seconds for _, seconds in list(pool.round_log)[rounds_at:]]
        server_ticks = list(pool.tick_latencies)[ticks_at:]
        # the server's own rounds, ticks and waits over this pass, from its /metrics
        now = await loop.run_in_executor(None, server_counts, url)
        gained = {name: value - counted[name] for name, value in now.items()}
        server_numbers = {
            "server_rounds": int(gained["round_seconds_count"]),
            "server_whole_group_ticks": int(gained["whole_group_ticks_total"]),
            **{
                f"server_{name}_mean_s": gained[f"{series}_sum"] / gained[f"{series}_count"]
                if gained[f"{series}_count"]
                else None
                for name, series in (
                    ("round", "round_seconds"),
                    ("tick", "tick_latency_seconds"),
                    ("wait", "tick_wait_seconds"),
                )
            },
        }
        server_numbers |= {
            "server_tick_p50_s": quantile(server_ticks, 0.5),
            "server_tick_p99_s": quantile(server_ticks, 0.99),
            "server_round_p50_s": quantile(server_rounds, 0.5),
        }
        after = await direct_rounds(pool, sessions, rounds)
        latencies = [value for load in loads for value in load.latencies]
        errors = sorted({code for load in loads for code in load.errors})
        opened = sum(1 for load in loads if load.refused is None)
        compared = unequal = 0
        for load in loads:
            if load.outputs:
                done, differ = compare_with_stock(served, load)
                compared, unequal = compared + done, unequal + differ
        group_compared = group_unequal = None
        if config.lockstep is not None:
            _, group_compared, group_unequal = compare_groups_with_stock(served, loads, config.lockstep)
        direct = before + after
        p99 = quantile(latencies, 0.99)
        row = {
            "sessions": sessions,
            "opened": opened,
            "errors": errors,
            "ticks": len(latencies),
            "latency_p50_s": quantile(latencies, 0.5),
            "latency_p99_s": p99,
            "latency_max_s": max(latencies) if latencies else None,
            "missed": sum(1 for value in latencies if value > period),
            "blocked_sends": sum(load.blocked for load in loads),
            "direct_round_p50_s": statistics.median(direct) if direct else None,
            "direct_round_p99_s": quantile(direct, 0.99),
            "direct_round_p50_before_s": statistics.median(before) if before else None,
            "direct_round_p50_after_s": statistics.median(after) if after else None,
            "predicted_tick_s": rule.predict(sessions),
            "sampled_sessions": sum(1 for load in loads if load.outputs),
            "sampled_ticks_compared": compared,
            "sampled_ticks_differing": unequal,
            "sampled_ticks_compared_with_group": group_compared,
            "sampled_ticks_differing_from_group": group_unequal,
            **where,
            **server_numbers,
        }
        if row["latency_p50_s"] is not None and row["direct_round_p50_s"] is not None:
            row["overhead_p50_s"] = row["latency_p50_s"] - row["direct_round_p50_s"]
        observed = server_numbers.get("server_tick_p99_s")
        if observed is not None and not guard_closed:
            # the pool's latency guard admits while the p99 of its answered ticks is within the budget
            guard_closed = enforced.latency_over_budget(observed, sessions)
            guard_open = guard_open if guard_closed else sessions
        passed = opened == sessions and not errors and p99 is not None and p99 < period
        row["passed"] = passed
        rows.append(row)
        bits = f"{unequal} of {compared} sampled ticks differ from stock alone"
        if group_compared is not None:
            bits = (
                f"{group_unequal} of {group_compared} sampled ticks differ from the group's batched stock "
                f"({unequal} of {compared} from a batch-1 decode)"
            )
        whole = f", {row['server_whole_group_ticks']} groups stepped whole" if args.bundle > 1 else ""
        log(
            f"{label}: {sessions} sessions: p50 {ms(row['latency_p50_s'])} ms, p99 {ms(p99)} ms of "
            f"{ms(period)} ms; direct round {ms(row['direct_round_p50_s'])} ms; server: {row['server_rounds']} rounds "
            f"of {ms(row['server_round_mean_s'])} ms, a tick waits {ms(row['server_wait_mean_s'])} ms and takes "
            f"{ms(row['server_tick_mean_s'])} ms (means){whole}; {bits}; {'pass' if passed else 'FAIL'}"
        )
        if not passed and not args.cpu_dry_run:
            break
        if passed:
            best = sessions
    return {
        "config": config.name,
        "description": config.description,
        "tail": config.tail,
        "options": config.options,
        "lanes": lanes,
        "lockstep": config.lockstep,
        "tick_period_s": period,
        "gather_s": pool.gather_s,
        "ticks_per_session": config.ticks,
        "tick_model": {
            "fixed_s": rule.model.fixed_s,
            "per_unit_s": rule.model.per_unit_s,
            "unit": rule.model.unit,
            "points": [list(point) for point in rule.model.points],
        },
        "admission_capacity_sessions": admission,
        "headroom": HEADROOM,
        "max_sessions_p99_under_period": best,
        "latency_guard_open_sessions": guard_open,
        "sweep": rows,
    }


def server_counts(url: str) -> dict[str, float]:
    """The sums and counts of the server's round, tick latency and tick wait histograms, and its whole-group
    ticks, from its `/metrics` (by series name less `duplexcadence_`)."""
    address = url.replace("ws://", "http://", 1).removesuffix("/v1/session") + "/metrics"
    with urllib.request.urlopen(address, timeout=60) as response:
        text = response.read().decode()
    names = [
        f"{series}_{part}"
        for series in ("round_seconds", "tick_latency_seconds", "tick_wait_seconds")
        for part in ("sum", "count")
    ]
    counts = {}
    for name in [*names, "whole_group_ticks_total"]:
        found = re.search(rf"^duplexcadence_{name} (\S+)$", text, re.M)
        counts[name] = float(found.group(1)) if found else 0.0
    return counts


def lanes_of(config: Config, args: argparse.Namespace) -> tuple[int, ...]:
    """The lanes a configuration runs at: `--lanes`, else its sweep, else its own."""
    return args.lanes or config.lane_sweep or (config.lanes,)


def run_config(config: Config, lanes: int, args: argparse.Namespace) -> dict:
    served = served_tail(config.tail, params=config.options, device=args.device)
    slots_needed = max(args.counts or config.counts)
    if config.lockstep is None:
        slots = slots_needed
    else:
        slots = math.ceil(slots_needed / config.lockstep)
    pool_config = PoolConfig(
        slots=slots,
        lanes=min(lanes, slots),
        lockstep=config.lockstep,
        headroom=HEADROOM,
        idle_timeout_s=600,
        queue_depth=4,
        enforce_tick_budget=False,
        calibration_repeats=3 if args.cpu_dry_run else 5,
        calibration_warmup=1 if args.cpu_dry_run else 2,
        gather_s=None if args.gather_ms is None else args.gather_ms / 1000,
        freeze_gc=args.freeze_gc,
    )
    pool = SessionPool(served, pool_config)
    started = time.perf_counter()
    with ServerThread(make_app(pool), log_level="warning") as server:
        log(f"{config.name} ({lanes} lanes): ready in {time.perf_counter() - started:.1f} s\n{pool.describe()}")
        result = asyncio.run(measure(pool, server.ws_url(), config, lanes, args, served))
    result["bundle"] = args.bundle
    result["start_seconds"] = time.perf_counter() - started
    del pool, served
    gc.collect()  # runtimes hold their CUDA graphs in reference cycles: free them before the next server
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| configuration | sessions at p99 < period | admission's limit | latency guard still admits at | p99 there "
        "| sampled ticks differing from the reference | from a batch-1 decode (lockstep) | overhead p50 (server - "
        "step_many) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        if "skipped" in result:
            lines.append(f"| {result['config']} | skipped: {result['skipped']} | | | | | | |")
            continue
        label = result["config"] if not result.get("lane_sweep") else f"{result['config']} ({result['lanes']} lanes)"
        if result.get("bundle", 1) > 1:
            label = f"{label}, bundles of {result['bundle']}"
        best = result["max_sessions_p99_under_period"]
        row = next((r for r in result["sweep"] if r["sessions"] == best), None)
        differing = sum(r["sampled_ticks_differing"] for r in result["sweep"])
        compared = sum(r["sampled_ticks_compared"] for r in result["sweep"])
        if result.get("lockstep"):
            reference = (
                f"{sum(r['sampled_ticks_differing_from_group'] for r in result['sweep'])} of "
                f"{sum(r['sampled_ticks_compared_with_group'] for r in result['sweep'])} (the group's batched stock)"
            )
            batch1 = f"{differing} of {compared}"
        else:
            reference, batch1 = f"{differing} of {compared} (stock alone)", "-"
        lines.append(
            f"| {label} | {best} | {result['admission_capacity_sessions']} | "
            f"{result.get('latency_guard_open_sessions') or '-'} | "
            f"{ms(row['latency_p99_s']) if row else '-'} of {ms(result['tick_period_s'])} ms | {reference} | {batch1} | "
            f"{ms(row.get('overhead_p50_s')) if row else '-'} ms |"
        )
    return "\n".join(lines)


def event_loop() -> str:
    """The event loop uvicorn runs (it takes uvloop where it is installed)."""
    return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


def counts(text: str) -> tuple[int, ...]:
    values = tuple(int(part) for part in text.split(","))
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers from 1, comma-separated, not {text!r}")
    return values


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--loadgen-worker":
        url, tail, options, sessions, ticks, first, out, bundle = sys.argv[2:10]
        loadgen_worker(url, tail, options, int(sessions), int(ticks), int(first), out, int(bundle))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=None, help=f"comma-separated, of {', '.join(GPU_CONFIGS)} (default all)")
    parser.add_argument("--workers", type=int, default=None, help="load-generator processes (0: all in this process)")
    parser.add_argument(
        "--no-freeze-gc",
        dest="freeze_gc",
        action="store_false",
        help="the pools leave what they loaded in the garbage collector's walk (PoolConfig.freeze_gc=False)",
    )
    parser.add_argument(
        "--bundle",
        type=int,
        default=1,
        metavar="K",
        help="drive the sessions in bundles of K, a websocket each (/v1/bundle), not a websocket a session",
    )
    parser.add_argument("--sample", type=int, default=2, help="sessions recorded and compared with stock per count")
    parser.add_argument(
        "--direct-rounds", type=int, default=None, help="timed rounds per direct pass (default: the configuration's)"
    )
    parser.add_argument(
        "--gather-ms", type=float, default=None, help="the pool's gather time (default: 5%% of the period)"
    )
    parser.add_argument(
        "--lanes", type=counts, default=None, help="lanes to run at, comma-separated (default: each configuration's)"
    )
    parser.add_argument(
        "--counts", type=counts, default=None, help="session counts, comma-separated (default: each configuration's)"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="K=V",
        help="a tail option over the configuration's (the serving adapter's --param, e.g. istft=captured)",
    )
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help="CPU, tiny counts: checks the script (times mean nothing)"
    )
    default_out = os.path.join(os.environ["OUT"], "serve_bench.json") if os.environ.get("OUT") else "serve_bench.json"
    parser.add_argument("--out", default=default_out)
    args = parser.parse_args()
    if args.cpu_dry_run:
        args.device, configs = "cpu", DRY_CONFIGS
        args.workers = 0 if args.workers is None else args.workers
        args.direct_rounds = args.direct_rounds or 2
    elif not torch.cuda.is_available():
        print("needs a CUDA device (or --cpu-dry-run)", file=sys.stderr)
        return 2
    else:
        args.device, configs = "cuda", GPU_CONFIGS
        args.workers = min(8, max(1, (os.cpu_count() or 2) // 2)) if args.workers is None else args.workers
    chosen = list(configs) if not args.configs else args.configs.split(",")
    unknown = [name for name in chosen if name not in configs]
    if unknown:
        print(f"unknown configuration(s) {', '.join(unknown)}; they are {', '.join(configs)}", file=sys.stderr)
        return 2
    if args.bundle < 1:
        print(f"--bundle must be at least 1, not {args.bundle}", file=sys.stderr)
        return 2
    options = {}
    for option in args.option:
        key, sep, value = option.partition("=")
        if not sep or not key:
            print(f"--option {option!r} is not K=V", file=sys.stderr)
            return 2
        options[key] = value
    args.folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(args.folder, exist_ok=True)
    payload: dict = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "device": args.device,
        "workers": args.workers,
        "bundle": args.bundle,
        "freeze_gc": args.freeze_gc,
        "event_loop": event_loop(),
        "command": " ".join(sys.argv),
        "results": [],
    }
    started = time.perf_counter()
    for name in chosen:
        config = attrs.evolve(configs[name], options={**configs[name].options, **options})
        tail = tails.get(config.tail)
        if tail.missing():
            payload["results"].append({"config": name, "skipped": f"needs {', '.join(tail.missing())}"})
            log(f"{name}: skipped (needs {', '.join(tail.missing())})")
            continue
        try:
            for lanes in lanes_of(config, args):
                result = run_config(config, lanes, args)
                result["lane_sweep"] = len(lanes_of(config, args)) > 1 or bool(config.lane_sweep)
                payload["results"].append(result)
        except ImportError as error:  # an optional package a tail imports only when it runs
            payload["results"].append({"config": name, "skipped": f"{type(error).__name__}: {error}"})
            log(f"{name}: skipped ({error})")
    payload["wall_seconds"] = time.perf_counter() - started
    with open(args.out, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
    log(f"wrote {args.out}")
    print(table(payload["results"]))
    differ = sum(
        row["sampled_ticks_differing_from_group"] if result.get("lockstep") else row["sampled_ticks_differing"]
        for result in payload["results"]
        if "sweep" in result
        for row in result["sweep"]
    )
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
