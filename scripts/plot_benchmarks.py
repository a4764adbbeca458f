"""Plots of the benchmark results (PNG, matplotlib's Agg backend; `pip install -e .[plots]`).

    python scripts/plot_benchmarks.py                     # reads docs/benchmarks/*.json, writes beside them
    python scripts/plot_benchmarks.py --json-dir out --out-dir /tmp/plots

Draws, per model:

* ``<model>-ms-per-second.png``: every variant's ms per duplex second for each second of the session
  (``per_second_ms`` of `dsl bench --json`; warm-up seconds shaded), one panel per run in the file;
* ``<model>-density.png``: sessions vs p99 round time for every sweep found in the file (any object
  with a ``sweep`` list of ``{"sessions", "round_ms_p99"}``, e.g. MiniCPM-o's sessions in turn; each
  series is named by the object's ``kind``, else by where it sits in the JSON; a log sessions axis
  when the counts span more than 10x);

and, from the plans alone (no GPU, no JSON), ``memory-by-region.png``: each stdlib model clock's
per-session bytes per region family (what DuplexCadence allocates) against the stock allocation of the
regions that declare one (`dsl plan --json`'s ``regions.*.bytes`` and ``stock_bytes``).

A plot whose data is missing is skipped with a note; the script never fails for that.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# model (the JSON's file stem) -> stdlib clock and the params its benchmark runs with
PLANS = {
    "moshi": ("mimi_decoder.clock", {"B": "1"}),
    "personaplex": ("personaplex_mimi_decoder.clock", {"B": "1"}),
    "minicpmo45": ("step_audio2_token2wav.clock", {"P": "150", "steps": "10"}),
    "qwen3omni": ("qwen3_omni_code2wav.clock", {"B": "1"}),
}
LABELS = {
    "moshi": "Moshi (Mimi decoder)",
    "personaplex": "PersonaPlex (Mimi decoder, per instance)",
    "minicpmo45": "MiniCPM-o 4.5 (token2wav, n=10, P=150)",
    "qwen3omni": "Qwen3-Omni (Code2Wav)",
    "mimi_lockstep_density": "Moshi's Mimi decoder: in turn vs batched (lockstep B=32)",
}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def note(message: str) -> None:
    print(f"plot_benchmarks: {message}")


def bench_runs(payload) -> list[dict]:
    """The `dsl bench --json` runs in one file: a run, a list of runs, or {"bench": [runs], ...}."""
    if isinstance(payload, list):
        return [run for item in payload for run in bench_runs(item)]
    if isinstance(payload, dict):
        if isinstance(payload.get("variants"), list):
            return [payload]
        if "bench" in payload:
            return bench_runs(payload["bench"])
    return []


def sweeps(payload, path: str = "") -> Iterator[tuple[str, list[dict]]]:
    """(name, points) for every object holding a `sweep` list, anywhere in the JSON."""
    if isinstance(payload, dict):
        if isinstance(payload.get("sweep"), list):
            yield payload.get("kind") or path or "sweep", payload["sweep"]
        for key, value in payload.items():
            if key != "sweep":
                yield from sweeps(value, f"{path}.{key}" if path else str(key))
    elif isinstance(payload, list):
        for index, value in enumerate(payload):
            yield from sweeps(value, f"{path}[{index}]")


def _p99(point: dict):
    for key in ("round_ms_p99", "p99_ms", "ms_p99", "p99"):
        if isinstance(point.get(key), (int, float)):
            return point[key]
    return None


def series_name(path: str) -> str:
    """`sessions_in_turn.sessions_in_turn.stock` -> `sessions_in_turn.stock` (repeated parts once)."""
    parts: list[str] = []
    for part in path.split("."):
        if not parts or parts[-1] != part:
            parts.append(part)
    return ".".join(parts)


def mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.1f} KiB"


def run_title(run: dict) -> str:
    return run.get("command") or run.get("description") or run.get("model", "")


def plot_ms_per_second(model: str, payload, out_dir: Path) -> Path | None:
    runs = [run for run in bench_runs(payload) if any(v.get("per_second_ms") for v in run["variants"])]
    if not runs:
        note(f"{model}: no per_second_ms in its JSON (rerun `dsl bench {model} --json`); ms-per-second plot skipped")
        return None
    plt = pyplot()
    figure, axes = plt.subplots(len(runs), 1, figsize=(9, 3.6 * len(runs)), squeeze=False)
    for axis, run in zip(axes[:, 0], runs):
        warmup = 0
        for variant in run["variants"]:
            series = variant.get("per_second_ms") or []
            if not series:
                continue
            warmup = max(warmup, variant.get("warmup_seconds", 0))
            axis.plot(range(len(series)), series, marker="o", markersize=3, label=variant["name"])
        if warmup:
            axis.axvspan(-0.5, warmup - 0.5, color="0.9", label="warm-up (not in the statistics)")
        axis.set_yscale("log")
        axis.set_xlabel("second of the session")
        axis.set_ylabel("ms per duplex second")
        axis.set_title(run_title(run), fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"{LABELS.get(model, model)}: ms per second over the session")
    figure.tight_layout()
    path = out_dir / f"{model}-ms-per-second.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_density(model: str, payload, out_dir: Path) -> Path | None:
    series = [
        (series_name(name), [(p["sessions"], _p99(p)) for p in points if "sessions" in p and _p99(p) is not None])
        for name, points in sweeps(payload)
    ]
    series = [(name, sorted(points)) for name, points in series if points]
    if not series:
        note(f"{model}: no sessions sweep in its JSON; density plot skipped")
        return None
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    for name, points in series:
        axis.plot([s for s, _ in points], [p for _, p in points], marker="o", label=name)
    axis.axhline(1000, color="red", linestyle="--", linewidth=1, label="1 s cadence")
    counts = [s for _, points in series for s, _ in points]
    if max(counts) > 10 * min(counts):
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        axis.set_xscale("log")
        axis.set_xticks(sorted(set(counts)))
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("sessions (served in turn or concurrently, as the series says)")
    axis.set_ylabel("p99 round (ms)")
    axis.set_title(f"{LABELS.get(model, model)}: sessions vs p99", fontsize=10)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = out_dir / f"{model}-density.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def region_families(clock: str, params: dict[str, str]) -> list[tuple[str, int, int | None]]:
    """(family, DuplexCadence bytes, stock bytes or None) per region family of one session's plan."""
    from duplexcadence.interpreter.plans.plan import plan_file, to_json

    plan = to_json(plan_file(ROOT / "stdlib" / "models" / clock, params))
    families: dict[str, list] = {}
    for name, region in plan["regions"].items():
        family = region.get("family") or name
        entry = families.setdefault(family, [0, None])
        entry[0] += region["bytes"] + (region.get("double_buffer_bytes") or 0)
        if region.get("stock_bytes") is not None:
            entry[1] = (entry[1] or 0) + region["stock_bytes"]
    return [(family, demand, stock) for family, (demand, stock) in families.items()]


