"""Peak memory of every released tail, stock eager against DuplexCadence, on one GPU: allocated and reserved.

    source scripts/device_setup.sh
    NO_TORCH_COMPILE=1 python scripts/memory_vs_stock.py --json memory_vs_stock.json

Each tail is its `dsl bench` subject with two variants, stock eager (the reference) and `duplexcadence`, as
`dsl bench TAIL --device cuda --interleave --variants duplexcadence` runs them, without the GPU-busy profile:
each variant built and stepped alone from a fresh peak (what the peaks are), then both built at once and
stepped in turn (the interleaved pass, its ms per second). The configurations are README's results table's:
Moshi's and PersonaPlex's Mimi decoders fp32, MiniCPM-o 4.5's token2wav fp32 with n = 10 and P = 150,
Qwen3-Omni's Code2Wav bf16; `NO_TORCH_COMPILE=1` keeps moshi's rope eager in both variants (nothing to
compile, the same memory in both). Prints one row per tail: stock's and DuplexCadence's peak allocated and
peak reserved, DuplexCadence's over (+) or under (-) stock's, DuplexCadence's peak reserved split into what was
reserved before it was built, its arena (the plan's number), its graph pools (measured after capture) and the
rest, and whether every output was `torch.equal` to stock's. `--device cpu --tails toy` is the smoke test the
CPU tests run (no peaks off CUDA).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

CONFIGS = {
    "moshi": {"dtype": "fp32"},
    "personaplex": {"dtype": "fp32"},
    "minicpmo45": {"dtype": "fp32", "steps": 10, "prompt": 150},
    "qwen3omni": {"dtype": "bf16"},
    "toy": {},
}
RELEASED = ("moshi", "personaplex", "minicpmo45", "qwen3omni")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--json", required=True, type=Path, help="where to write the runs (dsl bench --json's, by tail)"
    )
    parser.add_argument("--tails", default=",".join(RELEASED), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--seconds", type=int, default=4, help="duplex seconds each variant is stepped (default 4)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    names = [name for name in args.tails.split(",") if name]
    unknown = [name for name in names if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown tail(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")

    import torch

    from duplexcadence.interpreter import bench, tails
    from duplexcadence.interpreter.plans.plan_text import human_bytes, table

    device = torch.device(args.device)
    runs, rows = {}, []
    for name in names:
        started = time.perf_counter()
        subject = tails.get(name).subject.resolve()(device=device, seconds=args.seconds, batch=1, **CONFIGS[name])
        subject.variants = [v for v in subject.variants if v.reference or v.name == "duplexcadence"]
        ticks = int(subject.ticks_per_second * args.seconds)
        results = bench.run(subject, ticks, progress=False, interleave=True, profile=False)
        runs[name] = bench.to_json(subject, results)
        stock, cadence = results[0], next(r for r in results if r.name == "duplexcadence")
        reserved = cadence.info.get("reserved") or {}
        rows.append(
            [
                name,
                _pair(stock.peak_allocated_bytes, stock.peak_reserved_bytes, human_bytes),
                _pair(cadence.peak_allocated_bytes, cadence.peak_reserved_bytes, human_bytes),
                _pair(
                    _over(cadence.peak_allocated_bytes, stock.peak_allocated_bytes),
                    _over(cadence.peak_reserved_bytes, stock.peak_reserved_bytes),
                    human_bytes,
                ),
                " + ".join(
                    human_bytes(reserved.get(key)) for key in ("before_bytes", "arena_bytes", "graph_pool_bytes")
                )
                + f" + {human_bytes(reserved.get('unaccounted_bytes'))}",
                "yes" if cadence.bit_identical else "NO",
                f"{time.perf_counter() - started:.0f} s",
            ]
        )
        print(f"{name}: done in {rows[-1][-1]}", file=sys.stderr, flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(runs, indent=1, sort_keys=True))
    print(f"Peak memory, stock eager vs DuplexCadence, each variant from a fresh peak ({device}; allocated / reserved)")
    print(
        "\n".join(
            table(
                [
                    "tail",
                    "stock eager",
                    "duplexcadence",
                    "duplexcadence - stock",
                    "its reserved: before + arena + pools + rest",
                    "bit-identical",
                    "took",
                ],
                rows,
            )
        )
    )
    return 0 if all(row[5] == "yes" for row in rows) else 1


def _pair(first, second, text) -> str:
    return f"{text(first)} / {text(second)}"


def _over(mine: int | None, stock: int | None) -> int | None:
    return None if mine is None or stock is None else mine - stock


if __name__ == "__main__":
    sys.exit(main())
