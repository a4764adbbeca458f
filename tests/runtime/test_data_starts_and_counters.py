"""Starts from the data (`start first`, `start first-firing`), regions that hold nothing (`retain last 0`)
and counters, on the CPU runtime: exact values at every instant, against what stock code computes."""

from __future__ import annotations

import torch
from torch import nn

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.plans.plan import make_plan, to_json
from duplexcadence.interpreter.plans.plan_text import format_plan
from duplexcadence.interpreter.runtime.runtime import Runtime


def write(tmp_path, text: str, name: str = "p.clock"):
    path = tmp_path / name
    path.write_text(text)
    return path


def window_code(window: torch.Tensor) -> torch.Tensor:
    """A window [1, 1, 3] as one number per unit position: 100 a + 10 b + c."""
    return window[..., 0:1] * 100 + window[..., 1:2] * 10 + window[..., 2:3]


# --- start first ---------------------------------------------------------------------------------------

FIRST_INPUT = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, 1, time] on frame input retain last 2 start first
region y : f32[1, 1, time] on frame output
stage s on frame {
    hook s
    read x new + 2
    write y +1
}
"""


def test_start_first_replicates_the_first_unit_fed_into_an_input(tmp_path):
    runtime = Runtime.load(write(tmp_path, FIRST_INPUT), None, hooks={"s": lambda model, x: window_code(x)})
    session = runtime.session()
    values = [3.0, 5.0, 7.0, 1.0]
    got = [session.step(x=torch.full((1, 1, 1), v)).item() for v in values]
    # stock: a replicate-padded history, [x0, x0] before the first unit
    padded = [values[0], values[0], *values]
    expected = [padded[t] * 100 + padded[t + 1] * 10 + padded[t + 2] for t in range(len(values))]
    assert got == expected
    session.reset()  # the next stream replicates its own first unit
    assert session.step(x=torch.full((1, 1, 1), 9.0)).item() == 999.0


FIRST_WRITTEN = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, 1, time] on frame input
region w : f32[1, 1, time] on frame retain last 2 start first
region y : f32[1, 1, time] on frame output
stage a on frame {
    hook double
    read x
    write w +1
}
stage b on frame {
    hook code
    read w last 3
    write y +1
}
"""


def test_start_first_replicates_the_first_unit_a_write_appends(tmp_path):
    hooks = {"double": lambda model, x: x * 2, "code": lambda model, w: window_code(w)}
    runtime = Runtime.load(write(tmp_path, FIRST_WRITTEN), None, hooks=hooks)
    session = runtime.session()
    got = [session.step(x=torch.full((1, 1, 1), v)).item() for v in (1.0, 2.0, 3.0)]
    assert got == [222.0, 224.0, 246.0]


# --- start first-firing ----------------------------------------------------------------------------------

