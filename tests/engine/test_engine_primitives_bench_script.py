"""scripts/engine_primitives_bench.py runs on the CPU as a smoke: MiniCPM-o 4.5's reduced LLM sizes, every
attention variant checked against the float64 reference, and the decoder step built on SlotKV, the engine's
attention and its sampler giving transformers' own logits row by row."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.models

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "engine_primitives_bench.py"


def test_the_cpu_smoke_checks_every_variant_and_the_decoder_step(tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("engine_primitives_bench", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "result.json"
    assert script.main(["--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["attention"]) == ["1", "3"]
    for entry in result["attention"].values():
        for name in ("masked", "sdpa_rows", "engine"):
            assert entry[f"{name}_relative_error"] < 1e-2 and entry[f"{name}_ms"] > 0
    step = result["decoder_step"]
    assert step["checked"] and step["backend"] == "torch" and step["rows"] == 3
    assert step["relative_error_vs_transformers"] < 1e-3
    assert result["shape"]["layers"] == 2 and result["command"].endswith("--device cpu --out " + str(out))
    assert capsys.readouterr().out.splitlines()[0].startswith("rows | masked over capacity")
