"""Drafting a model that needs the constructs of language.md section 4.8: the toy encoder of
`duplexcadence.examples.toy.encoder` keeps its state in a cache object its stock call takes and returns,
pads its first conv by replicating the first sample, keeps empty caches for its 1x1 and strided convs,
and counts its steps on the host. The draft declares each, passes `dsl check`, runs bit-identical to the
stock loop with a two-line hook, and declares what the reviewed `encoder.clock` declares."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.examples.toy.encoder import SAMPLES, EncoderStockStream, build_encoder, make_audio, new_cache
from duplexcadence.examples.toy.encoder import stock_loop as encoder_loop
from duplexcadence.interpreter.draft.draft import draft
from duplexcadence.interpreter.runtime.runtime import Runtime


def test_the_draft_declares_the_cache_object_the_counter_the_empty_caches_and_the_replicated_history():
    result = draft(encoder_loop())
    assert result.check.ok and not result.check.diagnostics, result.text
    text = result.text
    for line in (
        "object state from new_state",
        'counter step_count +2 on call bind state "step"',
        "region pcm : f32[1, 1, time] on frame input retain last 2 start first",
        'region convs[conv < 2] : f32[1, 8, time] on frame retain last 0 start empty\n    bind state "convs.{conv + 1}"',
        'region keys : f32[1, 2, time, 4] on frame_x1_8 retain last 6 start empty stock 8\n    bind state "keys"',
        "    read pcm new + 2\n    update state\n",
    ):
        assert line in text, line
    assert "# a host int at state.step: 0, 2, 4, ... (+2 a call)" in text
    assert "before the first call that history was copies of the first unit of 'pcm' (replicate padding)" in text
    assert result.summary().endswith("1 counter(s), 0 other host int(s); the draft passes dsl check")


@pytest.mark.slow
def test_the_draft_runs_bit_identical_with_a_hook_around_the_stock_call(tmp_path):
    path = tmp_path / "draft.clock"
    path.write_text(draft(encoder_loop()).text)
    model = build_encoder()

    def stock_step(model, pcm, state):
        latent, codes, state = model.encode(pcm[..., 2:], state)  # the history the draft keeps is the conv's own
        return state, latent, codes

    runtime = Runtime.load(path, model, hooks={"stock_step": stock_step, "new_state": new_cache}, device="cpu")
    audio = make_audio(30, seed=2)
    report = runtime.verify(
        EncoderStockStream(build_encoder()), lambda t: {"pcm": audio[..., t * SAMPLES : (t + 1) * SAMPLES]}, ticks=30
    )
    assert report.equal, str(report)


def test_the_reviewed_clock_declares_the_drafted_state_with_the_conv_history_in_the_cache():
    drafted = draft(encoder_loop()).check.program
    reviewed = load_program("examples/toy/encoder.clock")

    def kinds(program) -> Counter:
        return Counter(
            (
                r.role,
                r.dtype,
                r.shape,
                program.clocks[r.clock].rate if r.clock else None,
                r.retention.describe(),
                r.start,
            )
            for r in program.regions.values()
        )

    missing, extra = kinds(reviewed) - kinds(drafted), kinds(drafted) - kinds(reviewed)
    # the review binds the first conv's history where stock keeps it (in the cache: start first-firing), where
    # the draft keeps it as the input's history (start first); the rest is alike
    assert missing == Counter(
        {
            ("state", "f32", (1, 1, None), 200, "last 2", "first-firing"): 1,
            ("input", "f32", (1, 1, None), 200, "scratch", "empty"): 1,
        }
    )
    assert extra == Counter({("input", "f32", (1, 1, None), 200, "last 2", "first"): 1})
    assert torch.equal(
        torch.tensor(list(drafted.counters["step_count"].value(t) for t in range(4))), torch.arange(4) * 2
    )
