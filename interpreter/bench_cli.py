"""`dsl bench MODEL`: every variant of a tail side by side in one process (see interpreter/bench.py)."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import bench

MODELS = {
    "toy": "duplexcadence.examples.toy.bench",
    "moshi": "duplexcadence.examples.moshi.bench",
    "personaplex": "duplexcadence.examples.personaplex.bench",
    "minicpmo45": "duplexcadence.examples.minicpmo45.bench",
    "qwen3omni": "duplexcadence.examples.qwen3omni.bench",
}


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"dsl bench: --option {pair!r} is not KEY=VALUE")
        options[key] = value
    return options


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(MODELS[args.model])
    except ImportError as error:
        print(f"dsl bench: the '{args.model}' example needs its optional packages: {error}. "
              f"See examples/{args.model}/README.md for the install line.", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    subject = module.subject(device=device, seconds=args.seconds, batch=args.batch, dtype=args.dtype,
                             **_options(args.option))
    ticks = int(subject.ticks_per_second * args.seconds)
    results = bench.run(subject, ticks, progress=not args.no_progress)
    print(bench.format_table(subject, results))
    if args.json:
        bench.dump(args.json, bench.to_json(subject, results))
        print(f"wrote {args.json}")
    return 0 if all(r.bit_identical is not False for r in results if "duplexcadence" in r.name) else 1


def register_bench(commands) -> None:
    parser = commands.add_parser("bench", help="benchmark a model tail: stock variants vs DuplexCadence")
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--seconds", type=int, default=10, help="duplex seconds to stream per variant")
    parser.add_argument("--batch", type=int, default=1, help="sessions decoded together (B)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="model-specific option (e.g. steps=5 for minicpmo45)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(handler=cmd_bench)
