"""The fault-and-load harness (scripts/fault_harness.py) in CI, on the CPU and loopback: honest sessions at the
cadence beside hostile clients of every kind. The honest outputs equal stock, their p99 stays under the tick
period, the server's memory and open files stay bounded, every hostile client gets its error or close code,
and the server exits 0 on SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fault_harness.py"


def test_honest_sessions_keep_their_cadence_and_their_bits_beside_every_hostile_client(tmp_path):
    out = tmp_path / "harness.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ticks", "60", "--half-sent", "30", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    figures = json.loads(out.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert {name: row["outcome"] for name, row in figures["hostile"].items()} == {
        name: row["expected"] for name, row in figures["hostile"].items()
    }
    assert (figures["honest_ticks"], figures["honest_errors"]) == (180, {})
    assert (figures["honest_ticks_compared"], figures["honest_ticks_unequal"]) == (180, 0)
    assert figures["honest_latency_p99_s"] < figures["tick_period_s"]
    assert figures["server_rss_mib_after"] - figures["server_rss_mib_before"] < 64
    assert figures["server_fds_after"] <= figures["server_fds_before"] + 2
    assert figures["server_exit_code"] == 0