FIRST_FIRING = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, 1, time] on frame input
region cache : f32[1, 1, time] on frame retain last 2 start first-firing bind "conv.cache"
region y : f32[1, 1, time] on frame output
stage s on frame {
    module "conv"
    read x
    update cache +1
    write y +1
}
"""


class ReplicateConv(nn.Module):
    """A causal 3-tap window whose history starts as copies of the first column it sees (None until then)."""

    def __init__(self):
        super().__init__()
        self.cache = None
        self.saw: list[bool] = []

    def forward(self, x):
        self.saw.append(self.cache is None)
        if self.cache is None:
            self.cache = x[..., :1].expand(-1, -1, 2)
        padded = torch.cat([self.cache, x], dim=-1)
        self.cache = padded[..., -2:]
        return window_code(padded)


def test_start_first_firing_hands_the_stage_none_once_and_keeps_what_it_makes(tmp_path):
    model = nn.Module()
    model.conv = ReplicateConv()
    runtime = Runtime.load(write(tmp_path, FIRST_FIRING), model)
    session = runtime.session()
    stock = ReplicateConv()
    for value in (4.0, 6.0, 8.0, 2.0):
        x = torch.full((1, 1, 1), value)
        assert torch.equal(session.step(x=x), stock(x))
    assert model.conv.saw == [True, False, False, False]
    assert model.conv.cache.data_ptr() == session.data_ptrs()["cache"]  # the region's view, between firings
    session.reset()
    assert session.step(x=torch.full((1, 1, 1), 1.0)).item() == 111.0
    assert model.conv.saw[-1] is True


def test_start_first_firing_of_an_unbound_region_passes_none(tmp_path):
    text = FIRST_FIRING.replace(' bind "conv.cache"', "").replace('module "conv"', "hook s")
    seen = []

    def s(model, x, cache):
        seen.append(cache is None)
        cache = x.expand(-1, -1, 2) if cache is None else cache
        padded = torch.cat([cache, x], dim=-1)
        return padded, window_code(padded)

    session = Runtime.load(write(tmp_path, text), None, hooks={"s": s}).session()
    assert [session.step(x=torch.full((1, 1, 1), v)).item() for v in (1.0, 2.0)] == [111.0, 112.0]
    assert seen == [True, False]


def test_a_data_start_is_a_warmup_firing_of_its_own_in_the_plan(tmp_path):
    plan = make_plan(load_program(write(tmp_path, FIRST_FIRING)))
    initial = [(f.instant, v.kind) for f in plan.trace.firings for v in f.views if v.initial]
    assert initial == [(0, "update")]
    assert plan.trace.warmup_instants == 1
    first, steady = plan.trace.firings[0], plan.trace.firings[1]
    assert first.signature != steady.signature  # never the steady graph
    assert [v.key() for v in first.views if v.region == "cache"] == [("cache", "update", 0, 2, 2, 3, 2, "initial")]
    views = [v for f in to_json(plan)["trace"]["firings"][:2] for v in f["views"] if v["region"] == "cache"]
    assert [v["initial"] for v in views] == [True, False]
    plan = make_plan(load_program(write(tmp_path, FIRST_INPUT)))
    assert [(f.instant, v.kind) for f in plan.trace.firings for v in f.views if v.initial] == [(0, "feed")]


# --- retain last 0 --------------------------------------------------------------------------------------

EMPTY = """
cadence 1 s
clock frame = 10 Hz
clock sample = frame * 4
region x : f32[1, 2, time] on sample input
region carry : f32[1, 2, time] on sample retain last 0 bind "carry"
region y : f32[1, 2, time] on sample output
stage s on frame {
    module ""
    read x
    update carry +4
    write y +4
}
"""


class PointwiseConv(nn.Module):
    """A kernel-1 conv that keeps its (empty) cache as stock code does: a zero-length tensor."""

    def __init__(self, keep: int):
        super().__init__()
        self.carry = None
        self.keep = keep
        self.lengths: list[int] = []

    def forward(self, x):
        self.lengths.append(-1 if self.carry is None else self.carry.shape[-1])
        padded = x if self.carry is None else torch.cat([self.carry, x], dim=-1)
        self.carry = padded[..., padded.shape[-1] - self.keep :] if self.keep >= 0 else padded
        return padded * 2


def test_retain_last_0_hands_an_empty_view_and_takes_either_version(tmp_path):
    path = write(tmp_path, EMPTY)
    for keep in (0, -1):  # the stock trims to 0, or hands back all 4 new units
        model = PointwiseConv(keep)
        session = Runtime.load(path, model).session()
        for tick in range(3):
            x = torch.full((1, 2, 4), float(tick))
            assert torch.equal(session.step(x=x), x * 2)
        assert model.lengths == [0, 0, 0]
        assert session.region("carry").shape == (1, 2, 0)
    plan = make_plan(load_program(path))
    assert plan.schedule.regions["carry"].bytes == 0


# --- counters -----------------------------------------------------------------------------------------

COUNTERS = """
cadence 1 s
clock frame = 12.5 Hz
clock slow = frame / 5
counter step +3 mod 7 on frame
counter second +1 on slow
region x : f32[1, time] on frame input
region y : i64[1, time] on frame output
region z : i64[1, time] on slow output
stage fast on frame {
    hook fast
    read x
    read step as position
    write y +1
}
stage once on slow {
    hook once
    read second
    write z +1
}
"""


def test_counters_count_ticks_of_their_clock_on_the_host_and_on_the_device(tmp_path):
    seen = []

    def fast(model, x, position, firing):
        seen.append((firing.instant, firing.count, dict(firing.counters), int(position)))
        return position.reshape(1, 1).clone()

    def once(model, second, firing):
        return second.reshape(1, 1) * 10

    runtime = Runtime.load(write(tmp_path, COUNTERS), None, hooks={"fast": fast, "once": once})
    session = runtime.session()
    outputs = [session.step(x=torch.zeros(1, 1)) for _ in range(12)]
    assert [(i, c) for i, c, _, _ in seen] == [(i, i) for i in range(12)]  # firing.count is 0-based
    assert [counters["step"] for _, _, counters, _ in seen] == [3 * i % 7 for i in range(12)]
    assert [counters["second"] for _, _, counters, _ in seen] == [i // 5 + (i % 5 > 0) for i in range(12)]
    assert [device for _, _, _, device in seen] == [3 * i % 7 for i in range(12)]  # the device scalar agrees
    fives = [o["z"].item() for o in outputs if isinstance(o, dict)]
    assert fives == [0, 10, 20]  # `once` fires at instants 0, 5, 10 and sees the ticks of `slow` before
    session.reset()
    session.step(x=torch.zeros(1, 1))
    assert seen[-1][2] == {"step": 0, "second": 0} and seen[-1][3] == 0


BOUND_COUNTER = """
cadence 1 s
clock frame = 12.5 Hz
counter step +2 on frame bind "rope.step"
region x : f32[1, time] on frame input
region y : f32[1, time] on frame output
stage s on frame {
    module "rope"
    read x
    write y +1
}
"""


class Rope(nn.Module):
    """Positions from a step counter kept as stock code keeps it (a Python int, or a 0-d tensor), +2 a call."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def forward(self, x):
        out = x + (self.step + torch.arange(1)) * 0.5
        self.step = self.step + 2  # stock advances its own counter; the runtime sets it again before each firing
        return out


