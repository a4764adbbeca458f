"""scripts/serve_front_bench.py on the CPU, small: a lockstep group and lanes of the Mimi-shaped null tail driven
from a load-generator process; every tick answered, the JSON has the frames per second and the CPU split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_front_bench.py"


@pytest.mark.parametrize("mode", ["lockstep", "lanes"])
def test_every_tick_is_answered_and_the_cpu_per_frame_is_reported(tmp_path, mode):
    out = tmp_path / "front.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--mode", mode, "--rows", "4", "--lanes", "2", "--sessions", "3,6"]
        + ["--ticks", "5", "--workers", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["sessions"], row["frames"]) for row in rows] == [(3, 15), (6, 30)]
    for row in rows:
        assert row["mode"] == mode and row["frames_per_s"] > 0 and row["server_us_per_frame"] > 0
        assert row["latency_p50_s"] <= row["latency_p99_s"]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("| mode | sessions | paced |")
    assert lines[-1].startswith(f"| {mode} | 6 | no |")
