"""scripts/serve_cluster_bench.py on CPU (the dry run of the multi-GPU measurement): the toy tail on 1 then 2
CPU replicas of a local 2-CPU Ray, the search's loads, the sampled sessions equal to stock, a replica killed
mid-run (its sessions lost, the others complete and equal to stock) and one drained (no new session there,
its own sessions complete). Timing decides nothing here: the pass of a session count is not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve_cluster_bench.py"


@pytest.mark.slow
def test_cpu_dry_run_scales_places_kills_and_drains(tmp_path):
    out = tmp_path / "cluster.json"
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--tail", "toy", "--gpus", "1,2", "--ray-cpus", "2"]
    command += ["--cpus-per-replica", "0.5", "--max-runs", "1", "--ticks", "9", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["tail"], result["device"], result["slots"], result["ticks"]) == ("toy", "cpu", 3, 9)
    assert [row["replicas"] for row in result["counts"]] == [1, 2]
    for row in result["counts"]:
        (run,) = row["runs"]
        assert run["opened"] == run["sessions"] and sum(run["per_replica"].values()) == run["sessions"]
        assert len(run["per_replica"]) == row["replicas"]  # the predicted sessions fill every replica
        if row["passing"] is not None:
            assert row["verify"]["unequal"] == 0 and row["verify"]["ticks"] > 0
    kill = result["faults"]["kill"]
    assert kill["victim_sessions"] > 0 and kill["victim_errors"] == {"replica-lost": kill["victim_sessions"]}
    assert kill["survivors"] > 0 and kill["survivors_complete"] == kill["survivors"]
    assert kill["verify_survivors"]["unequal"] == 0 and kill["verify_survivors"]["ticks"] > 0
    assert kill["verify_victims_before_loss"]["unequal"] == 0
    drain = result["faults"]["drain"]
    assert drain["new_load"]["opened"] > 0 and drain["new_on_drained"] == 0
    assert drain["drained_sessions"] > 0 and drain["drained_complete"] == drain["drained_sessions"]
    assert drain["verify_drained"]["unequal"] == 0 and drain["verify_drained"]["ticks"] > 0
    assert done.stdout.splitlines()[-5].startswith("GPUs | sessions at p99 < deadline")
