"""Where the GPU idles inside one Mimi frame: DuplexCadence's step against moshi's whole-step graph (diagnostic).

docs/benchmarks.md (Moshi) reports our synced step at 1.79 ms against 1.58 ms for moshi's `CUDAGraphed`
around the whole `decode`, with the same kernels and about the same kernel time. This script profiles
`--frames` steady frames of each side with `torch.profiler` (CUDA activity; kernels inside graph
replays are traced by CUPTI) and reports, per frame:

* kernels and memcpy/memset operations, and their summed GPU time;
* the span from the frame's first GPU operation to its last, and the idle time inside it (span minus
  the union of the operations' intervals);
* the largest gaps between consecutive GPU operations, with the operations on both sides;
* in the JSON only, every operation in order with the gap before it (`sequence`), for comparing two
  builds position by position (the sixth session found the slow state so: 0.42 against 0.10 us at
  nearly every kernel boundary);

then the operations whose count or summed time differ between the two sides' median frames. (Its first
run found the in-graph gap: 17 more copy kernels and 16 unvectorised adds on our side, from a
channel-major latent between the stages; docs/benchmarks.md.)

Each frame is profiled on its own (one profiler session around one step and its synchronisation), so
the profiler's start and stop stay outside the frame's GPU timeline. JSON to --out; a table to stdout.

    source scripts/device_setup.sh
    python scripts/mimi_graph_trace.py --frames 20 --out $OUT/mimi_graph_trace.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch


def gpu_operations(profile) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, memcpy and memset on the device, in start order."""
    operations = []
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.time_range.end > event.time_range.start:
            operations.append((event.time_range.start, event.time_range.end, event.name))
    return sorted(operations)


def frame_summary(operations: list[tuple[float, float, str]], top: int) -> dict:
    """Counts, busy time, span, idle time and the largest gaps of one frame's GPU operations."""
    if not operations:
        return {"operations": 0}
    busy = 0.0
    covered_until = operations[0][0]
    gaps = []
    for index, (start, end, name) in enumerate(operations):
        if start > covered_until and index:
            gaps.append((start - covered_until, operations[index - 1][2], name))
        busy += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    span = covered_until - operations[0][0]
    kinds = {"memcpy": 0, "memset": 0, "kernel": 0}
    for _, _, name in operations:
        lowered = name.lower()
        kinds["memcpy" if "memcpy" in lowered else "memset" if "memset" in lowered else "kernel"] += 1
    gaps.sort(reverse=True)
    by_name: dict[str, list[float]] = {}
    for start, end, name in operations:
        entry = by_name.setdefault(name[:160], [0, 0.0])
        entry[0] += 1
        entry[1] += end - start
    # in order, each operation with the gap since the previous one ended (0 for the first)
    sequence = [[0.0, operations[0][2][:60]]]
    sequence += [
        [round(start - operations[index][1], 2), name[:60]] for index, (start, _, name) in enumerate(operations[1:])
    ]
    return {
        "operations": len(operations),
        **kinds,
        "by_name": by_name,
        "sequence": sequence,
        "busy_us": busy,
        "span_us": span,
        "idle_us": span - busy,
        "largest_gaps": [
            {"us": round(gap, 2), "after": before[:80], "before": after[:80]} for gap, before, after in gaps[:top]
        ],
    }


def trace(step, frames: int, warmup: int, top: int) -> list[dict]:
    """Profile `frames` calls of `step(t)` (after `warmup` unprofiled ones), one synchronised frame each."""
    from torch.profiler import ProfilerActivity, profile

    for t in range(warmup):
        step(t)
    torch.cuda.synchronize()
    summaries = []
    for t in range(warmup, warmup + frames):
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as recorded:
            step(t)
            torch.cuda.synchronize()
        summaries.append(frame_summary(gpu_operations(recorded), top))
    return summaries


