"""scripts/lockstep_density.py (sessions per GPU with lockstep groups) runs on CPU as a smoke: one session,
then two more (one joins the running group late), every kind served; the lockstep rows equal moshi's own
batched decode with row resets, and the in-turn runtime equals moshi in turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("moshi")

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lockstep_density.py"


def test_cpu_dry_run_serves_every_kind_and_the_lockstep_rows_equal_moshis_batched_decode(tmp_path):
    out = tmp_path / "lockstep.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["kind"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == [
        "moshi stock, in turn",
        "duplexcadence, in turn",
        "moshi stock, batched B=2",
        "duplexcadence, lockstep B=2",
    ]
    lockstep = results["duplexcadence, lockstep B=2"]
    assert lockstep["groups"] == 2 and [row["sessions"] for row in lockstep["sweep"]] == [1, 3]
    # 2 rounds (1 warm-up, 1 measured) of 2 frames per count: session 0 decodes 8 frames, sessions 1 and 2 4 each
    assert lockstep["frames_compared_with_moshi stock, batched B=2"] == 16
    assert lockstep["frames_not_equal_to_moshi stock, batched B=2"] == 0
    assert results["duplexcadence, in turn"]["frames_not_equal_to_moshi stock, in turn"] == 0
    assert results["duplexcadence, in turn"]["frames_compared_with_moshi stock, in turn"] == 16
