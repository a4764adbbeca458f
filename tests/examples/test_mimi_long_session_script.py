"""scripts/mimi_long_session.py (one hour of Mimi on the GPU) runs on CPU as a smoke: 2 s of audio,
DuplexCadence beside moshi's eager decode, every frame equal, nothing moved, everything on the plan."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("moshi")

pytestmark = pytest.mark.models

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mimi_long_session.py"


@pytest.fixture
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # measured: 1.6 s a frame with two threads on a busy 2-core machine, 0.17 s with one
    yield
    torch.set_num_threads(threads)


def test_two_seconds_on_cpu_write_a_passing_result(tmp_path, capsys, one_thread):
    spec = importlib.util.spec_from_file_location("mimi_long_session", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "result.json"
    status = script.main(["--device", "cpu", "--seconds", "2", "--every", "5", "--window", "5", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0 and result["ok"]
    assert result["frames"] == 25 and result["mismatched_frames"] == 0 and result["stock_mode"] == "eager"
    assert result["spot_windows"] == {"start": {"frames": [0, 5], "mismatches": 0},
                                      "half-way": {"frames": [7, 12], "mismatches": 0},
                                      "end": {"frames": [20, 25], "mismatches": 0}}
    assert result["data_ptrs"]["regions_moved"] == [] and result["data_ptrs"]["state_moved"] == []
    assert result["data_ptrs"]["regions_start"] == result["data_ptrs"]["regions_end"]
    assert result["graphs_end"]["eager_planned"] == 3 * 25 and result["graphs_end"]["eager_off_plan"] == 0
    assert [frame for frame, _ in result["memory"]["samples"]] == [0, 5, 10, 15, 20, 25]
    assert result["checks"]["no_memory_growth"] is None  # the resident set on CPU: reported, not checked
    assert result["command"].startswith("python scripts/mimi_long_session.py --device cpu --seconds 2")
    assert "frames differing from stock: 0 of 25" in capsys.readouterr().out
