"""scripts/conversations_bench.py runs on the CPU as a smoke: MiniCPM-o 4.5 at the reduced sizes, the live loop
serving one conversation in turn beside the engine stepping two, and one conversation's audio against the stock
tail fed its speech tokens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = [pytest.mark.models, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "conversations_bench.py"


def test_the_cpu_smoke_runs_both_sides_and_verifies_the_tail(tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("conversations_bench", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "conv.json"
    argv = ["--counts", "2", "--baseline", "1", "--units", "2", "--warmup-units", "1", "--verify", "1"]
    assert script.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["sizes"] == "reduced" and result["config"]["counts"] == [2]
    assert result["baseline"]["1"]["tails_equal"] is True
    assert result["baseline"]["1"]["round_stock_tail"]["n"] == 2
    engine = result["engine"]
    assert engine["counts"]["2"]["round"]["n"] == 2
    assert set(engine["counts"]["2"]["stage_ms"]) >= {"listen", "llm", "tts", "tail"}
    plan, allocated = engine["plan_bytes_per_conversation"], engine["allocated_per_conversation"]
    assert abs(allocated - plan) <= 0.05 * plan
    assert result["tail_vs_stock"]["conversations"] == 1 and result["tail_vs_stock"]["units_differing"] == 0
    assert result["tail_vs_stock"]["chunks_compared"] > 0
    assert result["all_equal"] is True
    assert "engine, batched" in capsys.readouterr().out
