"""scripts/memory_vs_stock.py (every released tail's peak memory, stock eager against DuplexCadence, on a GPU)
runs on the CPU on the toy tail as a smoke: both variants, both passes, the JSON by tail and the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "memory_vs_stock.py"


def test_cpu_smoke_on_the_toy_writes_each_tails_run_and_the_table(tmp_path):
    out = tmp_path / "memory.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tails", "toy", "--seconds", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(out.read_text())["toy"]
    assert [variant["name"] for variant in run["variants"]] == ["stock eager", "duplexcadence"]
    assert run["variants"][1]["bit_identical"] is True and "interleaved" in run["variants"][1]["info"]
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == "Peak memory, stock eager vs DuplexCadence, each variant from a fresh peak (cpu; allocated / reserved)"
    )
    assert lines[-1].split()[:2] == ["toy", "-"] and " yes " in lines[-1]


def test_an_unknown_tail_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tails", "mimi", "--json", str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "unknown tail(s) mimi; choose from moshi, personaplex, minicpmo45, qwen3omni, toy" in done.stderr