def plot_memory_by_region(out_dir: Path) -> Path | None:
    try:
        models = [(model, region_families(clock, params)) for model, (clock, params) in PLANS.items()]
    except ImportError as error:
        note(f"cannot import duplexcadence ({error}); memory-by-region plot skipped")
        return None
    plt = pyplot()
    heights = [max(2.5, 0.32 * len(families) + 1.2) for _, families in models]
    figure, axes = plt.subplots(len(models), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights})
    for axis, (model, families) in zip(axes, models):
        families.sort(key=lambda item: -max(item[1], item[2] or 0))
        names = [family for family, _, _ in families]
        positions = range(len(names))
        demand = [max(d, 1) for _, d, _ in families]
        stock = [s if s else 0 for _, _, s in families]
        axis.barh([p + 0.2 for p in positions], demand, height=0.4, label="DuplexCadence plan (per session)")
        axis.barh([p - 0.2 for p in positions], stock, height=0.4, label="stock allocation (where declared)")
        axis.set_yticks(list(positions), names, fontsize=7)
        axis.invert_yaxis()
        axis.set_xscale("log")
        axis.set_xlabel("bytes", fontsize=8)
        total_demand = sum(d for _, d, _ in families)
        compared = sum(d for _, d, s in families if s is not None)
        total_stock = sum(s for _, _, s in families if s is not None)
        stock_text = (
            f"regions with a stock allocation: {mib(compared)} vs stock {mib(total_stock)}"
            if total_stock
            else "no region declares a stock allocation (stock keeps no state between seconds)"
        )
        axis.set_title(f"{LABELS[model]}: plan {mib(total_demand)} per session; {stock_text}", fontsize=8)
        axis.grid(True, axis="x", which="both", alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    path = out_dir / "memory-by-region.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: the JSON folder")
    parser.add_argument("--no-plans", action="store_true", help="skip the memory-by-region plot")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or args.json_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        pyplot()
    except ImportError:
        print("plot_benchmarks: needs matplotlib (pip install -e .[plots])", file=sys.stderr)
        return 2
    written = []
    files = sorted(args.json_dir.glob("*.json"))
    if not files:
        note(f"no JSON in {args.json_dir}; only the plan plot is drawn")
    for path in files:
        payload = json.loads(path.read_text())
        for plot in (plot_ms_per_second, plot_density):
            result = plot(path.stem, payload, out_dir)
            if result is not None:
                written.append(result)
    if not args.no_plans:
        result = plot_memory_by_region(out_dir)
        if result is not None:
            written.append(result)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
