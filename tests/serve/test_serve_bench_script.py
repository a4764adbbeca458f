"""scripts/serve_bench.py runs on CPU as a smoke: the toy tail through the server at 1 and 2 sessions (every
sampled tick equal to stock), one of them from a load-generator process, a lanes sweep (a server per lanes
value), `--lanes` and `--counts` overriding a configuration's, and, with moshi installed, Mimi in lockstep
groups of 2 (every sampled row equal to moshi's batched decode of its group); the JSON has every column and
the table comes last."""

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
    configs = "toy,toy-lanes,moshi-lockstep" if importlib.util.find_spec("moshi") else "toy,toy-lanes"
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
    results = {(result["config"], result["lanes"]): result for result in payload["results"]}
    toy = results[("toy", 2)]
    assert [row["sessions"] for row in toy["sweep"]] == [1, 2]
    assert [(row["here"], row["workers"]) for row in toy["sweep"]] == [(1, 0), (1, 1)]
    for row in toy["sweep"]:
        assert row["opened"] == row["sessions"] and row["errors"] == []
        assert row["ticks"] == 3 * row["sessions"]
        assert (row["sampled_ticks_compared"], row["sampled_ticks_differing"]) == (3, 0)
        for key in ("latency_p99_s", "direct_round_p50_s", "server_round_p50_s", "overhead_p50_s", "predicted_tick_s"):
            assert row[key] is not None, key
    assert toy["tick_period_s"] == 0.08 and toy["admission_capacity_sessions"] <= 2
    guard_open = None  # the last count before the first whose server p99 passes the 68 ms budget
    for row in toy["sweep"]:
        if row["server_tick_p99_s"] > 0.068:
            break
        guard_open = row["sessions"]
    assert toy["latency_guard_open_sessions"] == guard_open
    assert [point[0] for point in toy["tick_model"]["points"]] == [1, 2]
    assert [result["lanes"] for result in payload["results"] if result["config"] == "toy-lanes"] == [1, 2]
    if ("moshi-lockstep", 1) in results:
        lockstep = results[("moshi-lockstep", 1)]
        assert lockstep["lockstep"] == 2 and [row["sessions"] for row in lockstep["sweep"]] == [1, 3]
        assert all(row["opened"] == row["sessions"] and row["errors"] == [] for row in lockstep["sweep"])
        for row in lockstep["sweep"]:  # the sampled row against its group's batched stock: equal, every tick
            assert (row["sampled_ticks_compared_with_group"], row["sampled_ticks_differing_from_group"]) == (2, 0)
            assert row["sampled_ticks_compared"] == 2  # and against a batch-1 decode: counted, not required
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("| configuration | sessions at p99 < period | admission's limit | latency guard still ")
    assert lines[2].startswith("| toy | ")
    assert lines[3].startswith("| toy-lanes (1 lanes) | ") and lines[4].startswith("| toy-lanes (2 lanes) | ")


def test_lanes_and_counts_override_the_configuration(tmp_path):
    out = tmp_path / "serve.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--configs", "toy", "--lanes", "1", "--counts", "2"]
        + ["--sample", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert (result["config"], result["lanes"], [row["sessions"] for row in result["sweep"]]) == ("toy", 1, [2])
