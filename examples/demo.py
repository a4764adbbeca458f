"""The README's main job: one real tail end to end (Moshi's Mimi decoder at its released size).

    python -m duplexcadence.examples.demo [--device cuda] [--seconds N] [--out DIR]

1. plans `stdlib/models/mimi_decoder.clock` and prints the summary (warm-up, memory, graphs);
2. draws the timeline diagram to DIR/mimi_decoder-timeline.svg (DOT text if graphviz's `dot` is absent);
3. streams N seconds of random codes through moshi's stock decode and through DuplexCadence,
   `torch.equal` on every output frame, and prints the speed and memory table.
CPU by default on a machine without a GPU (about a minute per variant for 6 s on 2 cores); the
GPU when one is present, where moshi's own graph variants are added to the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m duplexcadence.examples.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seconds", type=int, default=None, help="duplex seconds per variant (CPU 6, GPU 20)")
    parser.add_argument("--out", default="out", help="folder for the diagram and the JSON results")
    args = parser.parse_args(argv)
    seconds = args.seconds or (20 if args.device.startswith("cuda") else 6)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from duplexcadence.examples.moshi.cadence import clock_path
    from duplexcadence.interpreter import bench
    from duplexcadence.interpreter.plans.plan import plan_file
    from duplexcadence.interpreter.plans.plan_text import format_plan
    from duplexcadence.interpreter.views.render import render_file

    clock = clock_path()
    print(f"== 1. plan: {clock.name}\n")
    plan = plan_file(clock)
    text = format_plan(plan)
    print(text[: text.index("Regions")] + "  (full table: dsl plan " + str(clock) + ")\n")
    print("== 2. timeline diagram")
    target = out / "mimi_decoder-timeline.svg"
    try:
        render_file(clock, {}, "timeline", target)
    except Exception as error:  # no `dot`: fall back to the DOT text, which needs nothing
        print(f"  ({error}); writing DOT text instead")
        target = out / "mimi_decoder-timeline.dot"
        render_file(clock, {}, "timeline", target)
    print(f"  wrote {target}\n")

    print(f"== 3. stock vs DuplexCadence, {seconds} s of audio on {args.device}, torch.equal on every frame\n")
    try:
        from duplexcadence.examples.moshi.bench import subject
    except ImportError as error:
        print(
            f"the moshi package is needed for this step: {error}\n"
            "install it with: pip install --no-deps moshi==0.2.13 && pip install einops safetensors "
            "'huggingface_hub<2' sentencepiece numpy",
            file=sys.stderr,
        )
        return 2
    case = subject(device=args.device, seconds=seconds)
    results = bench.run(case, int(case.ticks_per_second * seconds))
    print(bench.format_table(case, results))
    bench.dump(str(out / "moshi-demo.json"), bench.to_json(case, results))
    print(f"\nresults: {out / 'moshi-demo.json'}")
    identical = all(r.bit_identical is not False for r in results)
    print("every DuplexCadence output frame was torch.equal to stock eager" if identical else "MISMATCH: see the table")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
