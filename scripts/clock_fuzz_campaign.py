"""An offline fuzz campaign of `dsl check`, `dsl plan` and `dsl render`: thousands of adversarial `.clock`
inputs from the strategies of tests/clock/test_clock_fuzz_limits.py, counted instead of stopping at the
first failure.

    python scripts/clock_fuzz_campaign.py --inputs 5000 --budget 10 --out campaign.json

Each input runs the three commands in this process (as the test does); an input whose three commands
take longer than --budget seconds in all is stopped and counted over budget. The JSON holds the counts,
the time distribution and every input that broke a promise (with its text, cut to 2 000 characters);
the last lines printed are the table.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]


def load_strategies():
    spec = importlib.util.spec_from_file_location(
        "clock_fuzz_limits", ROOT / "tests" / "clock" / "test_clock_fuzz_limits.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=5000, help="inputs to generate (default 5000)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds for check + plan + render of one input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    fuzz = load_strategies()
    outcomes: list[tuple[str, object]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:

        @settings(
            max_examples=args.inputs,
            phases=[Phase.generate],
            database=None,
            deadline=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
        )
        @given(text=fuzz.INPUTS)
        def campaign(text: str) -> None:
            outcomes.append((text, fuzz.run_input(Path(folder), text, args.budget)))
            if len(outcomes) % 250 == 0:
                print(f"{len(outcomes)} inputs, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

        import random

        random.seed(args.seed)
        campaign()

    totals = [outcome.total_seconds for _, outcome in outcomes]
    per_command = {
        name: [outcome.seconds[i] for _, outcome in outcomes if len(outcome.seconds) > i]
        for i, (name, *_) in enumerate(fuzz.COMMANDS)
    }
    kinds = collections.Counter()
    broken = []
    for text, outcome in outcomes:
        for problem in outcome.problems:
            kinds[problem.split(" ")[0] if not problem.startswith("internal") else "internal error"] += 1
        if outcome.problems:
            broken.append({"problems": list(outcome.problems), "seconds": outcome.seconds, "text": text[:2000]})
    exits = collections.Counter(outcome.codes for _, outcome in outcomes)
    summary = {
        "inputs": len(outcomes),
        "wall_s": round(time.perf_counter() - started, 1),
        "budget_s": args.budget,
        "tracebacks": sum("traceback" in p for _, o in outcomes for p in o.problems),
        "internal_errors": sum(p.startswith("internal error") for _, o in outcomes for p in o.problems),
        "over_budget": sum(any(p.startswith("over budget") for p in o.problems) for _, o in outcomes),
        "unlocated": sum(any(p.startswith("unlocated") for p in o.problems) for _, o in outcomes),
        "other_exit": sum(any(p.startswith("exit") for p in o.problems) for _, o in outcomes),
        "exit_codes": {"/".join(map(str, codes)): count for codes, count in exits.most_common()},
        "seconds_per_input": {
            "median": round(statistics.median(totals), 3),
            "p99": round(sorted(totals)[int(0.99 * (len(totals) - 1))], 3),
            "max": round(max(totals), 3),
        },
        "max_seconds_per_command": {name: round(max(values), 3) for name, values in per_command.items() if values},
        "cpu_seconds_per_input": {
            "median": round(statistics.median(o.cpu_seconds for _, o in outcomes), 3),
            "max": round(max(o.cpu_seconds for _, o in outcomes), 3),
        },
        "over_5_s_wall": sum(o.total_seconds > 5 for _, o in outcomes),
        "largest_input_bytes": max(len(text.encode("utf-8", "surrogatepass")) for text, _ in outcomes),
        "slowest": [
            {"seconds": outcome.seconds, "cpu_seconds": outcome.cpu_seconds, "bytes": len(text), "head": text[:300]}
            for text, outcome in sorted(outcomes, key=lambda item: -item[1].total_seconds)[:10]
        ],
        "broken": broken,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1))
    print(f"inputs {summary['inputs']} in {summary['wall_s']} s (budget {args.budget:g} s per input)")
    print(
        f"  tracebacks {summary['tracebacks']}, internal errors {summary['internal_errors']}, "
        f"over budget {summary['over_budget']}, unlocated refusals {summary['unlocated']}, other exits {summary['other_exit']}"
    )
    print(
        f"  seconds per input: median {summary['seconds_per_input']['median']}, p99 {summary['seconds_per_input']['p99']}, "
        f"max {summary['seconds_per_input']['max']}; max per command {summary['max_seconds_per_command']}"
    )
    print(
        f"  CPU seconds per input: median {summary['cpu_seconds_per_input']['median']}, "
        f"max {summary['cpu_seconds_per_input']['max']}; inputs over 5 s of wall-clock: {summary['over_5_s_wall']}"
    )
    print(f"  exit codes (check/plan/render): {dict(list(summary['exit_codes'].items())[:6])}")
    return 0 if not broken else 1


if __name__ == "__main__":
    sys.exit(main())
