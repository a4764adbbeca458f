"""scripts/mimi_graph_trace.py (where the GPU idles inside a Mimi frame) runs only on CUDA; its per-frame
arithmetic is checked here on a made-up timeline, and without CUDA it says so and exits 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mimi_graph_trace.py"
_spec = importlib.util.spec_from_file_location("mimi_graph_trace", SCRIPT)
graph_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(graph_trace)


def test_busy_span_idle_and_gaps_of_overlapping_operations():
    operations = [
        (0.0, 10.0, "k1"),
        (12.0, 20.0, "Memcpy DtoD (Device -> Device)"),
        (15.0, 18.0, "k2"),
        (30.0, 35.0, "k3"),
    ]
    summary = graph_trace.frame_summary(operations, top=2)
    assert {k: summary[k] for k in ("operations", "kernel", "memcpy", "memset", "busy_us", "span_us", "idle_us")} == {
        "operations": 4,
        "kernel": 3,
        "memcpy": 1,
        "memset": 0,
        "busy_us": 23.0,
        "span_us": 35.0,
        "idle_us": 12.0,
    }
    assert summary["largest_gaps"] == [
        {"us": 10.0, "after": "k2", "before": "k3"},
        {"us": 2.0, "after": "k1", "before": "Memcpy DtoD (Device -> Device)"},
    ]
    assert summary["sequence"] == [[0.0, "k1"], [2.0, "Memcpy DtoD (Device -> Device)"], [-5.0, "k2"], [12.0, "k3"]]
    assert graph_trace.frame_summary([], top=2) == {"operations": 0}


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message shown without CUDA")
def test_without_cuda_it_says_so():
    done = subprocess.run([sys.executable, str(SCRIPT), "--frames", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == "mimi_graph_trace: needs a CUDA device (it traces graph replays on the GPU)\n"


def test_operation_difference_lists_what_differs_in_count_or_time_largest_first():
    ours = {"copy": [27, 36.3], "add": [45, 70.4], "gemv": [24, 150.0], "same": [8, 260.0]}
    theirs = {"copy": [10, 13.5], "add": [29, 48.8], "gemv": [24, 150.5], "same": [8, 260.4], "memcpy": [29, 26.2]}
    assert graph_trace.operation_difference(ours, theirs) == [
        {"name": "memcpy", "count": [0, 29], "us": [0.0, 26.2]},
        {"name": "copy", "count": [27, 10], "us": [36.3, 13.5]},
        {"name": "add", "count": [45, 29], "us": [70.4, 48.8]},
    ]
