"""scripts/plot_benchmarks.py on the committed JSON: every plot it can draw is a valid PNG, a plot
whose data is missing is skipped with a note, and a `dsl bench --json` run with per-second series
gets its ms-per-second plot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_script():
    spec = importlib.util.spec_from_file_location("plot_benchmarks", ROOT / "scripts" / "plot_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > 1000, path
    assert data.rstrip(b"\0")[-8:-4] == b"IEND", path


def test_plots_of_the_committed_json(tmp_path, capsys):
    assert load_script().main(["--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert_png(tmp_path / "memory-by-region.png")
    assert_png(tmp_path / "minicpmo45-density.png")  # its sessions-in-turn sweep
    for path in tmp_path.glob("*.png"):
        assert_png(path)
    for model in ("moshi", "personaplex", "qwen3omni"):
        if not (tmp_path / f"{model}-ms-per-second.png").exists():
            assert f"plot_benchmarks: {model}: no per_second_ms in its JSON" in out


def test_a_run_with_per_second_series_and_a_foreign_sweep(tmp_path, capsys):
    run = {
        "model": "toy",
        "description": "toy tail",
        "variants": [
            {"name": "stock eager", "per_second_ms": [9.0, 7.5, 7.0, 7.2], "warmup_seconds": 2},
            {"name": "duplexcadence", "per_second_ms": [5.0, 3.1, 3.0, 3.1], "warmup_seconds": 2},
            {"name": "stock step, torch.compile reduce-overhead", "per_second_ms": [], "error": "RuntimeError: no"},
        ],
    }
    density = {"lanes": {"sweep": [{"sessions": 1, "round_ms_p99": 40.0}, {"sessions": 8, "round_ms_p99": 90.0}]}}
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "toy.json").write_text(json.dumps([run, run]))
    (tmp_path / "json" / "other.json").write_text(json.dumps(density))
    assert (
        load_script().main(["--json-dir", str(tmp_path / "json"), "--out-dir", str(tmp_path / "png"), "--no-plans"])
        == 0
    )
    assert_png(tmp_path / "png" / "toy-ms-per-second.png")
    assert_png(tmp_path / "png" / "other-density.png")
    assert not (tmp_path / "png" / "memory-by-region.png").exists()
    assert "toy: no sessions sweep in its JSON; density plot skipped" in capsys.readouterr().out


def test_the_committed_pngs_are_valid():
    for name in ("memory-by-region.png", "minicpmo45-density.png"):
        assert_png(ROOT / "docs" / "benchmarks" / name)