def test_a_bound_counter_is_a_python_int_or_the_device_scalar_as_the_attribute_is(tmp_path):
    path = write(tmp_path, BOUND_COUNTER)
    for start in (0, torch.tensor(0)):
        stock = Rope(start if isinstance(start, int) else start.clone())
        model = nn.Module()
        model.rope = Rope(start)
        runtime = Runtime.load(path, model)
        assert runtime.host_counters == (frozenset({"step"}) if isinstance(start, int) else frozenset())
        session = runtime.session()
        for _ in range(5):
            x = torch.zeros(1, 1)
            assert torch.equal(session.step(x=x), stock(x))
        if not isinstance(start, int):
            assert int(session.region("step")) == 10 and model.rope.step.data_ptr() == session.data_ptrs()["step"]


def test_the_plan_lists_counters_and_whether_their_host_value_repeats(tmp_path):
    plan = make_plan(load_program(write(tmp_path, COUNTERS)))
    text = format_plan(plan)
    assert (
        "Counters (advanced after the last firing of each instant their clock ticks at)\n"
        "  counter  clock  step  mod  bound or read  host value per steady replay\n"
        "  -------  -----  ----  ---  -------------  ----------------------------\n"
        "  step     frame    +3    7  read by fast   changes\n"
        "  second   slow     +1    -  read by once   changes\n"
    ) in text
    assert plan.repeating_counters == frozenset()
    data = to_json(plan)
    assert data["counters"]["step"] == {"clock": "frame", "step": 3, "modulo": 7, "bind": None, "bind_object": None}
    firings = [(f["instant"], f["stage"], f["advances"]) for f in data["trace"]["firings"][:4]]
    # the last firing of an instant advances the counters whose clock ticks at it
    assert firings == [(0, "fast", []), (0, "once", ["step", "second"]), (1, "fast", ["step"]), (2, "fast", ["step"])]
    assert plan.program.regions["step"].shape == () and plan.schedule.regions["step"].bytes == 8
    repeating = make_plan(load_program(write(tmp_path, COUNTERS.replace("mod 7", "mod 25"), "q.clock")))
    assert repeating.repeating_counters == frozenset({"step"})  # 25 frames x 3 is a multiple of 25
