"""Add one GPU bench run to docs/benchmarks/<model>.json as a summary entry.

The raw payload is what `dsl bench --output-format json` prints (or a GPU script's `bench` list); the entry keeps
its variants and adds a summary: model, device, driver, torch, stock_ms_per_s, cadence_ms_per_s, speedup
(stock / cadence), stock_peak_bytes, cadence_peak_bytes, cadence_over_stock_eager_bytes (how far the
DuplexCadence variant's peak allocated memory is above stock eager's in the run; null when it is not),
bit_identical, ticks, graphs. An entry with the
same description, command and DuplexCadence variant replaces the old one; the others stay, oldest first.
With `--sessions`, the payload's sessions sweep (`scripts/minicpmo45_gpu_bench.py --part sessions`) is
added to the `sessions` list of docs/benchmarks/<--tail>.json instead.

    python scripts/bench_summary.py RAW.json --stock "moshi stock (own graphs)" \\
        --command "dsl bench moshi --device cuda --batch 32 --seconds 6" [--cadence duplexcadence]
    python scripts/bench_summary.py RAW.json --sessions --tail minicpmo45 --command "python scripts/..."

Then `python scripts/results_table.py --write` updates the tables of README.md and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def summarize(payload: dict, stock: str, cadence: str, command: str) -> dict:
    """The summary entry of one harness payload (`interpreter.bench.to_json`)."""
    variants = {v["name"]: v for v in payload["variants"]}
    missing = [name for name in (stock, cadence) if name not in variants]
    if missing:
        raise SystemExit(f"no variant named {', '.join(map(repr, missing))}; the run has: {', '.join(variants)}")
    reference = payload["variants"][0]  # stock eager: the harness runs it first, as the bit-identity reference
    ours, theirs = variants[cadence], variants[stock]
    info = ours.get("info", {})
    return {
        "model": payload["model"],
        "description": payload["description"],
        "command": command,
        "device": payload.get("gpu") or payload["device"],
        "driver": payload.get("driver"),
        "torch": payload["torch"],
        "cuda": payload.get("cuda"),
        "stock_variant": stock,
        "cadence_variant": cadence,
        "stock_ms_per_s": round(theirs["ms_per_s_median"], 2),
        "stock_eager_ms_per_s": round(reference["ms_per_s_median"], 2),
        "cadence_ms_per_s": round(ours["ms_per_s_median"], 2),
        "cadence_gpu_busy_ms_per_s": round(ours["gpu_busy_ms_per_s"], 2) if ours["gpu_busy_ms_per_s"] else None,
        "speedup": round(theirs["ms_per_s_median"] / ours["ms_per_s_median"], 3),
        "speedup_vs_stock_eager": round(reference["ms_per_s_median"] / ours["ms_per_s_median"], 3),
        "stock_peak_bytes": theirs["peak_allocated_bytes"],
        "cadence_peak_bytes": ours["peak_allocated_bytes"],
        "cadence_over_stock_eager_bytes": next(
            (
                over["over_bytes"]
                for over in payload.get("memory_over_stock", [])
                if over["variant"] == cadence and over.get("kind", "allocated") == "allocated"
            ),
            None,
        ),
        "bit_identical": ours["bit_identical"],
        "ticks": ours["ticks"],
        "graphs": info.get("graphs", info.get("graphs_captured")),
        "stage_graphs": info.get("stage_graphs", info.get("graphs_planned")),
        "variants": payload["variants"],
    }


def add(entry: dict, path: Path) -> None:
    """Write `entry` into the JSON list at `path`, replacing one of the same description, command and
    DuplexCadence variant (entries written before `cadence_variant` existed summarised "duplexcadence")."""
    document = json.loads(path.read_text()) if path.exists() else []
    if isinstance(document, dict) and "bench" not in document:  # a file that holds one run
        document = [document]
    entries = document["bench"] if isinstance(document, dict) else document
    key = lambda e: (e.get("description"), e.get("command"), e.get("cadence_variant", "duplexcadence"))  # noqa: E731
    same = lambda old: key(old) == key(entry)  # noqa: E731
    entries[:] = [old for old in entries if not same(old)] + [entry]
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


SESSIONS_ENVIRONMENT = ("torch", "cuda", "cudnn", "gpu", "driver", "prompt_frames", "wall_seconds")


def add_sessions(payload: dict, command: str, path: Path) -> dict:
    """Append the payload's sessions sweep, with its command and environment, to the `sessions` list of the
    JSON at `path` (a file of bench runs becomes {"bench": [runs], "sessions": [...]})."""
    if "sessions_in_turn" not in payload:
        raise SystemExit("the payload has no sessions_in_turn (run the GPU script with --part sessions)")
    document = json.loads(path.read_text()) if path.exists() else {"bench": []}
    if not isinstance(document, dict) or "variants" in document:
        document = {"bench": document if isinstance(document, list) else [document]}
    entry = {key: payload[key] for key in SESSIONS_ENVIRONMENT if key in payload}
    entry.update(command=command, sessions_in_turn=payload["sessions_in_turn"])
    document.setdefault("sessions", []).append(entry)
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "raw", type=Path, help="a payload printed by `dsl bench --output-format json` or a GPU bench script"
    )
    parser.add_argument("--stock", help="the variant that is the model's shipped streaming path")
    parser.add_argument("--cadence", default="duplexcadence", help="the DuplexCadence variant")
    parser.add_argument("--command", required=True, help="the command that produced the run")
    parser.add_argument("--index", type=int, default=0, help="which run of a list of runs (GPU scripts' `bench`)")
    parser.add_argument("--sessions", action="store_true", help="add the payload's sessions sweep instead")
    parser.add_argument("--tail", default="minicpmo45", help="with --sessions: the tail's JSON to add it to")
    args = parser.parse_args(argv)
    raw = json.loads(args.raw.read_text())
    if args.sessions:
        path = DOCS / f"{args.tail}.json"
        add_sessions(raw, args.command, path)
        print(f"{path}: sessions sweep of `{args.command}` added")
        return 0
    if args.stock is None:
        parser.error("--stock is required (the variant that is the model's shipped streaming path)")
    payload = raw["bench"][args.index] if isinstance(raw, dict) and "bench" in raw else raw
    entry = summarize(payload, args.stock, args.cadence, args.command)
    path = DOCS / f"{entry['model']}.json"
    add(entry, path)
    print(
        f"{path}: {entry['description']}: {entry['cadence_ms_per_s']} vs {entry['stock_ms_per_s']} ms/s "
        f"({entry['speedup']}x), bit-identical {entry['bit_identical']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
