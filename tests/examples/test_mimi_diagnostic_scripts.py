"""The CUDA-only diagnostic scripts behind docs/benchmarks.md's sixth Moshi session: without CUDA, or with
an argument that selects nothing, they say what is wrong (and what would be legal) before any work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_state_flips_with_words_that_select_no_action_lists_the_actions():
    pytest.importorskip("moshi")
    conditions = load("mimi_step_conditions")
    with pytest.raises(SystemExit) as stopped:
        conditions.state_flips(13, 250, ["zzz", "nothing"])
    message = str(stopped.value)
    assert message.startswith(
        "--state-flips: no action's label holds 'zzz', 'nothing'; the actions are:\n  after a sync-debug probe\n"
    )
    assert "\n  after 13 stock eager frames on a new side stream\n" in message
    assert message.endswith("\n  after everything above freed")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message shown without CUDA")
def test_graph_copy_probe_without_cuda_says_so():
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "graph_copy_probe.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr == "graph_copy_probe: needs a CUDA device (it captures and replays CUDA graphs)\n"


def test_mimi_step_conditions_refuses_a_negative_count_before_any_work():
    pytest.importorskip("moshi")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "mimi_step_conditions.py"), "--graph-count", "-2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.endswith("mimi_step_conditions.py: error: --graph-count -2: give a count of 0 or more\n")
