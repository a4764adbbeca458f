"""`interpreter/runtime/offline.py` on streams it can judge exactly: the toy tail's runtime and hand-made
streams that drop units at their boundaries, so the lengths, `torch.equal` and the split of the largest
difference near and away from the boundaries are known in advance."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter.plans.plan import make_plan
from duplexcadence.interpreter.runtime.offline import (
    compare_offline,
    stream_outputs,
    verify_offline,
    whole_input,
)
from duplexcadence.tails import toy

SIGNAL = torch.sin(torch.arange(1000, dtype=torch.float64) / 7).reshape(1, 1, -1)


class ChunkedLoop:
    """A stock-like loop: each step returns its chunk of the offline signal, the last `lose` units cut."""

    def __init__(self, lose: int) -> None:
        self.lose = lose
        self.position = 0

    def step(self, units: torch.Tensor) -> torch.Tensor:
        count = units.shape[-1]
        chunk = SIGNAL[..., self.position : self.position + count - self.lose]
        self.position += count
        return chunk


def offline(units: torch.Tensor) -> torch.Tensor:
    return SIGNAL[..., : units.shape[-1]]


STEPS = [torch.zeros(1, 1, 100) for _ in range(10)]


def test_a_stream_that_keeps_every_unit_is_torch_equal():
    report = verify_offline(ChunkedLoop(0), offline, STEPS)
    assert report.equal and report.lengths_equal and report.max_abs_diff == 0
    assert [b.position for b in report.boundaries] == list(range(100, 1000, 100))
    assert str(report) == "equal: 10 steps, 1000 units, torch.equal to one offline call"


def test_units_lost_at_each_boundary_make_it_short_and_differ_from_the_first_boundary_on():
    report = verify_offline(ChunkedLoop(5), offline, STEPS, window=3)
    assert (report.stream_length, report.offline_length, report.length_difference) == (950, 1000, 50)
    assert not report.equal and report.compared == 950
    first = report.boundaries[0]
    assert (first.boundary, first.position) == (1, 95)
    # before the first boundary both are the same signal; after it the stream runs 5 units early
    assert report.max_at is not None and report.max_at >= 95
    # within 3 units after it, the stream holds SIGNAL[100:103] where the offline call has SIGNAL[95:98]
    early = (SIGNAL[..., 100:103] - SIGNAL[..., 95:98]).abs().max().item()
    assert first.max_abs_diff == pytest.approx(early) and early > 0
    assert report.to_json()["length_difference"] == 50 and len(report.to_json()["boundaries"]) == 9


def test_a_click_at_the_boundaries_is_larger_near_them_than_away():
    chunks = [SIGNAL[..., i : i + 100].clone() for i in range(0, 1000, 100)]
    for chunk in chunks[1:]:
        chunk[..., :2] += 0.5  # a discontinuity right after each boundary
    report = compare_offline(chunks, SIGNAL, window=4)
    assert report.lengths_equal and not report.equal
    assert report.near_boundaries == pytest.approx(0.5) and report.away_from_boundaries == 0
    assert all(b.max_abs_diff == pytest.approx(0.5) for b in report.boundaries)


def test_the_stream_ends_as_asked():
    class Finishing(ChunkedLoop):
        def finish(self, units: torch.Tensor) -> torch.Tensor:
            return torch.full((1, 1, 3 + units.shape[-1]), 9.0, dtype=torch.float64)

    assert [c.shape[-1] for c in stream_outputs(Finishing(0), STEPS[:2], end="finish")] == [100, 103]
    assert [c.shape[-1] for c in stream_outputs(Finishing(0), STEPS[:2], end="flush")] == [100, 100, 3]
    assert [c.shape[-1] for c in stream_outputs(Finishing(0), STEPS[:2], end="step")] == [100, 100]
    assert [c.shape[-1] for c in stream_outputs(ChunkedLoop(0), STEPS[:2], end="flush")] == [100, 100]
    with pytest.raises(ValueError, match="end must be one of finish, flush, step"):
        stream_outputs(ChunkedLoop(0), STEPS, end="stop")
    assert whole_input([{"a": torch.ones(1, 2)}, {"a": torch.zeros(1, 3)}])["a"].shape == (1, 5)


def test_the_toy_runtime_emits_what_the_plan_counts():
    model = build_toy()
    runtime = toy.load_runtime(model)
    codes = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(3))
    seconds = Fraction(3, 2)
    plan = make_plan(load_program(toy.clock_path()), seconds=seconds)
    steps = [codes[:, i : i + 1] for i in range(plan.samples.instants)]
    session = runtime.session(initial={"cache": make_prompt(model, 6)})
    chunks = stream_outputs(session, steps, end="step")
    session.close()
    assert (
        sum(chunk.shape[-1] for chunk in chunks)
        == plan.samples.outputs["pcm"].total
        == 2 * math.ceil(seconds * Fraction(25, 2))
    )
