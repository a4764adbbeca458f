"""scripts/serve_conversations_bench.py runs on CPU as a smoke: MiniCPM-o 4.5's engine at the reduced sizes, 1 and
2 conversations in-process and through /v1/realtime; one conversation's audio through the server equals its audio
in-process (two are compared and counted: the server's rounds may group their units otherwise than the in-process
steps, and a row's arithmetic may depend on the rows stepped beside it); the JSON has every column."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "serve_conversations_bench.py"


def test_cpu_dry_run_measures_both_ways_and_the_audio_is_the_same(engine_installed, tmp_path):
    out = tmp_path / "conversations.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-dry-run", "--json", str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads(out.read_text())
    assert [row["conversations"] for row in payload["rows"]] == [1, 2]
    assert payload["rows"][0]["audio_equal_conversations"] == 1  # alone, the server's rounds are the in-process ones
    for row in payload["rows"]:
        count = row["conversations"]
        for way in ("in_process", "server"):
            assert (row[way]["refused"], row[way]["errors"], row[way]["units"]) == (None, 0, 2 * count)
        assert set(row) >= {"overhead_p50_s", "overhead_fraction_of_cadence"}
    assert payload["environment"]["device"] == "cpu" and payload["params"]["sizes"] == "reduced"
    assert done.stdout.splitlines()[-1].startswith("conversations at p99 under the cadence: in-process ")
