"""scripts/plot_benchmarks.py: it draws every figure docs/benchmarks.md shows from the committed JSON, from the
runs the tables show, with one colour per variant; the committed PNGs are exactly the ones it draws; a
figure whose data is missing is skipped with a note."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = {
    "moshi-ms-per-second.png",
    "personaplex-ms-per-second.png",
    "minicpmo45-ms-per-second.png",
    "qwen3omni-ms-per-second.png",
    "sessions-per-gpu.png",
    "memory-by-region.png",
}


def load_script():
    spec = importlib.util.spec_from_file_location("plot_benchmarks", ROOT / "scripts" / "plot_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


plot = load_script()


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > 1000, path
    assert data.rstrip(b"\0")[-8:-4] == b"IEND", path


@pytest.mark.slow
def test_it_draws_every_figure_of_the_committed_json(tmp_path):
    assert plot.main(["--out-dir", str(tmp_path)]) == 0
    assert {path.name for path in tmp_path.glob("*.png")} == FIGURES
    for path in tmp_path.glob("*.png"):
        assert_png(path)


def test_the_committed_pngs_are_the_figures_and_the_page_shows_them():
    committed = {path.name for path in (ROOT / "docs" / "benchmarks").glob("*.png")}
    assert committed == FIGURES
    for name in committed:
        assert_png(ROOT / "docs" / "benchmarks" / name)
    shown = set(re.findall(r"\(benchmarks/([\w.-]+\.png)\)", (ROOT / "docs" / "benchmarks.md").read_text()))
    assert shown == FIGURES


def test_a_tail_figure_draws_the_run_of_its_table():
    """The run of the first settled row whose DuplexCadence variant is bit-identical (PersonaPlex: the
    eager-rope run, not the compiled-rope run listed before it)."""
    for tail in plot.results_table.TAILS:
        rows = [row for row in plot.results_table.rows(tail) if row.settled]
        identical = [row for row in rows if row.cadence.get("bit_identical") is True]
        assert plot.shown_run(tail, plot.results_table.DOCS) == (identical or rows)[0].run
    personaplex = next(tail for tail in plot.results_table.TAILS if tail.key == "personaplex")
    assert "eager rope" in plot.shown_run(personaplex, plot.results_table.DOCS)["description"]


def test_every_variant_of_the_shown_runs_has_its_own_colour_and_keeps_it():
    names = {
        v["name"]
        for tail in plot.results_table.TAILS
        for v in plot.shown_run(tail, plot.results_table.DOCS)["variants"]
    }
    assert names <= set(plot.COLOURS), names - set(plot.COLOURS)
    colours = {name: plot.colour(name) for name in names}
    assert colours["duplexcadence"] != colours["moshi stock (own graphs)"]
    assert colours["duplexcadence"] == plot.CADENCE_COLOUR and colours["personaplex stock"] == plot.STOCK_COLOUR
    assert len({colours[n] for n in names if n.startswith("duplexcadence")}) == len(
        [n for n in names if n.startswith("duplexcadence")]
    )


def test_a_run_of_your_own_and_missing_data(tmp_path, capsys):
    run = {
        "command": "dsl bench moshi --device cuda --seconds 4",
        "description": "Mimi decoder, fp32, B=1",
        "device": "NVIDIA H200",
        "torch": "2.11.0",
        "stock_variant": "moshi stock (own graphs)",
        "variants": [
            {
                "name": "stock eager",
                "per_second_ms": [900.0, 140.0, 139.0, 141.0],
                "warmup_seconds": 2,
                "ms_per_s_median": 140.0,
                "peak_allocated_bytes": 2**29,
            },
            {
                "name": "moshi stock (own graphs)",
                "per_second_ms": [60.0, 29.0, 30.0, 29.5],
                "warmup_seconds": 2,
                "ms_per_s_median": 29.5,
                "peak_allocated_bytes": 2**29,
            },
            {
                "name": "duplexcadence",
                "per_second_ms": [22.0, 21.0, 21.0, 21.5],
                "warmup_seconds": 2,
                "ms_per_s_median": 21.2,
                "peak_allocated_bytes": 2**29,
            },
        ],
    }
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "moshi.json").write_text(json.dumps([run]))
    out = tmp_path / "png"
    assert plot.main(["--json-dir", str(tmp_path / "json"), "--out-dir", str(out), "--no-plans"]) == 0
    assert {path.name for path in out.glob("*.png")} == {"moshi-ms-per-second.png"}
    assert_png(out / "moshi-ms-per-second.png")
    printed = capsys.readouterr().out
    assert "plot_benchmarks: personaplex: no run with per-second series in its JSON; its figure is skipped" in printed
    assert "sessions-per-gpu.png skipped" in printed
