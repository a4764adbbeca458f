"""`dsl bench --trace DIR`: each variant's profiled ticks as a Chrome trace file, summarised per variant (device
operations, busy time, the span and the idle time inside it, the largest gaps with the operations on both sides)."""

from __future__ import annotations

import json

import pytest
import torch

from duplexcadence.interpreter.bench import timeline_summary
from duplexcadence.interpreter.bench.trace import trace_file
from duplexcadence.interpreter.cli import main as cli


def test_busy_span_idle_and_gaps_of_overlapping_operations():
    operations = [
        (0.0, 10.0, "k1"),
        (12.0, 20.0, "Memcpy DtoD (Device -> Device)"),
        (15.0, 18.0, "k2"),
        (30.0, 35.0, "k3"),
    ]
    summary = timeline_summary(operations, top=2)
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
    assert summary["heaviest"][:2] == [
        {"name": "k1", "count": 1, "us": 10.0},
        {"name": "Memcpy DtoD (Device -> Device)", "count": 1, "us": 8.0},
    ]
    assert timeline_summary([], top=2) == {"operations": 0}


def test_trace_files_are_named_after_the_subject_and_the_variant(tmp_path):
    assert (
        trace_file(tmp_path, "moshi", "moshi stock (own graphs)")
        == tmp_path / "moshi-moshi-stock-own-graphs.trace.json"
    )


def test_trace_writes_a_chrome_trace_per_variant_on_cpu(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = cli.main(
            ["bench", "toy", "--device", "cpu", "--seconds", "1", "--no-progress", "--trace", str(tmp_path / "traces")]
        )
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    assert code == 0, err
    written = sorted(path.name for path in (tmp_path / "traces").iterdir())
    assert written == ["toy-duplexcadence.trace.json", "toy-stock-eager.trace.json"]
    for name in written:
        events = json.loads((tmp_path / "traces" / name).read_text())["traceEvents"]
        assert any(event.get("ph") == "X" for event in events)  # the host's operations, on CPU
    lines = out.splitlines()
    for variant, name in (("stock eager", written[1]), ("duplexcadence", written[0])):
        assert f"  {variant}: trace {tmp_path / 'traces' / name} (12 ticks, no device operations)" in lines


@pytest.mark.gpu
def test_trace_on_cuda_summarises_the_device_operations(tmp_path, capsys):
    code = cli.main(["bench", "toy", "--device", "cuda", "--seconds", "2", "--no-progress", "--trace", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    payload = [line for line in out.splitlines() if ": trace " in line]
    assert len(payload) == 2 and all("device operations a tick" in line for line in payload)
