"""The declared off-plan steps (interpreter/plans/off_plan.py) on MiniCPM-o 4.5's token2wav clock, released
params: the instants a forced flush and a turn's end lead to, where the session is back on the plan, what is
refused, and the declaration's text. No torch."""

from __future__ import annotations

import pytest

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.interpreter.plans.off_plan import OffPlanError, OffPlanStep, back_on_plan, planned_simulator
from duplexcadence.interpreter.plans.plan import make_plan, to_json

P = 150


@pytest.fixture(scope="module")
def program():
    return load_program(stdlib_path("models.step_audio2_token2wav"), {"P": str(P)})


def plan_of(program, *steps: str):
    return make_plan(program, off_plan=[OffPlanStep.parse(step) for step in steps])


def view(firing, region, kind):
    return next(v for v in firing.views if v.region == region and v.kind == kind)


def test_the_end_of_a_turn_after_the_first_second_or_a_steady_chunk_is_three_instants(program):
    off = plan_of(program, "finish tokens=0").off_plan
    assert [(i.instant, i.units, i.last, i.from_plan) for i in off.instants] == [
        (0, (("tokens", 0),), True, True),
        (1, (("tokens", 0),), True, True),
        (2, (("tokens", 0),), True, True),
    ]
    assert off.states == 0 and off.refused == 0
    # the 3 held tokens become 6 mel frames on caches of P, P + 50 and P + 100 frames; HiFT's last chunk on
    # 6 frames (the first of a turn) or 8 cached + 6 (after one), with the 3840 held-back samples released
    flows = [i.firings[0] for i in off.instants]
    assert [
        (view(f, "conformer_att", "update").length, view(f, "conformer_att", "update").transient) for f in flows
    ] == [
        (P, P + 6),
        (P + 50, P + 56),
        (P + 100, P + 106),
    ]
    assert [view(i.firings[2], "pcm", "write").length for i in off.instants] == [6 * 480, 14 * 480, 14 * 480]
    # stage graphs the capture plan lacks: a flow each, HiFT's two stages shared after the first chunk
    assert sorted(off.graphs.values()) == list(range(7, 14))
    assert [i.lengths["conformer_att"] for i in off.instants] == [P, P + 50, P + 100]


def test_a_flush_at_a_turns_start_leads_back_to_the_plan_two_chunks_later(program):
    off = plan_of(program, "step tokens=10 at start").off_plan
    # 10 new tokens (a 13-token window): caches P -> P + 20, then two planned chunks on P + 20 and P + 70,
    # then P + 100 again: the steady state of the plan
    assert [(i.instant, i.units, i.from_plan) for i in off.instants] == [
        (0, (("tokens", 10),), True),
        (1, (), False),
        (2, (), False),
    ]
    assert [i.lengths["conformer_att"] for i in off.instants] == [P, P + 20, P + 70]
    assert [view(i.firings[0], "conformer_att", "update").kept for i in off.instants] == [P + 20, P + 70, P + 100]
    assert off.states == 2


def test_a_flush_from_the_steady_state_is_trimmed_straight_back_onto_the_plan(program):
    plan = plan_of(program, "step tokens=10")
    flush = next(i for i in plan.off_plan.instants if i.instant == 2 and i.from_plan)
    assert flush.units == (("tokens", 10),) and view(flush.firings[0], "conformer_att", "update").kept == P + 100
    state = planned_simulator(plan.program, plan.clocks, plan.trace, 2)
    state.run_instant(2, {"tokens": 10})
    assert back_on_plan(plan.program, plan.clocks, plan.trace, state, 3)


def test_minicpm_os_turn_boundaries_flushes_of_8_to_27_tokens_and_every_turn_end(program):
    off = plan_of(program, "step tokens=5-24 at start", "finish tokens=0").off_plan
    kinds = [(i.last, bool(i.units), i.from_plan) for i in off.instants]
    assert kinds.count((False, True, True)) == 20  # a flush of each size
    assert kinds.count((False, False, False)) == 40  # the two chunks after each
    assert kinds.count((True, True, True)) == 3 and kinds.count((True, True, False)) == 40  # every turn end
    assert len(off.instants) == 103 and off.states == 40 and len(off.graphs) == 147


