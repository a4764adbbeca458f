"""scripts/serve_bench.py runs on CPU as a smoke: the toy tail through the server at 1 and 2 sessions (every
sampled tick equal to stock), one of them from a load-generator process, and, with moshi installed, Mimi in
lockstep groups of 2; the JSON has every column and the table comes last."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_bench.py"


def test_cpu_dry_run_measures_every_count_and_compares_the_sampled_sessions_with_stock(tmp_path):
    configs = "toy,moshi-lockstep" if importlib.util.find_spec("moshi") else "toy"
    out = tmp_path / "serve.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--configs", configs, "--workers", "1", "--sample", "1"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads(out.read_text())
    results = {result["config"]: result for result in payload["results"]}
    toy = results["toy"]
    assert [row["sessions"] for row in toy["sweep"]] == [1, 2]
    assert [(row["here"], row["workers"]) for row in toy["sweep"]] == [(1, 0), (1, 1)]
    for row in toy["sweep"]:
        assert row["opened"] == row["sessions"] and row["errors"] == []
        assert row["ticks"] == 3 * row["sessions"]
        assert (row["sampled_ticks_compared"], row["sampled_ticks_differing"]) == (3, 0)
        for key in ("latency_p99_s", "direct_round_p50_s", "server_round_p50_s", "overhead_p50_s", "predicted_tick_s"):
            assert row[key] is not None, key
    assert toy["tick_period_s"] == 0.08 and toy["admission_capacity_sessions"] <= 2
    assert [point[0] for point in toy["tick_model"]["points"]] == [1, 2]
    if "moshi-lockstep" in results:
        lockstep = results["moshi-lockstep"]
        assert lockstep["lockstep"] == 2 and [row["sessions"] for row in lockstep["sweep"]] == [1, 3]
        assert all(row["opened"] == row["sessions"] and row["errors"] == [] for row in lockstep["sweep"])
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("| configuration | sessions at p99 < period | admission's limit |")
    assert lines[2].startswith("| toy | ")
