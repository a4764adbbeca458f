"""scripts/bench_summary.py: a bench run's summary entry with the fields the docs' tables read, written into
a docs/benchmarks/<model>.json list (one run, a list, or MiniCPM-o's {"bench": [...]}); a sessions sweep
added to the file's `sessions` list."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_summary.py"
_spec = importlib.util.spec_from_file_location("bench_summary", SCRIPT)
bench_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_summary)


def variant(name: str, ms: float, peak: int, identical: bool | None, **info) -> dict:
    return {
        "name": name,
        "ms_per_s_median": ms,
        "gpu_busy_ms_per_s": ms / 2,
        "peak_allocated_bytes": peak,
        "bit_identical": identical,
        "ticks": 25,
        "info": info,
    }


PAYLOAD = {
    "model": "toy",
    "description": "toy, B=1",
    "device": "cuda",
    "gpu": "NVIDIA H200",
    "driver": "580.159.04",
    "torch": "2.11.0",
    "cuda": "13.0",
    "variants": [
        variant("stock eager", 120.0, 900, None),
        variant("stock graphs", 30.0, 800, True),
        variant("duplexcadence", 20.0, 500, True, graphs=1, stage_graphs=3),
    ],
}


def test_the_entry_has_the_summary_fields_measured_against_the_named_stock():
    entry = bench_summary.summarize(PAYLOAD, "stock graphs", "duplexcadence", "dsl bench toy")
    assert {
        k: entry[k]
        for k in (
            "model",
            "device",
            "driver",
            "stock_ms_per_s",
            "cadence_ms_per_s",
            "speedup",
            "speedup_vs_stock_eager",
            "stock_peak_bytes",
            "cadence_peak_bytes",
            "bit_identical",
            "ticks",
            "graphs",
            "stage_graphs",
        )
    } == {
        "model": "toy",
        "device": "NVIDIA H200",
        "driver": "580.159.04",
        "stock_ms_per_s": 30.0,
        "cadence_ms_per_s": 20.0,
        "speedup": 1.5,
        "speedup_vs_stock_eager": 6.0,
        "stock_peak_bytes": 800,
        "cadence_peak_bytes": 500,
        "bit_identical": True,
        "ticks": 25,
        "graphs": 1,
        "stage_graphs": 3,
    }
    assert entry["cadence_over_stock_eager_bytes"] is None  # 500 is under stock eager's 900


def test_a_cadence_peak_over_stock_eagers_is_kept_in_the_entry():
    over = {"variant": "duplexcadence", "peak_bytes": 950, "stock_variant": "stock eager", "stock_peak_bytes": 900}
    reserved = {**over, "kind": "reserved", "peak_bytes": 990, "over_bytes": 90}
    payload = {**PAYLOAD, "memory_over_stock": [reserved, {**over, "kind": "allocated", "over_bytes": 50}]}
    entry = bench_summary.summarize(payload, "stock graphs", "duplexcadence", "dsl bench toy")
    assert entry["cadence_over_stock_eager_bytes"] == 50  # the allocated peak's (a run before `kind`: the same)


def test_an_unknown_variant_is_named_with_the_ones_the_run_has():
    with pytest.raises(
        SystemExit, match="no variant named 'moshi stock'; the run has: stock eager, stock graphs, duplexcadence"
    ):
        bench_summary.summarize(PAYLOAD, "moshi stock", "duplexcadence", "dsl bench toy")


@pytest.mark.parametrize("existing", [None, "one run", "a list", "bench key"])
def test_an_entry_replaces_the_same_run_and_keeps_the_others(tmp_path, existing):
    path = tmp_path / "toy.json"
    other = {"description": "toy, B=8", "command": "dsl bench toy --batch 8"}
    entry = bench_summary.summarize(PAYLOAD, "stock graphs", "duplexcadence", "dsl bench toy")
    stale = {**entry, "speedup": 0.5}
    if existing == "one run":
        path.write_text(json.dumps(other))
    elif existing == "a list":
        path.write_text(json.dumps([other, stale]))
    elif existing == "bench key":
        path.write_text(json.dumps({"bench": [other, stale], "sessions_in_turn": {"sweep": []}}))
    bench_summary.add(entry, path)
    document = json.loads(path.read_text())
    entries = document["bench"] if existing == "bench key" else document
    expected = [entry] if existing is None else [other, entry]
    assert entries == expected
    if existing == "bench key":
        assert document["sessions_in_turn"] == {"sweep": []}


def test_two_duplexcadence_variants_of_one_run_are_two_entries(tmp_path):
    """One run summarised against two DuplexCadence variants (one lane, lanes) keeps both; an entry written
    before `cadence_variant` existed counts as the "duplexcadence" one and is replaced by it."""
    path = tmp_path / "toy.json"
    payload = {**PAYLOAD, "variants": PAYLOAD["variants"] + [variant("duplexcadence, 2 lanes", 15.0, 500, True)]}
    first = bench_summary.summarize(payload, "stock graphs", "duplexcadence", "dsl bench toy")
    old = {k: v for k, v in first.items() if k != "cadence_variant"}
    path.write_text(json.dumps([old]))
    lanes = bench_summary.summarize(payload, "stock graphs", "duplexcadence, 2 lanes", "dsl bench toy")
    bench_summary.add(lanes, path)
    bench_summary.add(first, path)
    assert [e["cadence_variant"] for e in json.loads(path.read_text())] == ["duplexcadence, 2 lanes", "duplexcadence"]
    assert lanes["speedup"] == 2.0


@pytest.mark.parametrize("existing", [None, "bench runs", "bench key"])
def test_a_sessions_sweep_is_appended_to_the_sessions_list(tmp_path, existing):
    path = tmp_path / "minicpmo45.json"
    old = {"command": "older sweep", "sessions_in_turn": {"stock": {}}}
    if existing == "bench runs":
        path.write_text(json.dumps([{"description": "run", "variants": []}]))
    elif existing == "bench key":
        path.write_text(json.dumps({"bench": [], "sessions": [old]}))
    payload = {"gpu": "NVIDIA H200", "torch": "2.11.0", "bench": [], "sessions_in_turn": {"stock": {"sweep": []}}}
    entry = bench_summary.add_sessions(payload, "python scripts/minicpmo45_gpu_bench.py --part sessions", path)
    assert entry == {
        "gpu": "NVIDIA H200",
        "torch": "2.11.0",
        "command": "python scripts/minicpmo45_gpu_bench.py --part sessions",
        "sessions_in_turn": {"stock": {"sweep": []}},
    }
    document = json.loads(path.read_text())
    assert document["sessions"] == ([old, entry] if existing == "bench key" else [entry])
    assert document["bench"] == ([{"description": "run", "variants": []}] if existing == "bench runs" else [])
    with pytest.raises(SystemExit, match="no sessions_in_turn"):
        bench_summary.add_sessions({"bench": []}, "x", path)
