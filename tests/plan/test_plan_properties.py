"""Properties of plans over generated programs (hypothesis): capacities cover every view, live
allocations never share bytes, every firing maps to exactly one graph or to eager."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duplexcadence.dsl.frontend import check_file
from duplexcadence.interpreter.plans.plan import make_plan


@st.composite
def programs(draw) -> str:
    lines = ["cadence 1 s", "clock base = 24000 Hz"]
    factors = draw(st.lists(st.sampled_from([480, 960, 2400, 24000]), min_size=1, max_size=3, unique=True))
    clocks = []
    for i, factor in enumerate(factors):
        lines.append(f"clock c{i} = base / {factor}")
        clocks.append((f"c{i}", 24000 // factor))
    stage_clock, stage_rate = draw(st.sampled_from(clocks))
    regions, accesses = [], []
    lines.append(f"region inp : f32[2, time] on {stage_clock} input")
    accesses.append("read inp")
    count = draw(st.integers(1, 4))
    for r in range(count):
        region_clock, rate = draw(st.sampled_from([c for c in clocks if c[1] % stage_rate == 0]))
        advance = rate // stage_rate
        kind = draw(st.sampled_from(["last", "ring", "first_last", "scratch"]))
        dims = draw(st.sampled_from(["[time, 3]", "[2, time]", "[1, time, 4]"]))
        if kind == "last":
            keep = draw(st.integers(1, 3 * advance + 2))
            retain = f"retain last {keep} start {draw(st.sampled_from(['zeros', 'empty']))}"
        elif kind == "ring":
            keep = draw(st.integers(advance, 3 * advance + 2))
            retain = f"retain ring {keep} start zeros"
        elif kind == "first_last":
            first, last = draw(st.integers(0, 3)), draw(st.integers(1, 2 * advance + 1))
            retain = f"retain first {first} + last {last} start given {min(2, first + last)}"
        else:
            retain = "retain scratch"
        lines.append(f"region r{r} : f32{dims} on {region_clock} {retain}")
        verb = {"scratch": "write", "ring": "update"}.get(kind) or draw(st.sampled_from(["update", "write"]))
        accesses.append(f"{verb} r{r} +{advance}")
        regions.append(f"r{r}")
    lines.append(f"region out : f32[2, time] on {stage_clock} output")
    accesses.append("write out +1")
    lines.append(f'stage s on {stage_clock} {{ module "m"; ' + "; ".join(accesses) + " }")
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.one_of(st.none(), st.integers(0, 4)))
def test_generated_plans_are_consistent(text, max_graphs):
    result = check_file("generated.clock", text=text)
    assert result.ok, [d.message for d in result.diagnostics]
    plan = make_plan(result.program, max_graphs=max_graphs)
    regions = plan.schedule.regions
    for firing in plan.trace.firings:
        for view in firing.views:
            region = regions[view.region]
            if region.capacity is None or view.length is None:
                continue
            end = view.start + view.length if view.kind != "update" else view.length
            assert end <= region.capacity, (view, region)
            assert view.transient <= region.capacity or view.kind == "update"
            if view.kept is not None:
                assert view.kept <= region.capacity
    allocations = [a for a in plan.arena.allocations if a.bytes]
    for i, a in enumerate(allocations):
        for b in allocations[i + 1 :]:
            if a.persistent != b.persistent:
                continue
            together = a.live is None or b.live is None or (a.live[0] <= b.live[1] and b.live[0] <= a.live[1])
            assert not (together and a.offset < b.end and b.offset < a.end), (a, b)
    keys = {g.signature: g for g in plan.capture.graphs}
    for replay, firing in zip(plan.capture.warmup + plan.capture.steady, plan.trace.firings):
        graph = keys[firing.signature]
        assert replay.key == (graph.key if graph.captured else None)
    if max_graphs is not None:
        assert len(plan.capture.captured) <= max_graphs
