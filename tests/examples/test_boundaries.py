"""Chunk boundaries on every shipped tail, on the CPU: the plan's sample totals are what each stream emits,
and each stream is measured against one offline call of the stock model.

The streams are `scripts/boundary_report.py`'s variants at its CPU sizes (a reduced Qwen3-Omni chunked
network and MiniCPM-o tail; Mimi and Qwen3-Omni's streaming clock at the released size), over short
sessions: a few seconds of the 1 s tails, a few frames or codes of the 80 ms ones. The script runs the
60 s sessions on the GPU (docs/benchmarks.md, "Chunk boundaries").
"""

from __future__ import annotations

import importlib.util
import json
from fractions import Fraction
from pathlib import Path

import pytest

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.interpreter.runtime.offline import verify_offline

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("boundary_report", ROOT / "scripts" / "boundary_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU
WINDOW = 240  # 10 ms at 24 kHz


def needs(*modules: str) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")


def run(tail: str, variant: str, seconds: Fraction) -> dict:
    [chosen] = [
        v for v in report.VARIANTS[tail]("cpu", seconds, True) if v.name == variant or v.name.startswith(variant + " ")
    ]
    return report.run_variant(chosen, seconds, WINDOW)


def test_the_stock_qwen_loop_is_555_samples_short_at_each_boundary_as_its_clock_declares():
    needs("transformers")
    from duplexcadence.examples.qwen3omni.model import forward_sample_deficit

    row = run("qwen3omni", "stock chunked loop", Fraction(3))  # 3 seconds: 12 + 13 + 12 codes
    measured = row["measured"]
    assert (measured["steps"], measured["stream_length"], measured["offline_length"]) == (
        3,
        37 * 1920 - 3 * 555,
        37 * 1920 - 555,
    )
    assert measured["length_difference"] == 2 * 555 == row["plan"]["dropped"]
    assert row["plan_matches_run"] and row["boundary_loss_flagged"]
    write = load_program(stdlib_path("models.qwen3_omni_code2wav")).stages["decode"].accesses[-1]
    model = report.VARIANTS["qwen3omni"]("cpu", Fraction(1), True)[0].make_stream().model
    assert write.loss == forward_sample_deficit(model) == 555
    # before the first boundary the stream is one forward's output; after it, 555 samples early
    assert measured["max_at"] >= 12 * 1920 - 555 - WINDOW and measured["max_abs_diff"] > 0


def test_the_corrected_stock_loop_keeps_every_sample():
    needs("transformers")
    from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder, split_into_seconds

    variant = report.VARIANTS["qwen3omni"]("cpu", Fraction(3), True)[0]
    corrected = StockSecondDecoder(variant.make_stream().model, corrected=True)
    result = verify_offline(corrected, variant.offline, list(split_into_seconds(variant.whole[..., :37])))
    assert result.lengths_equal and result.stream_length == 37 * 1920 - 555


def test_the_qwen_runtime_emits_what_the_plan_counts():
    needs("transformers")
    row = run("qwen3omni", "DuplexCadence, models.qwen3_omni_code2wav", Fraction(3))
    assert row["plan_matches_run"] and row["measured"]["length_difference"] == 2 * 555


def test_the_qwen_streaming_clock_keeps_every_sample():
    needs("transformers")
    row = run("qwen3omni", "DuplexCadence, models.qwen3_omni_code2wav_streaming", Fraction(8, 25))  # 4 codes
    measured = row["measured"]
    assert row["plan_matches_run"] and not row["boundary_loss_flagged"]
    assert measured["stream_length"] == measured["offline_length"] == 4 * 1920 - 555
    assert measured["max_abs_diff"] < 1e-4  # rounding: per-code kernels against one 4-code forward


@pytest.mark.parametrize(
    ("tail", "variant"),
    [
        ("moshi", "DuplexCadence, models.mimi_decoder"),
        ("personaplex", "DuplexCadence, models.personaplex_mimi_decoder"),
    ],
)
def test_the_mimi_runtimes_emit_every_sample_of_the_offline_decode(tail, variant):
    needs("moshi")
    row = run(tail, variant, Fraction(6, 25))  # 3 frames
    measured = row["measured"]
    assert row["plan_matches_run"] and measured["stream_length"] == measured["offline_length"] == 3 * 1920
    assert measured["max_abs_diff"] < 1e-5


def test_the_minicpmo45_runtime_flushes_its_lookahead_and_cross_fade_at_the_end_of_the_turn():
    needs("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
    row = run("minicpmo45", "DuplexCadence, models.step_audio2_token2wav", Fraction(2))
    measured = row["measured"]
    assert row["end"] == "flush" and row["plan_matches_run"]
    # 2 chunks, then the end of the turn: the 3 priming tokens and 50 new ones, 960 samples each
    assert measured["steps"] == 3 and measured["stream_length"] == measured["offline_length"] == (3 + 50) * 960


def test_the_script_writes_its_json_and_prints_a_table(tmp_path, capsys):
    needs("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
    out = tmp_path / "boundaries.json"
    assert report.main(["--device", "cpu", "--seconds", "1", "--tails", "minicpmo45", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [row["variant"] for row in data["rows"]] == [
        "stock Token2wav.stream, one turn",
        "DuplexCadence, models.step_audio2_token2wav",
    ]
    assert data["small"] and data["window_samples"] == WINDOW and data["environment"]["device"] == "cpu"
    stock, runtime = data["rows"]
    assert stock["measured"]["stream_length"] == runtime["measured"]["stream_length"] == (3 + 25) * 960
    assert stock["measured"]["max_abs_diff"] == runtime["measured"]["max_abs_diff"]  # bit-identical streams
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["tail", "variant", "steps", "stream"] and len(table) == 3
