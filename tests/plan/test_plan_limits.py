"""The limits from the Python API and the planner's own counts (docs/language.md, section 5.7).

`dsl check` estimates the plan's warm-up, firings, views and bytes from the clocks (tests/clock/bad/ has
a file for each); the planner counts them exactly as it traces, and stops at a limit with a located
diagnostic. A program carries the limits it was checked with to its plan; `limits=` raises them.
"""

from __future__ import annotations

import attrs
import pytest

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.frontend import check_file, load_program
from duplexcadence.dsl.limits import DEFAULT_LIMITS, MAX_REGIONS, Limits, parse_limits
from duplexcadence.interpreter.plans.clocks import plan_clocks
from duplexcadence.interpreter.plans.plan import make_plan, plan_file
from duplexcadence.interpreter.plans.trace import trace_shapes

WINDOW = """cadence 1 s
clock c = 10 Hz
region x : f32[1, time] on c input
region hist : f32[1, time] on c retain last 8
stage s on c {
    module "s"
    read x
    update hist +1
}
"""


@pytest.fixture
def window(tmp_path):
    path = tmp_path / "window.clock"
    path.write_text(WINDOW)
    return path


def test_a_window_filling_past_the_warmup_limit_stops_the_trace_at_the_limit(window):
    """The trace stops once the limit (plus the one hyperperiod that would show a repeat) is passed."""
    program = attrs.evolve(load_program(window), limits=Limits(warmup=3))
    with pytest.raises(ClockError) as caught:
        trace_shapes(program, plan_clocks(program))
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code is messages.WARMUP_TOO_LONG
    assert diagnostic.message == (
        "the state does not repeat within the warm-up limit of 3 instants: region 'hist' still grows, "
        "from 2 to 8 units over the last hyperperiod traced"
    )
    assert (diagnostic.span.line, diagnostic.span.column) == (4, 33)  # `retain last 8`


def test_the_planner_counts_firings_and_views_exactly(window):
    """8 instants of warm-up, then two periods of 10 (the second confirms the first repeats): 28 firings
    of 3 views (the feed of x, the read of x, the update of hist). The plan keeps the warm-up and one."""
    program = load_program(window)
    plan = make_plan(program, limits={"firings": 28, "views": 84})
    assert len(plan.trace.firings) == 18 and plan.trace.warmup_instants == 8
    for limits, code in ((Limits(firings=27), messages.TOO_MANY_FIRINGS), (Limits(views=83), messages.TOO_MANY_VIEWS)):
        with pytest.raises(ClockError) as caught:
            trace_shapes(attrs.evolve(program, limits=limits), plan_clocks(program))
        [diagnostic] = caught.value.diagnostics
        assert diagnostic.code is code and diagnostic.span is not None
    with pytest.raises(ClockError) as caught:
        make_plan(program, limits={"firings": 27})
    assert caught.value.diagnostics[0].message == (
        "the planner would trace 28 firings (8 in the warm-up, 20 in two hyperperiods of 1 s), over the limit of 27"
    )


def test_the_planner_stops_before_keeping_more_region_lengths_than_the_states_limit(window):
    """28 traced instants x 2 regions with a time axis (x, hist): 56 region lengths."""
    program = load_program(window)
    assert make_plan(program, limits={"states": 56}).trace.warmup_instants == 8
    with pytest.raises(ClockError) as caught:
        trace_shapes(attrs.evolve(program, limits=Limits(states=55)), plan_clocks(program))
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code is messages.TOO_MANY_STATES
    assert diagnostic.message == (
        "the planner would keep 56 region lengths (28 traced instants x 2 regions with a time axis), "
        "over the limit of 55"
    )


def test_a_program_carries_its_limits_to_its_plan(window):
    program = load_program(window, limits={"bytes": 100})
    with pytest.raises(ClockError) as caught:
        make_plan(program)
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code is messages.ARENA_TOO_LARGE
    assert diagnostic.message.startswith("a session's arena needs 1.0 KiB (1024 bytes), over the limit of 100 B")
    assert make_plan(program, limits={"bytes": 1024}).arena.total_bytes(1) == 1024
    assert plan_file(window, limits=Limits(bytes=1024)).program.limits.bytes == 1024


def test_limits_from_python_name_known_limits_and_positive_values(window):
    assert Limits.of(None) is DEFAULT_LIMITS
    assert Limits.of({"regions": 5}).regions == 5 and Limits.of({"regions": 5}).stages == DEFAULT_LIMITS.stages
    with pytest.raises(ValueError, match="unknown limit 'region'; the limits are regions, stages"):
        check_file(window, limits={"region": 5})
    with pytest.raises(ValueError, match="the limit views must be a positive integer, not 0"):
        Limits.of({"views": 0})


def test_limit_flags_parse_or_say_what_is_wrong():
    limits, problems = parse_limits(["regions=2_000", "warmup = 5"])
    assert (limits.regions, limits.warmup, problems) == (2000, 5, [])
    _, problems = parse_limits(["regions", "nope=3", "views=-1", "bytes=" + "9" * 5000])
    assert problems == [
        "--limit 'regions' is not NAME=VALUE (the limits: regions, stages, retention, horizon, context, warmup, "
        "hyperperiod, firings, views, states, bytes)",
        "--limit nope: no such limit (the limits: regions, stages, retention, horizon, context, warmup, "
        "hyperperiod, firings, views, states, bytes)",
        "--limit views=-1: the value must be a positive integer",
        "--limit bytes=" + "9" * 5000 + ": the value must be a positive integer",
    ]


def test_regions_are_counted_across_families_before_a_member_is_made(tmp_path):
    path = tmp_path / "families.clock"
    path.write_text(
        "cadence 1 s\nclock c = 10 Hz\n"
        "region a[i < 1000] : f32[1, time] on c retain last 2\n"
        "region b[i < 25] : f32[1, time] on c retain last 2\n"
        "region d[i < 1000000000000] : f32[1, time] on c retain last 2\n"
    )
    [diagnostic] = check_file(path).errors
    assert diagnostic.message == (
        f"family 'b' has 25 members, which makes 1025 regions: over the limit of {MAX_REGIONS} regions in a program"
    )
    assert (diagnostic.span.line, diagnostic.span.column) == (4, 14)
