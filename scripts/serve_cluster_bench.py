"""Sessions across GPUs with Ray Serve: how many sessions 1, 2 and 4 replicas (one per GPU) keep at the cadence,
how a new session is placed, and what a replica's death and a drain do to the sessions.

    python scripts/serve_cluster_bench.py --tail moshi --gpus 1,2,4 --out cluster_moshi.json
    python scripts/serve_cluster_bench.py --tail minicpmo45 --gpus 1,2,4 --out cluster_minicpmo45.json
    python scripts/serve_cluster_bench.py --device cpu --tail toy --gpus 1,2 --ray-cpus 2 --out /tmp/cluster.json

A local Ray starts (`--ray-cpus` CPUs, every GPU of the machine), then for each count N of `--gpus` the Serve
application runs N replicas, each owning a `SessionPool` of `--slots` slots in `--lanes` lanes on its own GPU
(admission off: the search finds the limit). The load generator drives sessions over loopback through the
Serve proxy, each sending one tick per tick period (paced, as a live stream). A count of sessions passes when
every session opens, no tick fails and the p99 tick latency (send to answer) is under `--deadline` (default
the tick period: 1 s for MiniCPM-o's chunk, 80 ms for a Mimi frame). A search of at most `--max-runs` loads
per N, starting from the pools' calibrated prediction, finds the largest count that passes; the scaling
ratio is that count over the count at the first N. The sampled sessions (`--verify` per replica) of the
passing load are run alone through the tail's stock loop here, every output compared with `torch.equal`.

At the largest N (2 or more replicas) two more loads run at the passing count: in the first, the replica
holding the most sessions is killed (`ray.kill`) a third into the run: its sessions must fail with
`replica-lost` naming it, the others finish every tick with their p99 under the deadline and their outputs
equal to stock. In the second, a replica is drained a third into the run and a second load of new sessions
starts: none of them may land on the drained replica, and its own sessions finish every tick.

Writes the JSON to `--out` and prints a short table last. `--device cpu` is the dry run the CPU tests run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import platform
import sys
import time
from typing import Any

import torch

from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, DuplexCluster, start
from duplexcadence.interpreter.serve.cluster.replica import PoolSpec
from duplexcadence.interpreter.serve.loadgen import LoadReport, SessionLoad, compare_with_stock, quantile, run_load
from duplexcadence.interpreter.serve.pool import PoolConfig
from duplexcadence.interpreter.serve.tail import ServedTail, served_tail

DEFAULTS = {  # slots, lanes, ticks per load
    "moshi": (48, 4, 125),
    "minicpmo45": (24, 4, 12),
    "toy": (3, 1, 12),
}


def p99(loads: list[SessionLoad]) -> float | None:
    return quantile([value for load in loads for value in load.latencies], 0.99)


def per_replica(loads: list[SessionLoad]) -> dict[str, int]:
    return dict(sorted(collections.Counter(load.replica or "-" for load in loads if load.refused is None).items()))


def passes(report: LoadReport, sessions: int, deadline: float) -> bool:
    latency = report.latency_p99_s
    return report.opened == sessions and not report.errors and latency is not None and latency < deadline


def sampled(loads: list[SessionLoad], per: int) -> list[SessionLoad]:
    """Up to `per` recorded sessions of each replica."""
    taken: dict[str | None, int] = collections.Counter()
    chosen = []
    for load in loads:
        if load.outputs and taken[load.replica] < per:
            taken[load.replica] += 1
            chosen.append(load)
    return chosen


def compare(stock: ServedTail, loads: list[SessionLoad]) -> dict[str, Any]:
    compared = unequal = 0
    for load in loads:
        done, differ = compare_with_stock(stock, load)
        compared += done
        unequal += differ
    return {"sessions": len(loads), "ticks": compared, "unequal": unequal, "seeds": [load.seed for load in loads]}


def load_json(report: LoadReport, deadline: float) -> dict[str, Any]:
    return {
        "sessions": report.sessions,
        "opened": report.opened,
        "refused": report.refused,
        "ticks": report.ticks,
        "errors": report.errors,
        "p50_ms": None if report.latency_p50_s is None else report.latency_p50_s * 1000,
        "p99_ms": None if report.latency_p99_s is None else report.latency_p99_s * 1000,
        "max_ms": None if report.latency_max_s is None else report.latency_max_s * 1000,
        "missed": report.missed,
        "per_replica": per_replica(list(report.per_session)),
        "passes": passes(report, report.sessions, deadline),
    }


def predicted_sessions(cluster: DuplexCluster, deadline: float) -> int:
    """The sessions the replicas' calibrated tick models predict under the deadline, summed."""
    total = 0
    for stats in cluster.capacities().values():
        model, units = stats["model"], 0
        for count in range(1, stats["slots"] + 1):
            if model["fixed_s"] + model["per_unit_s"] * count > deadline:
                break
            units = count
        total += units
    return max(total, 1)


