"""The figures of docs/benchmarks.md (PNG, matplotlib's Agg backend; `pip install ".[plots]"`).

    python scripts/plot_benchmarks.py                     # reads docs/benchmarks/*.json, writes beside them
    python scripts/plot_benchmarks.py --json-dir out --out-dir /tmp/plots

* ``<tail>-ms-per-second.png``, per tail, from the run its tables show (chosen by scripts/results_table.py):
  the milliseconds of every duplex second of every variant, on a linear axis, the warm-up seconds shaded
  (a warm-up second above the axis is drawn at its top with its value); beside it each variant's peak
  allocated memory, values printed;
* ``sessions-per-gpu.png``: the p99 round against the number of sessions, stock against DuplexCadence, one
  panel per way of serving (``mimi_lockstep_density.json``, the ``sessions`` runs of ``minicpmo45.json``);
* ``memory-by-region.png``, from the plans alone (no GPU, no JSON): each stdlib tail's bytes per region family
  for one session, DuplexCadence's plan against the stock allocation of the regions that declare one.

Every variant has one colour in every figure. A figure whose data is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def sibling(name: str):
    """A module of this folder (scripts/ is no package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


results_table = sibling("results_table")

# One colour per variant, the same in every figure: greys and warm colours for stock paths, blues and greens
# for DuplexCadence.
COLOURS = {
    "stock eager": "#7f7f7f",
    "moshi stock (own graphs)": "#ff7f0e",
    "personaplex stock": "#ff7f0e",
    "stock": "#ff7f0e",
    "moshi stock, in turn": "#ff7f0e",
    "moshi stock, batched B=32": "#ff7f0e",
    "moshi whole-step graph": "#9467bd",
    "moshi fully eager (no compile)": "#8c564b",
    "stock step, torch.compile reduce-overhead": "#d62728",
    "streaming (eager, opt-in)": "#bcbd22",
    "duplexcadence": "#1f77b4",
    "duplexcadence, in turn": "#1f77b4",
    "duplexcadence, lockstep B=32": "#1f77b4",
    "duplexcadence, 2 lanes": "#2ca02c",
    "duplexcadence, 4 lanes": "#2ca02c",
    "duplexcadence, voice base on host": "#17becf",
    "duplexcadence, lockstep B=2": "#98df8a",
    "duplexcadence, other_mimi pruned": "#e377c2",
    "duplexcadence, both instances in one session": "#c5b0d5",
    "streaming under DuplexCadence (opt-in)": "#aec7e8",
}
OTHER_COLOURS = ("#e377c2", "#7b4173", "#637939", "#843c39")
STOCK_COLOUR, CADENCE_COLOUR = COLOURS["stock"], COLOURS["duplexcadence"]

# tail -> stdlib clock and the params its benchmark runs with (memory-by-region.png)
PLANS = {
    "moshi": ("mimi_decoder.clock", {"B": "1"}),
    "personaplex": ("personaplex_mimi_decoder.clock", {"B": "1"}),
    "minicpmo45": ("step_audio2_token2wav.clock", {"P": "150", "steps": "10"}),
    "qwen3omni": ("qwen3_omni_code2wav.clock", {"B": "1"}),
}


def colour(name: str) -> str:
    if name in COLOURS:
        return COLOURS[name]
    return OTHER_COLOURS[sum(map(ord, name)) % len(OTHER_COLOURS)]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def note(message: str) -> None:
    print(f"plot_benchmarks: {message}")


def mib(count: float) -> float:
    return count / 2**20


def size_text(count: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} B"


def shown_run(tail, json_dir: Path) -> dict | None:
    """The run of the tail's first settled table row (a bit-identical one first), else its latest current run."""
    rows = results_table.rows(tail, json_dir)
    settled = sorted((row for row in rows if row.settled), key=lambda row: row.cadence.get("bit_identical") is not True)
    if settled:
        return settled[0].run
    return rows[-1].run if rows else None


def plot_tail(tail, json_dir: Path, out_dir: Path) -> Path | None:
    run = shown_run(tail, json_dir)
    if run is None:
        note(f"{tail.key}: no run with per-second series in its JSON; its figure is skipped")
        return None
    plt = pyplot()
    figure, (bars, series, memory) = plt.subplots(
        1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [1.15, 1.35, 1]}
    )
    plot_steady_state(bars, run)
    plot_seconds(series, run)
    plot_peaks(memory, run)
    config = results_table.short_config(run, {"name": ""})
    figure.suptitle(f"{tail.title}, {config}:  {run['command']}", fontsize=10)
    figure.tight_layout()
    path = out_dir / f"{tail.key}-ms-per-second.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_steady_state(axis, run: dict) -> None:
    """Each variant's median ms per duplex second over the steady seconds, both passes, values printed."""
    timed = [v for v in run["variants"] if v.get("ms_per_s_median") is not None]
    interleaved = results_table.is_interleaved(run)
    height = 0.38 if interleaved else 0.7
    top = max(max(v["ms_per_s_median"], results_table.passes_median(v, interleaved)) for v in timed)
    for position, variant in enumerate(timed):
        pairs = [(variant["ms_per_s_median"], 0.0 if not interleaved else -height / 2, None)]
        if interleaved:
            pairs.append((results_table.passes_median(variant, True), height / 2, "//"))
        for value, offset, hatch in pairs:
            axis.barh(
                position + offset,
                value,
                height=height,
                color=colour(variant["name"]),
                hatch=hatch,
                edgecolor="white" if hatch else None,
            )
            axis.text(value, position + offset, f" {value:.1f}", va="center", fontsize=7.5)
    axis.set_yticks(range(len(timed)), [v["name"] for v in timed], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlim(0, top * 1.25)
    axis.set_xlabel("ms per duplex second, median of the steady seconds")
    title = "steady state: sequential (solid), interleaved (hatched)" if interleaved else "steady state"
    axis.set_title(title, fontsize=9)
    axis.grid(True, axis="x", alpha=0.3)


def plot_seconds(axis, run: dict) -> None:
    """Every duplex second of the shipped path and the DuplexCadence variants (and of any variant on their
    scale), the warm-up shaded; a second above the axis is drawn at its top with its value."""
    variants = [v for v in run["variants"] if v.get("per_second_ms")]
    anchors = [results_table.stock_variant(run), *results_table.cadence_variants(run)]
    scale = 1.3 * max(max(results_table.steady_seconds(v) or v["per_second_ms"]) for v in anchors)
    shown = [v for v in variants if max(results_table.steady_seconds(v) or v["per_second_ms"]) <= scale]
    left_out = [v["name"] for v in variants if v not in shown]
    warmup = max(v.get("warmup_seconds") or 0 for v in variants)
    if warmup:
        axis.axvspan(0.5, warmup + 0.5, color="0.92", zorder=0)
        axis.text(
            (warmup + 1) / 2,
            scale / 2,
            "warm-up (excluded)",
            fontsize=7.5,
            ha="center",
            va="center",
            rotation=90,
            color="0.4",
        )
    for index, variant in enumerate(shown):
        values = variant["per_second_ms"]
        xs = range(1, len(values) + 1)
        axis.plot(
            xs, [min(v, scale) for v in values], marker="o", markersize=3, linewidth=1.5, color=colour(variant["name"])
        )
        for x, value in zip(xs, values):
            if value > scale:
                axis.annotate(
                    f"{value:,.0f}",
                    (x, scale),
                    xytext=(4, -9 - 9 * index),
                    textcoords="offset points",
                    fontsize=7,
                    color=colour(variant["name"]),
                )
    axis.set_ylim(0, scale)
    axis.set_xlim(0.5, max(len(v["per_second_ms"]) for v in variants) + 0.5)
    axis.legend(
        handles=[axis.lines[i] for i in range(len(shown))],
        labels=[v["name"] for v in shown],
        fontsize=7,
        loc="best",
    )
    axis.xaxis.get_major_locator().set_params(integer=True)
    axis.set_xlabel("second of the run (sequential pass)")
    axis.set_ylabel("ms per duplex second")
    title = "every duplex second"
    if left_out:
        title += f" (off this scale: {', '.join(left_out)})"
    axis.set_title(title, fontsize=9, wrap=True)
    axis.grid(True, alpha=0.3)


def plot_peaks(axis, run: dict) -> None:
    measured = [v for v in run["variants"] if v.get("peak_allocated_bytes")]
    peaks = [mib(v["peak_allocated_bytes"]) for v in measured]
    axis.barh(range(len(measured)), peaks, color=[colour(v["name"]) for v in measured])
    for position, variant in enumerate(measured):
        axis.text(
            mib(variant["peak_allocated_bytes"]),
            position,
            f" {size_text(variant['peak_allocated_bytes'])}",
            va="center",
            fontsize=7.5,
        )
    axis.set_yticks(range(len(measured)), [v["name"] for v in measured], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlim(0, max(peaks) * 1.4)
    axis.set_xlabel("peak allocated (MiB)")
    axis.set_title("peak memory", fontsize=9)
    axis.grid(True, axis="x", alpha=0.3)


def density_panels(json_dir: Path) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(panel title, [(series name, result with `sweep` and `max_sessions_p99_under_1s`)]) per way of serving."""
    panels = []
    mimi_path = json_dir / "mimi_lockstep_density.json"
    if mimi_path.exists():
        kinds = {r["kind"]: r for r in json.loads(mimi_path.read_text())["results"]}
        for title, names in (
            ("Moshi's Mimi decoder, in turn", ("moshi stock, in turn", "duplexcadence, in turn")),
            ("Moshi's Mimi decoder, batched B=32", ("moshi stock, batched B=32", "duplexcadence, lockstep B=32")),
        ):
            panels.append((title, [(name, kinds[name]) for name in names if name in kinds]))
    minicpm_path = json_dir / "minicpmo45.json"
    if minicpm_path.exists():
        runs = json.loads(minicpm_path.read_text()).get("sessions", [])
        for how, run, ours in results_table.minicpm_sweeps(runs):
            lanes = how.rpartition(", ")[2]
            name = "duplexcadence, in turn" if lanes == "one slot each" else f"duplexcadence, {lanes}"
            panels.append(
                (f"MiniCPM-o 4.5 token2wav, {how}", [("stock", run["sessions_in_turn"]["stock"]), (name, ours)])
            )
    return panels


def plot_sessions(json_dir: Path, out_dir: Path) -> Path | None:
    panels = density_panels(json_dir)
    if not panels:
        note("no sessions sweep in mimi_lockstep_density.json or minicpmo45.json; sessions-per-gpu.png skipped")
        return None
    plt = pyplot()
    columns = 2
    rows = (len(panels) + 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(11, 3.9 * rows), squeeze=False)
    for axis, (title, series) in zip(axes.flat, panels):
        top = 1000.0
        for name, result in series:
            points = sorted((p["sessions"], p["round_ms_p99"]) for p in result["sweep"])
            top = max(top, *(p for _, p in points))
            best = result["max_sessions_p99_under_1s"]
            label = f"{name}: {results_table.limit_text(result)} sessions" if best else f"{name}: none under 1 s"
            axis.plot(*zip(*points), marker="o", color=colour(name), label=label, linewidth=1.8)
            if best:
                axis.axvline(best, color=colour(name), linestyle=":", linewidth=1.2)
        axis.axhline(1000, color="#d62728", linestyle="--", linewidth=1, label="1 s cadence")
        axis.set_ylim(0, top * 1.1)
        axis.set_xlim(left=0)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("sessions")
        axis.set_ylabel("p99 round (ms)")
        axis.grid(True, alpha=0.3)
        axis.xaxis.get_major_locator().set_params(integer=True)
        axis.legend(fontsize=8, loc="best")
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.suptitle("Sessions per GPU at the 1 s cadence: the most sessions with a p99 round under 1 s", fontsize=11)
    figure.tight_layout()
    path = out_dir / "sessions-per-gpu.png"
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


def plot_memory_by_region(out_dir: Path, largest: int = 6) -> Path | None:
    try:
        tails = [(key, region_families(clock, params)) for key, (clock, params) in PLANS.items()]
    except ImportError as error:
        note(f"cannot import duplexcadence ({error}); memory-by-region.png skipped")
        return None
    titles = {tail.key: tail.title for tail in results_table.TAILS}
    stateless = [titles[key] for key, families in tails if all(stock is None for _, _, stock in families)]
    tails = [(key, families) for key, families in tails if titles[key] not in stateless]
    plt = pyplot()
    figure, axes = plt.subplots(len(tails), 1, figsize=(10, 2.9 * len(tails) + 0.8), squeeze=False)
    for axis, (key, families) in zip(axes[:, 0], tails):
        families.sort(key=lambda item: -max(item[1], item[2] or 0))
        shown, rest = families[:largest], families[largest:]
        if rest:
            stocks = [s for _, _, s in rest if s is not None]
            shown.append((f"{len(rest)} others", sum(d for _, d, _ in rest), sum(stocks) if stocks else None))
        positions = list(range(len(shown)))
        demand = [mib(d) for _, d, _ in shown]
        stock = [mib(s) if s is not None else 0 for _, _, s in shown]
        axis.barh([p - 0.21 for p in positions], stock, height=0.4, color=STOCK_COLOUR, label="stock allocation")
        axis.barh([p + 0.21 for p in positions], demand, height=0.4, color=CADENCE_COLOUR, label="DuplexCadence plan")
        for position, (_, planned, stocked) in zip(positions, shown):
            axis.text(mib(planned), position + 0.21, f" {size_text(planned)}", va="center", fontsize=7.5)
            label = size_text(stocked) if stocked is not None else "no stock declared"
            axis.text(mib(stocked or 0), position - 0.21, f" {label}", va="center", fontsize=7.5)
        axis.set_yticks(positions, [name for name, _, _ in shown], fontsize=8.5)
        axis.invert_yaxis()
        axis.set_xlim(0, max(demand + stock) * 1.25)
        axis.set_xlabel("MiB per session", fontsize=8)
        declared = [(d, s) for _, d, s in families if s is not None]
        axis.set_title(
            f"{titles[key]}: {size_text(sum(d for _, d, _ in families))} planned per session; the regions that "
            f"declare stock: {size_text(sum(s for _, s in declared))} stock, {size_text(sum(d for d, _ in declared))} "
            "planned",
            fontsize=9,
        )
        axis.grid(True, axis="x", alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    title = "Memory by region family, one session (dsl plan): DuplexCadence's plan against the stock allocation"
    if stateless:
        title += f"\n({', '.join(stateless)}: stock keeps no state between seconds, nothing to compare)"
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = out_dir / "memory-by-region.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: the JSON folder")
    parser.add_argument("--no-plans", action="store_true", help="skip memory-by-region.png (it plans the stdlib)")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or args.json_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        pyplot()
    except ImportError:
        print('plot_benchmarks: needs matplotlib (pip install ".[plots]")', file=sys.stderr)
        return 2
    written = [plot_tail(tail, args.json_dir, out_dir) for tail in results_table.TAILS]
    written.append(plot_sessions(args.json_dir, out_dir))
    if not args.no_plans:
        written.append(plot_memory_by_region(out_dir))
    for path in written:
        if path is not None:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