def test_steps_the_runtime_would_refuse_are_counted_and_a_declaration_none_can_take_is_an_error(program):
    off = plan_of(program, "step tokens=0-10 at start").off_plan
    # 0 tokens: no units where the plan feeds some; 1 to 3: a turn's first chunk holds back 3840 samples for
    # the cross-fade, more than 2 to 6 mel frames make (a negative write)
    assert off.refused == 4
    assert [i.units for i in off.instants if i.from_plan] == [(("tokens", count),) for count in range(4, 11)]
    with pytest.raises(OffPlanError) as error:
        plan_of(program, "step tokens=26")
    assert str(error.value) == (
        "no planned instant can take the declared off-plan steps (step tokens=26 at any): each would advance a "
        "region by a fraction of a unit, over its capacity, or feed an input the instant does not read"
    )
    with pytest.raises(OffPlanError, match=r"'speaker' is not an input region; the inputs are tokens"):
        plan_of(program, "finish speaker=1")


def test_back_on_plan_compares_the_whole_state_at_the_same_instant(program):
    plan = make_plan(program)
    clocks, trace = plan.clocks, plan.trace
    for instant in (0, 1, 2, 7):
        state = planned_simulator(plan.program, clocks, trace, instant)
        assert back_on_plan(plan.program, clocks, trace, state, instant)
    first = planned_simulator(plan.program, clocks, trace, 0)
    assert not back_on_plan(plan.program, clocks, trace, first, 1)  # the first chunk's state is not the second's
    flushed = first.copy()
    flushed.run_instant(0, {"tokens": 10})
    assert not back_on_plan(plan.program, clocks, trace, flushed, 1)
    flushed.run_instant(1)
    flushed.run_instant(2)
    assert back_on_plan(plan.program, clocks, trace, flushed, 3)


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("finish tokens=0", "finish tokens=0 at any"),
        ("step tokens=5-24 at start", "step tokens=5-24 at start"),
        ("  step tokens=3 tokens=7-9 tokens=8  ", "step tokens=3 tokens=7-9 at any"),
    ],
)
def test_a_step_reads_back_from_its_text(text, canonical):
    step = OffPlanStep.parse(text)
    assert step.text() == canonical and OffPlanStep.parse(canonical) == step


@pytest.mark.parametrize(
    "text, problem",
    [
        ("flush tokens=3", "off-plan step 'flush tokens=3': write 'step NAME=COUNTS [at start|any]'"),
        ("step tokens", "off-plan step 'step tokens': 'tokens' is not NAME=COUNTS"),
        ("step tokens=9-3", "off-plan step 'step tokens=9-3': the range 9-3 is empty; write LOW-HIGH with LOW <= HIGH"),
        ("step tokens=3 at end", "an off-plan step is taken at start or any, not 'end'"),
    ],
)
def test_a_malformed_step_says_what_is_legal(text, problem):
    with pytest.raises(OffPlanError) as error:
        OffPlanStep.parse(text)
    assert str(error.value).startswith(problem)


def test_declared_steps_are_in_the_plans_json_and_absent_when_none_are_declared(program):
    assert "off_plan" not in to_json(make_plan(program))
    data = to_json(plan_of(program, "finish tokens=0"))["off_plan"]
    assert data["steps"] == ["finish tokens=0 at any"] and data["states"] == 0 and data["refused"] == 0
    assert data["graphs"] == list(range(7, 14))
    assert data["instants"][2] == {
        "instant": 2,
        "units": {"tokens": 0},
        "last": True,
        "from_plan": True,
        "stages": ["flow", "hift_front", "hift_back"],
        "graphs": [13, 11, 12],
    }
