"""Hover on the duplex unit's constructs: a bounded clock, a stage on it with its rows, a region with a
run-time length and its capacity from the plan."""

from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.interpreter.lsp.analysis import analyse, hover_text


def test_hover_says_what_is_counted_at_run_time():
    path = stdlib_path("models.minicpmo45_duplex")
    analysis = analyse(str(path), path.read_text())
    assert hover_text(analysis, "llm_token") == (
        "**clock llm_token**: up to 21 ticks at each tick of `unit` (1 Hz), the count decided at run time\n"
        "- stages on it: llm_step"
    )
    stage = hover_text(analysis, "llm_step") or ""
    assert stage.startswith("**stage llm_step** on `llm_token` (up to 21 per unit): hook `llm_step`\n")
    assert "- batched: runs on 1 to 16 conversations at once, a graph per row count" in stage
    assert (
        "- fires up to 21 times at each of its instants, the count decided at run time (1 per cadence of 1 s)" in stage
    )
    region = hover_text(analysis, "llm_kv") or ""
    assert "- clock `llm_position` at up to 32 per unit" in region
    assert "- its length is decided at run time: handed whole, at its capacity" in region
    assert "- retain slide 4000 to 3500, start given 43" in region
    assert "- plan: capacity 4032 units, shape [36, 2, 8, 4032, 128], 567.0 MiB" in region
