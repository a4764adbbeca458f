"""The results tables of README.md and docs/benchmarks.md are what scripts/results_table.py prints from
docs/benchmarks/*.json, and the script picks its rows by its documented rules: per configuration the latest
run with per-second series and the full set of variants, the interleaved pass when there is one, and a row
whose steady seconds have not settled left out and named."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


results_table = load_script()


def test_the_docs_tables_are_what_the_script_prints():
    stale = results_table.stale()
    assert not stale, f"out of date (run `python scripts/results_table.py --write`): {stale}"


def test_the_pages_mark_every_table():
    readme = results_table.marked((ROOT / "README.md").read_text())
    benchmarks = results_table.marked((ROOT / "docs" / "benchmarks.md").read_text())
    assert readme == ["results", "density", "serving"]
    assert sorted(benchmarks) == sorted(
        ["moshi", "personaplex", "minicpmo45", "qwen3omni", "density", "compile", "moshi-live", "long-session"]
    )


def variant(name, seconds, warmup=2, interleaved=None, **fields):
    steady = sorted(seconds[warmup:])
    record = {
        "name": name,
        "per_second_ms": seconds,
        "warmup_seconds": warmup,
        "ms_per_s_median": steady[len(steady) // 2] if len(steady) % 2 else sum(steady[len(steady) // 2 - 1 :][:2]) / 2,
        "ms_per_s_p99": max(steady),
        "peak_allocated_bytes": fields.pop("peak", 500 * 2**20),
        "bit_identical": fields.pop("bit_identical", True),
        "gpu_busy_ms_per_s": fields.pop("busy", None),
        "info": {"interleaved": {"ms_per_s_median": interleaved}} if interleaved else {},
    }
    record.update(fields)
    return record


def run(command, description, variants, stock="moshi stock (own graphs)"):
    return {
        "command": command,
        "description": description,
        "device": "NVIDIA H200",
        "driver": "580.159.04",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "stock_variant": stock,
        "variants": variants,
    }


B1 = "Mimi decoder (moshi 0.2.13), fp32, 8 codebooks, B=1, compiled rope"
B8 = "Mimi decoder (moshi 0.2.13), fp32, 8 codebooks, B=8, compiled rope"


def write(folder: Path, runs: list[dict]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "moshi.json").write_text(json.dumps(runs))
    return folder


def moshi(json_dir):
    return results_table.tail_block(results_table.TAILS[0], json_dir)


def test_the_latest_full_run_with_per_second_series_is_the_current_one(tmp_path):
    older = run(
        "bench older",
        B1,
        [
            variant("stock eager", [900, 140, 140, 141]),
            variant("moshi stock (own graphs)", [60, 30, 30, 30]),
            variant("duplexcadence", [25, 20, 20, 20]),
        ],
    )
    newer = run(
        "bench newer",
        B1,
        [
            variant("stock eager", [900, 130, 131, 130]),
            variant("moshi stock (own graphs)", [60, 28, 28, 28]),
            variant("duplexcadence", [25, 21, 21, 21]),
        ],
    )
    subset = run(
        "bench --variants duplexcadence",
        B1,
        [variant("stock eager", [900, 130, 130, 130]), variant("duplexcadence", [25, 10, 10, 10])],
    )
    no_series = run(
        "bench no series",
        B1,
        [
            dict(variant("stock eager", [1, 1, 1, 1]), per_second_ms=None),
            dict(variant("duplexcadence", [1, 5, 5, 5]), per_second_ms=None),
        ],
    )
    lines = moshi(write(tmp_path / "json", [older, newer, subset, no_series]))
    assert lines[:3] == [
        "| config | stock (shipped path), ms/s | DuplexCadence, ms/s | speed-up | peak memory, stock → DuplexCadence "
        "| bit-identical |",
        "| --- | --- | --- | --- | --- | --- |",
        "| fp32, B=1, compiled rope | 28.0 | **21.0** | **1.33x** | 500 → 500 MiB | yes |",
    ]
    text = "\n".join(lines)
    assert "`bench newer`: " + B1 in text and "bench older" not in text and "--variants" not in text
    assert "NVIDIA H200, driver 580.159.04, torch 2.11.0+cu130, CUDA 13.0" in text


def test_an_interleaved_run_gives_the_interleaved_pass(tmp_path):
    interleaved = run(
        "bench --interleave",
        B1,
        [
            variant("stock eager", [900, 130, 130, 130], interleaved=140.0),
            variant("moshi stock (own graphs)", [60, 25, 25, 25], interleaved=30.0, peak=481 * 2**20),
            variant("duplexcadence", [25, 21, 21, 21], interleaved=20.0, peak=3 * 2**30, bit_identical=False),
        ],
    )
    row = moshi(write(tmp_path / "json", [interleaved]))[2]
    assert (
        row
        == "| fp32, B=1, compiled rope (interleaved pass) | 30.0 | **20.0** | **1.50x** | 481 MiB → 3.00 GiB | **no** |"
    )


def test_a_row_that_has_not_settled_is_left_out_and_named_with_its_seconds(tmp_path):
    settled = run(
        "bench b1",
        B1,
        [
            variant("stock eager", [900, 130, 130, 130]),
            variant("moshi stock (own graphs)", [60, 28, 28, 28]),
            variant("duplexcadence", [25, 21, 21, 21]),
        ],
    )
    short = run(
        "bench b8 --seconds 6",
        B8,
        [
            variant("stock eager", [875, 220, 193, 185, 35, 40]),
            variant("moshi stock (own graphs)", [875, 220, 193, 185, 35, 40]),
            variant("duplexcadence", [11, 21, 24, 25, 24, 25]),
        ],
    )
    json_dir = write(tmp_path / "json", [settled, short])
    lines = moshi(json_dir)
    assert lines[2].startswith("| fp32, B=1, compiled rope |") and not any(
        line.startswith("| fp32, B=8") for line in lines
    )
    assert lines[4] == (
        "Left out, not settled in their run: fp32, B=8, compiled rope (`bench b8 --seconds 6`: steady seconds of moshi stock "
        "(own graphs) 193, 185, 35, 40 ms)."
    )
    table = results_table.readme_block(json_dir)
    assert [line.split(" | ")[1] for line in table[2:] if line.startswith("| Moshi")] == ["fp32, B=1, compiled rope"]


@pytest.mark.parametrize(
    ("seconds", "settled"),
    [
        ([9000, 150, 20, 21, 20, 21], True),
        ([9000, 150, 148, 122, 16, 16, 16, 16, 16, 16], True),
        ([571, 292, 105, 105, 142, 214], False),
        ([900, 50], True),
    ],
)
def test_settled_compares_the_last_half_of_the_steady_seconds_with_all_of_them(seconds, settled):
    assert results_table.settled({"per_second_ms": seconds, "warmup_seconds": 2}) is settled


def test_rewrite_replaces_the_marked_tables_only():
    text = "intro\n<!-- results_table.py: a -->\nold\nrows\n<!-- end results_table.py -->\nmiddle\n"
    text += "<!-- results_table.py: unknown -->\nkept\n<!-- end results_table.py -->\n"
    assert results_table.rewrite(text, {"a": ["| new |"]}) == (
        "intro\n<!-- results_table.py: a -->\n| new |\n<!-- end results_table.py -->\nmiddle\n"
        "<!-- results_table.py: unknown -->\nkept\n<!-- end results_table.py -->\n"
    )
    with pytest.raises(ValueError, match=re.escape("a: no `<!-- end results_table.py -->` after it")):
        results_table.rewrite("<!-- results_table.py: a -->\nold\n", {"a": ["x"]})


def test_the_density_rows_pair_each_way_of_serving_with_the_stock_of_its_own_run(tmp_path):
    sweep = lambda best: {"max_sessions_p99_under_1s": best}  # noqa: E731
    runs = [
        {
            "command": "in turn",
            "gpu": "NVIDIA H200",
            "torch": "2.11.0+cu130",
            "sessions_in_turn": {
                "stock": sweep(5),
                "duplexcadence": sweep(16),
                "chunks_compared": 75,
                "chunks_not_equal": 0,
                "duplexcadence_lanes": {},
            },
        },
        {
            "command": "lanes, first",
            "gpu": "NVIDIA H200",
            "torch": "2.11.0+cu130",
            "sessions_in_turn": {
                "stock": sweep(4),
                "chunks_compared": 0,
                "chunks_not_equal": 0,
                "duplexcadence_lanes": {
                    "4": {**sweep(24), "chunks_compared_with_stock": 25, "chunks_not_equal_to_stock": 0}
                },
            },
        },
        {
            "command": "lanes, latest",
            "gpu": "NVIDIA H200",
            "torch": "2.11.0+cu130",
            "sessions_in_turn": {
                "stock": sweep(3),
                "chunks_compared": 0,
                "chunks_not_equal": 0,
                "duplexcadence_lanes": {
                    "4": {**sweep(18), "chunks_compared_with_stock": 35, "chunks_not_equal_to_stock": 0}
                },
            },
        },
    ]
    (tmp_path / "minicpmo45.json").write_text(json.dumps({"bench": [], "sessions": runs}))
    lines = results_table.density_block(tmp_path)
    assert lines[2:4] == [
        "| MiniCPM-o 4.5, token2wav | in turn, one slot each | 5 | **16** | 3.20x | 75 chunks, 0 differ |",
        "| MiniCPM-o 4.5, token2wav | in turn, 4 lanes | 3 | **18** | 6.00x | 35 chunks, 0 differ |",
    ]
    assert lines[5] == "Commands: `in turn`, `lanes, latest`."


def test_a_sweep_that_stops_short_of_the_cadence_gives_a_lower_bound():
    def swept(best, *rounds_ms):
        return {
            "max_sessions_p99_under_1s": best,
            "sweep": [{"sessions": n, "round_ms_p99": ms} for n, ms in rounds_ms],
        }

    reached = swept(16, (12, 733.0), (16, 980.4))  # within 5 % of the cadence at its largest count
    failed_next = swept(3, (3, 838.0), (4, 1212.0))
    short = swept(18, (16, 870.0), (18, 672.0))
    assert [results_table.limit_text(s) for s in (reached, failed_next, short)] == ["16", "3", "≥ 18"]
    assert results_table.density_row("t", "how", failed_next, short, "c")[2:5] == ["3", "**≥ 18**", "≥ 6.00x"]
    assert results_table.density_row("t", "how", short, reached, "c")[2:5] == ["≥ 18", "**16**", "-"]


def test_the_readme_serving_rows_come_from_the_serve_bench_json():
    lines = results_table.serving_block()
    rows = [line.split(" | ") for line in lines[2:5]]
    assert [(row[0].lstrip("| "), row[2]) for row in rows] == [
        ("MiniCPM-o 4.5, token2wav", "**40**"),
        ("Moshi, Mimi decoder", "**≥ 768**"),
        ("Moshi, Mimi decoder", "**80**"),
    ]
    assert rows[1][1] == "lockstep groups of 32, 4 lanes, bundles of 32 (a websocket each)"
    assert lines[6].startswith("Commands: `python scripts/serve_bench.py --configs minicpmo45 ")
