"""scripts/sessions_density.py (PersonaPlex's Mimi decoder: sessions per GPU, stock against lanes) runs on the CPU
as a smoke: three sessions stock, in one lane and in two; every runtime frame equals the same session's stock
frame, and the two-lane frames equal the one-lane ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("moshi")

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sessions_density.py"


def test_cpu_dry_run_compares_every_lane_count_with_stock(tmp_path):
    out = tmp_path / "density.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["kind"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["stock", "duplexcadence, 1 lane", "duplexcadence, 2 lanes"]
    for kind in ("duplexcadence, 1 lane", "duplexcadence, 2 lanes"):
        assert results[kind]["frames_compared_with_stock"] == 12
        assert results[kind]["frames_not_equal_to_stock"] == 0
        assert results[kind]["session_slots"] == 3 and results[kind]["arena_bytes"] > 0
    two_lanes = results["duplexcadence, 2 lanes"]
    assert two_lanes["frames_compared_with_duplexcadence, 1 lane"] == 12
    assert two_lanes["frames_not_equal_to_duplexcadence, 1 lane"] == 0
    assert [row["sessions"] for row in two_lanes["sweep"]] == [3]
