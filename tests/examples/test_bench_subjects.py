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

    assert _names(subject(device="cpu", seconds=1)) == ["stock eager", "duplexcadence", "duplexcadence, 2 lanes"]
    assert _names(subject(device="cpu", seconds=1, lockstep="yes"))[-1] == "duplexcadence, lockstep B=2"
    assert _names(subject(device="cpu", seconds=1, lockstep="0"))[-1] == "duplexcadence, 2 lanes"


def test_personaplex_lockstep_needs_batch_1_before_anything_runs():
    pytest.importorskip("moshi")
    from duplexcadence.examples.personaplex.bench import subject

    with pytest.raises(ValueError, match=r"run it with --batch 1, not 2$"):
        subject(device="cpu", seconds=1, batch=2, lockstep="1")
