"""Every model's `dsl bench` subject is built from its options without running a model: the variants
each option adds (opt-in modes are never in the default run) and what it records in the JSON."""

from __future__ import annotations

import pytest


def _names(subject) -> list[str]:
    return [variant.name for variant in subject.variants]


def test_qwen3omni_streaming_is_opt_in():
    pytest.importorskip("transformers")
    from duplexcadence.examples.qwen3omni.bench import subject

    plain = subject(device="cpu", seconds=1, dtype="bf16")
    streaming = subject(device="cpu", seconds=1, dtype="bf16", streaming="1")
    assert not any("streaming" in name for name in _names(plain))
    assert _names(streaming)[len(_names(plain)) :] == [
        "streaming (eager, opt-in)",
        "streaming under DuplexCadence (opt-in)",
    ]
    assert (plain.extra["streaming"], streaming.extra["streaming"]) == (False, True)


def test_personaplex_lockstep_is_opt_in():
    pytest.importorskip("moshi")
    from duplexcadence.examples.personaplex.bench import subject

    assert _names(subject(device="cpu", seconds=1)) == [
        "stock eager",
        "duplexcadence",
        "duplexcadence, 2 lanes",
        "duplexcadence, other_mimi pruned",
        "duplexcadence, both instances in one session",
    ]
    assert _names(subject(device="cpu", seconds=1, lockstep="yes"))[-1] == "duplexcadence, lockstep B=2"
    assert _names(subject(device="cpu", seconds=1, lockstep="0"))[-1] == "duplexcadence, both instances in one session"


@pytest.mark.models
@pytest.mark.slow
def test_personaplex_bench_shows_all_work_and_pruned_bit_identical_on_cpu():
    """`dsl bench personaplex` in miniature on the CPU: all of stock's work (two sessions, in two lanes) and
    the server's clock with other_mimi pruned, or not, each compared frame by frame with stock eager (the
    pruned and one-session variants on `main`, the PCM the server sends)."""
    pytest.importorskip("moshi")
    from duplexcadence.examples.personaplex.bench import subject
    from duplexcadence.interpreter import bench

    made = subject(device="cpu", seconds=1)
    results = bench.run(made, 4, progress=False, profile=False)
    assert {r.name: r.bit_identical for r in results} == {name: True for name in _names(made)}
    by_name = {r.name: r.info for r in results}
    pruned = by_name["duplexcadence, other_mimi pruned"]
    assert pruned["pruned_stages"] == ["other_upsample", "other_transformer", "other_seanet"]
    assert pruned["compared_outputs"] == ["main"] and len(pruned["stages"]) == 4
    everything = by_name["duplexcadence, both instances in one session"]
    assert everything["pruned_stages"] == [] and len(everything["stages"]) == 7
    # one instance's session block and scratch; both instances' in one session; two sessions of one instance
    assert pruned["arena_bytes"] == 8_251_392 + 11_776
    assert everything["arena_bytes"] == 16_502_784 + 19_456
    assert by_name["duplexcadence"]["arena_bytes"] == 2 * 8_251_392 + 11_776
    assert "compared_outputs" not in by_name["duplexcadence, 2 lanes"]


def test_personaplex_lockstep_needs_batch_1_before_anything_runs():
    pytest.importorskip("moshi")
    from duplexcadence.examples.personaplex.bench import subject

    with pytest.raises(ValueError, match=r"run it with --batch 1, not 2$"):
        subject(device="cpu", seconds=1, batch=2, lockstep="1")
