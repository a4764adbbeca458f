"""The main job: one real tail end to end, Moshi's Mimi decoder at its released size, stock vs DuplexCadence.

    python -m duplexcadence.examples.demo [--device cpu|cuda] [--seconds N] [--out DIR]

1. plans `stdlib/models/mimi_decoder.clock` and prints the plan: clocks, warm-up, memory per region
   against stock, the graphs to capture;
2. draws the timeline to DIR/mimi_decoder-timeline.svg (DOT text where graphviz's `dot` is absent);
3. streams N seconds of codes through moshi's own decode and through DuplexCadence, `torch.equal` on
   every output frame, and prints the speed and memory of each.

The weights are seeded random and the codes random: no checkpoint is downloaded and no audio is
produced; what the run shows is the same output frames, bit for bit. On a CPU nothing is captured as a
graph, so both run the same eager kernels: the CPU shows bit-identity and the plan's memory, and no times. The GPU (the default where there is one) adds moshi's own graph variants. On a CPU
the default is the plan's warm-up and one steady period (12 s, about a minute per variant on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

GPU_COMMAND = "bash scripts/demo.sh --device cuda --seconds 20"
INSTALL_MOSHI = (
    "pip install 'duplexcadence[moshi]' && pip install --no-deps -r scripts/model-pins.txt "
    "(bash scripts/demo.sh does both)"
)
GPU_SECONDS = 20


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    from duplexcadence.interpreter.cli.common import device_name, positive

    parser = argparse.ArgumentParser(
        prog="python -m duplexcadence.examples.demo",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]),
    )
    parser.add_argument(
        "--device", type=device_name, default=None, help="cpu, cuda or cuda:N (default: cuda when present)"
    )
    parser.add_argument(
        "--seconds",
        type=positive,
        default=None,
        help=f"seconds of codes per variant (default: the plan's warm-up and one steady period on a CPU, "
        f"{GPU_SECONDS} on a GPU)",
    )
    parser.add_argument("--out", default="out", help="folder for the diagram and the JSON results (default: out)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    from duplexcadence.interpreter.cli.common import UsageError, resolve_device

    try:
        device = resolve_device(args.device)
    except UsageError as error:
        print(f"demo: error: {error.message}", file=sys.stderr)
        for help_text in error.helps:
            print(f"  help: {help_text}", file=sys.stderr)
        return 2
    from duplexcadence.interpreter import tails

    try:  # the tail's model packages are imported lazily: ask the registry before anything runs
        tails.get("moshi").require()
    except tails.TailError as error:
        print(f"demo: error: {error}", file=sys.stderr)
        print(f"  help: {INSTALL_MOSHI}", file=sys.stderr)
        return 2
    from duplexcadence.examples.moshi.bench import subject
    from duplexcadence.examples.moshi.cadence import clock_path
    from duplexcadence.interpreter import bench
    from duplexcadence.interpreter.plans.plan import plan_file
    from duplexcadence.interpreter.plans.plan_text import format_plan, human_bytes, table
    from duplexcadence.interpreter.views.output import RenderError
    from duplexcadence.interpreter.views.render import render_file

    gpu = device.startswith("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = clock_path()
    plan = plan_file(clock)
    steady_from = plan.trace.warmup_instants
    covered = plan.clocks.instant_time(steady_from + plan.trace.period_instants)
    seconds = args.seconds or (GPU_SECONDS if gpu else math.ceil(covered))

    print(f"DuplexCadence demo: Moshi's Mimi decoder (moshi 0.2.13, released size), on {device}")
    print("The weights are seeded random and the codes random: no checkpoint is downloaded and no audio is")
    print("produced. The run shows that DuplexCadence's output frames are torch.equal to moshi's own decode.\n")

    print(f"== 1. the plan of {clock.name} (dsl plan models.mimi_decoder)\n")
    print(format_plan(plan))

    print("== 2. the timeline")
    target = out / "mimi_decoder-timeline.svg"
    try:
        render_file(clock, {}, "timeline", target)
    except RenderError as error:  # no `dot`: the DOT text needs nothing
        print(f"  ({error}); writing DOT text instead")
        target = out / "mimi_decoder-timeline.dot"
        render_file(clock, {}, "timeline", target)
    print(f"  wrote {target}\n")

    frames = int(plan.clocks.rates["frame"] * seconds)
    if frames > steady_from:
        warm = f"the {steady_from}-frame warm-up, then {frames - steady_from} steady"
    else:
        warm = "the whole warm-up" if frames == steady_from else f"{frames} of the {steady_from} warm-up frames"
    print(f"== 3. stock vs DuplexCadence: {seconds} s of codes ({frames} frames: {warm}), torch.equal on every frame\n")
    case = subject(device=device, seconds=seconds)
    results = bench.run(case, int(case.ticks_per_second * seconds))
    bench.dump(str(out / "moshi-demo.json"), bench.to_json(case, results))
    stock_state, arena = plan.schedule.stock_bytes, plan.arena.total_bytes(1)
    if gpu:
        print(bench.format_table(case, results))
    else:
        print(cpu_table(results, frames, stock_state, human_bytes, table))
    print(
        f"\n  state memory, from the plan: stock {human_bytes(stock_state)} (moshi's own buffers of the regions that "
        f"declare `stock`);\n  DuplexCadence's arena {human_bytes(arena)} ({human_bytes(plan.arena.session_bytes)} "
        f"pinned + {human_bytes(plan.arena.scratch_bytes)} scratch)"
    )
    cadence = next(r for r in results if r.name == "duplexcadence")
    graphs = cadence.info.get("graphs", 0)
    if gpu:
        print(f"  DuplexCadence replayed {graphs} captured graphs ({len(plan.capture.graphs)} planned)")
    else:
        print(
            f"  on a CPU nothing is captured ({len(plan.capture.graphs)} graphs planned, {graphs} captured): both "
            "variants run the same eager kernels,\n  so a CPU proves exactness and memory, not speed (no times are "
            "shown); the speed-up is CUDA-graph\n  replay on a GPU:\n"
            f"    {GPU_COMMAND}"
        )
    print(f"\nresults: {out / 'moshi-demo.json'}")
    compared = [r.name for r in results[1:] if r.bit_identical]
    identical = cadence.bit_identical is True and all(r.bit_identical is not False for r in results)
    if identical:
        print(f"every output frame of {' and '.join(compared)} was torch.equal to {results[0].name}")
    else:
        print("MISMATCH: see the first mismatch under the table")
    return 0 if identical else 1


def cpu_table(results, frames: int, stock_state: int, human_bytes, table) -> str:
    """What a CPU proves, per variant: the state memory the plan gives and bit-identity on every frame. No
    times: on a CPU both run the same eager kernels, and a few seconds of them vary more than they differ."""
    reference = results[0]
    rows = []
    for r in results:
        if r.error is not None:
            rows.append([r.name, "-", "-", "FAILED"])
            continue
        state = r.info.get("arena_bytes", stock_state if r is reference else None)
        identical = "(reference)" if r is reference else {True: "yes", False: "NO", None: "-"}[r.bit_identical]
        rows.append([r.name, human_bytes(state), frames, identical])
    header = ["variant", "state memory", "frames", "== stock eager"]
    return "\n".join(table(header, rows, right=(1, 2)))


if __name__ == "__main__":
    sys.exit(main())