def operation_difference(ours: dict, theirs: dict) -> list[dict]:
    """Operation names whose count or summed time differ between two frames' `by_name`, largest time first."""
    rows = []
    for name in set(ours) | set(theirs):
        count_ours, us_ours = ours.get(name, (0, 0.0))
        count_theirs, us_theirs = theirs.get(name, (0, 0.0))
        if count_ours != count_theirs or abs(us_ours - us_theirs) > 1.0:
            rows.append(
                {"name": name, "count": [count_ours, count_theirs], "us": [round(us_ours, 2), round(us_theirs, 2)]}
            )
    return sorted(rows, key=lambda row: -abs(row["us"][0] - row["us"][1]))


def median_of(summaries: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in summaries if key in s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=140, help="unprofiled frames first (the KV ring fills at 125)")
    parser.add_argument("--top", type=int, default=8, help="largest gaps listed per frame")
    default_out = os.path.join(os.environ["OUT"], "mimi_graph_trace.json") if os.environ.get("OUT") else None
    parser.add_argument("--out", default=default_out)
    parser.add_argument(
        "--order",
        default="ours,theirs",
        help="the sides to build and trace, in order, repeats allowed (ours = DuplexCadence, "
        "theirs = moshi's whole-step graph); the first and last are compared",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("mimi_graph_trace: needs a CUDA device (it traces graph replays on the GPU)", file=sys.stderr)
        return 2
    from duplexcadence.examples.moshi.cadence import load_runtime
    from duplexcadence.examples.moshi.model import build_mimi, random_codes
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    codes = random_codes(1, args.warmup + args.frames + 1, seed=3).cuda()
    from torch._dynamo.utils import counters

    def ours():
        session = load_runtime(build_mimi(device="cuda"), 1, device="cuda").session()
        return "duplexcadence step", lambda t: session.step(codes=codes[:, :, t : t + 1])

    def theirs():
        stock = MoshiStockDecoder(build_mimi(device="cuda"), 1, mode="graphed_compiled_rope")
        return "moshi whole-step graph", lambda t: stock.step(codes[:, :, t : t + 1])

    builders = {"ours": ours, "theirs": theirs}
    order = args.order.split(",")
    if not order or any(side not in builders for side in order):
        parser.error(f"--order: a comma-separated list of {', '.join(builders)}, not {args.order!r}")
    sides = {}
    with deterministic_cudnn(), torch.no_grad():
        for number, side in enumerate(order, 1):
            name, step = builders[side]()
            name = name if len(order) == 2 and len(set(order)) == 2 else f"{name} (build {number})"
            sides[name] = trace(step, args.frames, args.warmup, args.top)
            print(f"after {name}: dynamo {dict(counters['stats'])}", flush=True)
            del step
    print(f"{'side':24s} {'ops':>5s} {'kernels':>8s} {'memcpy':>7s} {'busy us':>8s} {'span us':>8s} {'idle us':>8s}")
    for name, summaries in sides.items():
        print(
            f"{name:24s} {median_of(summaries, 'operations'):5.0f} {median_of(summaries, 'kernel'):8.0f} "
            f"{median_of(summaries, 'memcpy'):7.0f} {median_of(summaries, 'busy_us'):8.1f} "
            f"{median_of(summaries, 'span_us'):8.1f} {median_of(summaries, 'idle_us'):8.1f}"
        )
        for gap in summaries[len(summaries) // 2].get("largest_gaps", [])[:3]:
            print(f"    gap {gap['us']:7.2f} us after {gap['after']!r} before {gap['before']!r}")
    first, last = (
        summaries[len(summaries) // 2].get("by_name", {})
        for summaries in (next(iter(sides.values())), list(sides.values())[-1])
    )
    difference = operation_difference(first, last)
    print(f"operations that differ (count first/last, us first/last: {next(iter(sides))} / {list(sides)[-1]}):")
    for row in difference[:25]:
        print(
            f"  {row['count'][0]:3d}/{row['count'][1]:<3d} {row['us'][0]:8.2f}/{row['us'][1]:<8.2f} {row['name'][:110]}"
        )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(
                {
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(),
                    "frames": args.frames,
                    "difference": difference,
                    "sides": sides,
                },
                handle,
                indent=1,
            )
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