async def one_load(cluster: DuplexCluster, served: ServedTail, sessions: int, ticks: int, seed: int) -> LoadReport:
    return await run_load(cluster.ws_url, sessions, ticks, served.inputs, paced=True, record=sessions, first_seed=seed)


def search(cluster, served, replicas, slots, ticks, deadline, max_runs, seeds) -> tuple[int, list, LoadReport | None]:
    """The largest session count that passes (0: none tried passed), the runs, and the passing run's report."""
    most = replicas * slots
    lo, hi = 0, most + 1
    probe = min(predicted_sessions(cluster, deadline), most)
    runs, best = [], None
    for _ in range(max_runs):
        report = asyncio.run(one_load(cluster, served, probe, ticks, next(seeds)))
        ok = passes(report, probe, deadline)
        runs.append(load_json(report, deadline))
        print(f"  {replicas} replica(s), {probe} sessions: p99 {runs[-1]['p99_ms']} ms, passes {ok}", flush=True)
        if ok:
            lo, best = probe, report
        else:
            hi = probe
        if hi - lo <= max(1, lo // 32):
            break
        probe = (lo + hi) // 2 if hi <= most else min(most, max(probe + 1, math.ceil(probe * 1.25)))
        if probe in (lo, hi):
            break
    return lo, runs, best


async def kill_during_load(cluster, served, sessions, ticks, period, seed) -> tuple[str, LoadReport]:
    """A paced load; a third into it, the replica with the most sessions is killed."""
    load = asyncio.create_task(one_load(cluster, served, sessions, ticks, seed))
    await asyncio.sleep(period * ticks / 3)
    counts = {name: stats["sessions"] for name, stats in (await asyncio.to_thread(cluster.capacities)).items()}
    victim = max(counts, key=lambda name: counts[name])
    await asyncio.to_thread(cluster.kill, victim)
    return victim, await load


async def drain_during_load(
    cluster, served, sessions, ticks, period, seed
) -> tuple[str, LoadReport, LoadReport | None]:
    """A paced load; a third into it one of its replicas is drained and a second load of new sessions starts."""
    first = asyncio.create_task(one_load(cluster, served, sessions, ticks, seed))
    await asyncio.sleep(period * ticks / 3)
    counts = {name: stats["sessions"] for name, stats in (await asyncio.to_thread(cluster.capacities)).items()}
    drained = max(counts, key=lambda name: counts[name])
    await asyncio.to_thread(cluster.drain, drained)
    elsewhere = sum(
        stats["free"] for name, stats in (await asyncio.to_thread(cluster.capacities)).items() if name != drained
    )
    later = min(max(1, sessions // len(counts)), elsewhere)
    second = await one_load(cluster, served, later, max(1, ticks // 3), seed + sessions) if later else None
    return drained, await first, second


def fault_runs(cluster, served, stock, sessions, ticks, period, deadline, verify, seeds) -> dict[str, Any]:
    victim, killed = asyncio.run(kill_during_load(cluster, served, sessions, ticks, period, next(seeds)))
    lost = [load for load in killed.per_session if load.replica == victim]
    kept = [load for load in killed.per_session if load.replica != victim and load.refused is None]
    kill = {
        "victim": victim,
        "load": load_json(killed, deadline),
        "victim_sessions": len(lost),
        "victim_errors": dict(collections.Counter(code for load in lost for code in load.errors)),
        "survivors": len(kept),
        "survivors_complete": sum(1 for load in kept if load.ticks == ticks and not load.errors),
        "survivors_p99_ms": None if p99(kept) is None else p99(kept) * 1000,
        "survivors_p99_under_deadline": p99(kept) is not None and p99(kept) < deadline,
        "verify_survivors": compare(stock, sampled(kept, verify)),
        "verify_victims_before_loss": compare(stock, sampled(lost, verify)),
    }
    cluster.wait_serving(timeout_s=600)  # the victim's replacement
    replicas = len(cluster.capacities())
    half = max(replicas, sessions // 2)  # room elsewhere for the new sessions
    drained, first, second = asyncio.run(drain_during_load(cluster, served, half, ticks, period, next(seeds)))
    on_drained = [load for load in first.per_session if load.replica == drained]
    drain = {
        "drained": drained,
        "load": load_json(first, deadline),
        "drained_sessions": len(on_drained),
        "drained_complete": sum(1 for load in on_drained if load.ticks == ticks and not load.errors),
        "new_load": load_json(second, deadline) if second else None,  # None: no free slot elsewhere
        "new_on_drained": sum(1 for load in second.per_session if load.replica == drained) if second else 0,
        "verify_drained": compare(stock, sampled(on_drained, verify)),
    }
    return {"kill": kill, "drain": drain}


def environment(device: str) -> dict[str, Any]:
    import ray

    found = {"python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__}
    if device == "cuda":
        found["gpus"] = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
    return found


def table(result: dict[str, Any]) -> list[str]:
    lines = [f"{result['tail']} on {result['device']}, deadline {result['deadline_ms']:g} ms (p99 tick latency)"]
    lines.append("GPUs | sessions at p99 < deadline | ratio | p99 ms | per replica | sampled ticks unequal")
    for row in result["counts"]:
        passing = row["passing"] or {}
        latency = "-" if passing.get("p99_ms") is None else f"{passing['p99_ms']:.1f}"
        counts = "/".join(str(count) for count in passing.get("per_replica", {}).values()) or "-"
        lines.append(
            f"{row['replicas']:>4} | {row['sessions']:>26} | {row['ratio']!s:>5} | {latency:>6} | {counts:>11} | "
            f"{row['verify']['unequal']} of {row['verify']['ticks']}"
        )
    faults = result.get("faults")
    if faults:
        kill, drain = faults["kill"], faults["drain"]
        lines.append(
            f"kill {kill['victim']}: {kill['victim_sessions']} sessions lost {kill['victim_errors']}; "
            f"{kill['survivors_complete']} of {kill['survivors']} others complete, p99 {kill['survivors_p99_ms']:.1f} ms, "
            f"unequal {kill['verify_survivors']['unequal']} of {kill['verify_survivors']['ticks']}"
        )
        lines.append(
            f"drain {drain['drained']}: {drain['new_on_drained']} of {(drain['new_load'] or {}).get('opened', 0)} new "
            "sessions there; "
            f"{drain['drained_complete']} of {drain['drained_sessions']} of its sessions complete, "
            f"unequal {drain['verify_drained']['unequal']} of {drain['verify_drained']['ticks']}"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tail", default="moshi", help="a registered tail with a serving adapter (moshi)")
    parser.add_argument("--param", action="append", default=[], metavar="K=V", help="the tail's options")
    parser.add_argument("--gpus", default="1,2,4", help="replica counts, one GPU each (1,2,4)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--slots", type=int, default=None, help="session slots per replica (per tail default)")
    parser.add_argument("--lanes", type=int, default=None, help="lanes per replica (per tail default)")
    parser.add_argument("--ticks", type=int, default=None, help="ticks per session and load (per tail default)")
    parser.add_argument("--deadline", type=float, default=None, metavar="S", help="p99 bound (the tick period)")
    parser.add_argument("--max-runs", type=int, default=5, help="loads per replica count in the search (5)")
    parser.add_argument("--verify", type=int, default=2, help="sessions per replica compared with stock (2)")
    parser.add_argument("--no-faults", action="store_true", help="skip the kill and the drain")
    parser.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray (default: every core)")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--out", required=True, help="the JSON to write")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(part) for part in args.gpus.split(",")]
    slots, lanes, ticks = DEFAULTS.get(args.tail, (8, 1, 20))
    slots, lanes, ticks = args.slots or slots, args.lanes or lanes, args.ticks or ticks
    params = dict(pair.split("=", 1) for pair in args.param)
    if args.device == "cuda" and torch.cuda.device_count() < max(counts):
        raise SystemExit(f"--gpus {args.gpus} needs {max(counts)} GPUs; this machine has {torch.cuda.device_count()}")
    cpu = args.device == "cpu"
    if cpu:
        torch.set_num_threads(1)  # as the replicas: CPU kernels sum in another order with another thread count
    served = served_tail(args.tail, params=params, device=args.device)  # inputs for the load generator
    stock = served_tail(args.tail, params=params, device="cpu" if cpu else "cuda")
    config = PoolConfig(slots=slots, lanes=lanes, enforce_tick_budget=False, idle_timeout_s=600)
    spec = PoolSpec(args.tail, None, params, config, cpu_threads=1 if cpu else None)
    port = 0  # a free one; the calls that scale the application keep it
    seeds = iter(range(0, 10**9, 1000))
    result: dict[str, Any] = {"tail": args.tail, "device": args.device, "slots": slots, "lanes": lanes, "ticks": ticks}
    result["command"] = " ".join([sys.executable, *sys.argv])
    cluster = None
    try:
        for replicas in counts:
            cluster_config = ClusterConfig(
                replicas=replicas,
                port=port,
                gpus_per_replica=0.0 if cpu else 1.0,
                cpus_per_replica=args.cpus_per_replica,
                local_cpus=args.ray_cpus,
                drain_timeout_s=60,
            )
            started = time.perf_counter()
            cluster = start(spec, cluster_config)  # the second call scales the running application
            port = cluster.config.port
            capacities = cluster.capacities()
            period = next(iter(capacities.values()))["tick_period_s"]
            deadline = args.deadline or period
            result.update(deadline_ms=deadline * 1000, tick_period_ms=period * 1000)
            print(f"{replicas} replica(s) serving after {time.perf_counter() - started:.0f} s", flush=True)
            sessions, runs, best = search(cluster, served, replicas, slots, ticks, deadline, args.max_runs, seeds)
            verify = compare(stock, sampled(list(best.per_session), args.verify)) if best else compare(stock, [])
            row = {"replicas": replicas, "sessions": sessions, "runs": runs, "verify": verify}
            row["passing"] = load_json(best, deadline) if best else None
            row["calibrated"] = {name: stats["model"] for name, stats in capacities.items()}
            result.setdefault("counts", []).append(row)
        first = result["counts"][0]["sessions"]
        for row in result["counts"]:
            row["ratio"] = round(row["sessions"] / first, 2) if first else None
        if not args.no_faults and cluster is not None and counts[-1] >= 2:
            sessions = max(result["counts"][-1]["sessions"], counts[-1])
            result["faults"] = fault_runs(cluster, served, stock, sessions, ticks, period, deadline, args.verify, seeds)
        result["environment"] = environment(args.device)
    finally:
        import ray

        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        if ray.is_initialized():
            ray.shutdown()
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1, sort_keys=True)
    for line in table(result):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
