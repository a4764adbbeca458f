"""Moshi's live duplex loop (examples/moshi/live.py) through its CLI, on CPU with the tiny LM config.

One second of frames: Mimi encode -> LMGen.step (moshi's LM at a tiny size of the released
architecture) -> both decoders on the same tokens. Checks the JSON the script writes and that the two
decoders' PCM are equal; never checks timings (this machine is shared).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("moshi")

import duplexcadence
from duplexcadence.examples.moshi import live

PACKAGE = Path(duplexcadence.__file__).parent  # the repo root is the package
IMPORT_ROOT = Path(duplexcadence.__file__).parent.parent  # where `import duplexcadence` found it


def test_seconds_group_frames_by_their_start_time():
    # 12.5 frames per second: second 0 = frames 0..12 (13), second 1 = frames 13..24 (12)
    values = [1.0] * 30
    assert live.seconds_of(values) == [13.0, 12.0]
    assert live.seconds_of([1.0] * 12) == []
    assert live.seconds_of(list(range(25))) == [sum(range(13)), sum(range(13, 25))]


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert live.percentile(values, 99) == 99
    assert live.percentile(values, 50) == 50
    assert live.percentile([3.0, 1.0, 2.0], 99) == 3.0


def test_tiny_config_is_the_released_architecture_smaller():
    released, tiny = live.lm_kwargs("released"), live.lm_kwargs("tiny")
    assert released["dim"] == 4096 and released["num_layers"] == 32 and released["depformer_num_layers"] == 6
    assert set(released) == set(tiny)
    changed = {key for key in released if released[key] != tiny[key]}
    assert changed == set(live.TINY_LM_OVERRIDES)
    for key in ("n_q", "dep_q", "card", "text_card", "delays", "context", "depformer_weights_per_step"):
        assert tiny[key] == released[key]


@pytest.mark.models
def test_released_lm_is_built_where_asked_in_bf16():
    # on the meta device: no memory, but every parameter must land there (nothing initialised on the CPU)
    import torch

    lm = live.build_lm("released", device="meta")
    params = list(lm.parameters())
    assert sum(p.numel() for p in params) == 7_687_729_152
    assert {p.device.type for p in params} == {"meta"} and {p.dtype for p in params} == {torch.bfloat16}


@pytest.mark.models
@pytest.mark.slow
def test_cli_tiny_lm_on_cpu(tmp_path):
    out = tmp_path / "live.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMPORT_ROOT), env.get("PYTHONPATH")]))
    env.pop("NO_TORCH_COMPILE", None)
    result = subprocess.run(
        [
            sys.executable,
            str(PACKAGE / "scripts" / "moshi_live_duplex.py"),
            "--device",
            "cpu",
            "--lm-config",
            "tiny",
            "--seconds",
            "1",
            "--warmup-frames",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "bit-identical: all 12 decoded frames torch.equal" in result.stdout
    assert "frame loop" in result.stdout and "SPEAK (Mimi decode)" in result.stdout

    payload = json.loads(out.read_text())
    env_json = payload["environment"]
    assert env_json["torch"] and env_json["device"] == "cpu" and env_json["device_name"]
    assert env_json["moshi"] == "0.2.13" and env_json["moshi_torch_compile"] is False
    assert env_json["cudnn_deterministic"] is True
    config = payload["config"]
    assert config["lm_config"] == "tiny" and config["frames"] == 13 and config["sampling"] == "moshi"
    assert config["lm_params"] == 11_145_344
    # the LM emits no tokens on its first step: 12 of 13 frames decode, both sides, equal
    assert payload["bit_identical"] is True
    assert payload["frames_compared"] == 12 and payload["frames_differing"] == 0
    assert payload["pcm_rms"] > 1e-3  # not silence
    for key in ("listen", "think", "speak_stock", "speak_duplexcadence", "loop_stock", "loop_duplexcadence"):
        frame, second = payload["per_frame"][key], payload["per_second"][key]
        assert frame["n"] == (12 if key.startswith("speak") else 13)
        assert second["n"] == 1
        for stats in (frame, second):
            assert stats["mean_ms"] > 0 and stats["max_ms"] >= stats["p99_ms"] >= stats["p50_ms"] > 0
    assert payload["cadence_ms"] == {"frame": 80.0, "second": 1000.0}
    assert payload["per_second"]["loop_stock"]["budget_ms"] == 1000.0
    assert len(payload["frames_ms"]["speak_stock"]) == 13 and payload["frames_ms"]["speak_stock"][0] is None
    assert payload["runtime"]["eager_planned"] + payload["runtime"]["eager_off_plan"] > 0  # CPU: no graphs
    assert payload["runtime"]["replays"] == 0
    assert "memory" not in payload
