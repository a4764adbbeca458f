"""Lockstep groups on the toy tail: members in the rows of one batched session.

The toy's attention cache grows to its window during warm-up (and starts from a given prompt), so its
plan takes members only at the group's start. Each row must equal the same row of the toy's stock
stream run at the same batch; every refusal must name its cause and leave the group steppable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt
from duplexcadence.interpreter.runtime.errors import SessionFailed, StepError
from duplexcadence.interpreter.runtime.lockstep import LockstepError, LockstepGroup, batch_axes
from duplexcadence.interpreter.runtime.rng import get_rng_state, seeded_rng_state, set_rng_state
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW, ROWS = 6, 20, 3
TICKS = 40  # past the window fill (prompt 6 + window 20)


def codes_of(seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (1, TICKS), generator=torch.Generator().manual_seed(seed))


def make_group(rows: int = ROWS, seed: int = 5):
    model = build_toy(batch=rows)
    runtime = Runtime.load(CLOCK, model, params={"B": rows}, device="cpu")
    prompt = make_prompt(model, PROMPT, batch=rows)
    return LockstepGroup(runtime, seed=seed, initial={"cache": prompt}), prompt


class BatchedStock:
    """The toy's stock stream at batch `rows`, with the generator state the group's session draws from."""

    def __init__(self, prompt: torch.Tensor, seed: int, rows: int = ROWS):
        self.stock = ToyStockStream(build_toy(batch=rows), prompt, WINDOW)
        self.rng = seeded_rng_state(seed, torch.device("cpu"))

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        saved = get_rng_state(torch.device("cpu"))
        set_rng_state(torch.device("cpu"), self.rng)
        out = self.stock.step(codes)
        self.rng = get_rng_state(torch.device("cpu"))
        set_rng_state(torch.device("cpu"), saved)
        return out


def test_batch_axes_follow_the_batch_param():
    group, _ = make_group()
    assert group.axes == {"codes": 0, "pcm": 0, "carry": 0, "hidden": 0, "cache": 1, "attended": 0, "partial": 0}
    assert group.rows == ROWS


def test_rows_equal_the_batched_stock_run_and_addresses_stay():
    group, prompt = make_group()
    members = [group.join() for _ in range(ROWS)]
    stock = BatchedStock(prompt, seed=5)
    streams = [codes_of(seed) for seed in range(ROWS)]
    pointers = group.session.data_ptrs()
    unequal = []
    for t in range(TICKS):
        expected = stock.step(torch.cat([s[:, t : t + 1] for s in streams]))
        outputs = group.step({m: streams[m.row][:, t : t + 1] for m in members})
        for m in members:
            assert outputs[m].shape == (1, 4, 2)
            if not torch.equal(outputs[m], expected[m.row : m.row + 1]):
                unequal.append((t, m.row))
        assert group.session.data_ptrs() == pointers
    assert unequal == []
    assert [m.instant for m in members] == [TICKS] * ROWS
    assert group.session.counters.steps == TICKS


def test_a_late_join_on_a_plan_whose_shapes_grow_is_refused_and_names_why():
    group, _ = make_group()
    first = group.join()
    group.step({first: codes_of(0)[:, :1]})
    with pytest.raises(LockstepError) as error:
        group.join()
    assert str(error.value) == (
        "a member cannot join at instant 1: region(s) cache do not start as zeros, so a zeroed row is not a fresh "
        "one; members join at the group's start"
    )


def test_a_full_group_refuses_a_member_and_a_freed_row_is_reused_at_the_start():
    group, _ = make_group(rows=2)
    a, b = group.join(), group.join()
    with pytest.raises(
        LockstepError,
        match=r"^all 2 rows of the group are taken; load the runtime with a larger "
        r"'B' or wait for a member to leave$",
    ):
        group.join()
    a.leave()
    with pytest.raises(LockstepError, match="is not an active member of this group"):
        a.leave()
    c = group.join()
    assert (c.row, c.joined_at, b.row) == (0, 0, 1)


def test_bad_steps_raise_step_error_and_change_nothing():
    group, prompt = make_group()
    a, b = group.join(), group.join()
    stock = BatchedStock(prompt, seed=5)
    stream = codes_of(3)
    zeros = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(
        StepError,
        match=r"^lockstep step: missing the inputs of row\(s\) 1; every active member "
        r"steps at every instant$",
    ):
        group.step({a: stream[:, :1]})
    with pytest.raises(StepError, match=r"row 1's 'codes' is \(2, 1\); a member's input has a batch of 1 on axis 0"):
        group.step({a: stream[:, :1], b: torch.zeros(2, 1, dtype=torch.long)})
    with pytest.raises(
        StepError,
        match=r"row 1's 'codes' is int64\[1, 2\] on cpu where another row's is "
        r"int64\[1, 1\] on cpu; members step in lockstep, with equal shapes",
    ):
        group.step({a: stream[:, :1], b: torch.zeros(1, 2, dtype=torch.long)})
    with pytest.raises(
        StepError,
        match=r"^lockstep step: row 1's 'codes' is int32\[1, 1\] on cpu; the region is i64 "
        r"on cpu$",
    ):
        group.step({a: stream[:, :1], b: torch.zeros(1, 1, dtype=torch.int32)})
    with pytest.raises(StepError, match=r"^lockstep step: row 1's inputs are a NoneType; give a tensor or a dict"):
        group.step({a: stream[:, :1], b: None})
    other, _ = make_group()
    stranger = other.join()
    with pytest.raises(StepError, match=r"1 input\(s\) for something that is not an active member"):
        group.step({a: stream[:, :1], b: zeros, stranger: zeros})
    assert group.instant == 0
    for t in range(3):  # the group goes on as if nothing had been tried (row 2 idle: zeros)
        expected = stock.step(torch.cat([stream[:, t : t + 1], zeros, zeros]))
        outputs = group.step({a: stream[:, t : t + 1], b: {"codes": zeros}})
        assert torch.equal(outputs[a], expected[0:1]) and torch.equal(outputs[b], expected[1:2])


def test_a_group_without_members_says_so():
    group, _ = make_group()
    with pytest.raises(StepError, match=r"^lockstep step: the group has no member; join\(\) one first$"):
        group.step({})
    assert group.instant == 0


def test_reset_restarts_every_row():
    group, prompt = make_group()
    members = [group.join() for _ in range(ROWS)]
    stream = codes_of(4)
    for t in range(5):
        group.step({m: stream[:, t : t + 1] for m in members})
    group.reset()
    assert [m.instant for m in members] == [0] * ROWS
    stock = BatchedStock(prompt, seed=5)
    for t in range(5):
        expected = stock.step(torch.cat([stream[:, t : t + 1]] * ROWS))
        outputs = group.step({m: stream[:, t : t + 1] for m in members})
        assert all(torch.equal(outputs[m], expected[m.row : m.row + 1]) for m in members)


def test_a_program_without_the_batch_param_is_refused():
    group, _ = make_group()
    with pytest.raises(LockstepError) as error:
        batch_axes(group.runtime.program, "batch")
    assert str(error.value).endswith(
        "has no param 'batch' (its params: B, C, H, K, P, W); name the param that sets the batch"
    )


def test_close_gives_the_slot_back_and_members_stop():
    group, _ = make_group()
    member = group.join()
    group.close()
    assert group.runtime.free_slots == [0]
    for action in (lambda: group.step({member: codes_of(0)[:, :1]}), group.join, group.reset):
        with pytest.raises(RuntimeError, match=r"^this lockstep group is closed$"):
            action()
    assert not member.active


# --- what decides a late join, on small programs of their own ---------------------------------------------

HEADER = """cadence 1 s
param B = 2
clock frame = 12.5 Hz
region x : f32[B, time] on frame input
region y : f32[B, time] on frame output
"""
ACCUMULATE = (
    HEADER
    + """region acc : f32[B, 1] start zeros
stage s on frame {
    hook step
    read x
    update acc
    write y +1
}
"""
)


def accumulate(model, x, acc):
    return acc + x, acc + x


def group_of(tmp_path, text: str, hooks: dict, **load) -> LockstepGroup:
    path = tmp_path / "p.clock"
    path.write_text(text)
    return LockstepGroup(Runtime.load(path, torch.nn.Module(), device="cpu", hooks=hooks, **load))


def test_a_late_member_of_a_stationary_plan_starts_fresh(tmp_path):
    group = group_of(tmp_path, ACCUMULATE, {"step": accumulate})
    a = group.join()
    for _ in range(3):
        group.step({a: torch.ones(1, 1)})
    b = group.join()
    out = group.step({a: torch.ones(1, 1), b: torch.full((1, 1), 5.0)})
    assert (out[a].item(), out[b].item()) == (4.0, 5.0)


def test_a_hook_that_reads_the_clock_keeps_members_at_the_start(tmp_path):
    def counted(model, x, acc, firing):
        return acc + x, acc + firing.count

    group = group_of(tmp_path, ACCUMULATE, {"step": counted})
    group.step({group.join(): torch.ones(1, 1)})
    assert group.join_problem(1) == (
        "stage(s) s take the firing (the group's instant and counts, not a new member's); "
        "members join at the group's start"
    )


def test_an_on_reset_callback_keeps_members_at_the_start(tmp_path):
    group = group_of(tmp_path, ACCUMULATE, {"step": accumulate}, on_reset=lambda model: None)
    assert group.join_problem(1).startswith("the runtime has an on_reset callback")


def test_a_doubled_batch_is_not_a_row(tmp_path):
    """`f32[2 * B, 1]` (classifier-free guidance) follows B without being it: the region is shared by the rows."""
    text = ACCUMULATE.replace("region acc : f32[B, 1]", "region acc : f32[2 * B, 1]")

    def doubled(model, x, acc):
        return acc + x.repeat(2, 1), (acc + x.repeat(2, 1))[:2]

    group = group_of(tmp_path, text, {"step": doubled})
    assert group.axes["acc"] is None and group.shared_state == ["acc"]
    member = group.join()
    assert group.step({member: torch.ones(1, 1)})[member].item() == 1.0
    assert group.join_problem(1).startswith("region(s) acc are shared by all rows (no dimension is 'B')")


def test_a_batch_named_by_a_derived_param_and_other_overrides_are_kept(tmp_path):
    text = (
        ACCUMULATE.replace("param B = 2\n", "param B = 2\nparam N = B\nparam W = 1\n")
        .replace("f32[B, time]", "f32[N, time]")
        .replace("region acc : f32[B, 1]", "region acc : f32[N, W]")
    )
    group = group_of(tmp_path, text, {"step": accumulate}, params={"B": 3, "W": 4})
    assert group.rows == 3 and group.axes == {"x": 0, "y": 0, "acc": 0}


def test_a_member_that_left_stops_counting(tmp_path):
    group = group_of(tmp_path, ACCUMULATE, {"step": accumulate})
    a, b = group.join(), group.join()
    group.step({a: torch.ones(1, 1), b: torch.ones(1, 1)})
    b.leave()
    for _ in range(3):
        group.step({a: torch.ones(1, 1)})
    group.reset()
    assert (a.instant, b.instant) == (0, 1)
    group.close()
    with pytest.raises(RuntimeError, match=r"^this lockstep group is closed$"):
        a.leave()


PHASED = (
    HEADER
    + """clock slow = frame / 2
region acc : f32[B, 1] start zeros
region tick : f32[B, 1] start zeros
stage s on frame {
    hook step
    read x
    update acc
    write y +1
}
stage t on slow {
    hook slow
    update tick
}
"""
)


def test_a_member_joins_only_where_the_plan_repeats_instant_0(tmp_path):
    """A stage at half the frame rate: odd instants run other stages than instant 0. No output depends on
    `tick`, which the test reads through `Session.region`: the runtime is loaded with prune=False to run it."""
    group = group_of(tmp_path, PHASED, {"step": accumulate, "slow": lambda model, tick: tick + 1}, prune=False)
    a = group.join()
    group.step({a: torch.ones(1, 1)})
    assert group.join_problem(1) == (
        "the plan's shapes and lengths from instant 1 on are not those from instant 0 (the next instant that does "
        "is 2); members join at the group's start, or at an instant that repeats instant 0"
    )
    with pytest.raises(LockstepError, match=r"^a member cannot join at instant 1: the plan's shapes"):
        group.join()
    group.step({a: torch.ones(1, 1)})
    b = group.join()
    out = group.step({a: torch.ones(1, 1), b: torch.full((1, 1), 7.0)})
    assert (out[a].item(), out[b].item()) == (3.0, 7.0)
    assert group.session.region("tick")[:, 0].tolist() == [2.0, 1.0]


def test_a_failed_group_takes_no_member_until_reset(tmp_path):
    def failing(model, x, acc):
        if bool((x < 0).any()):
            raise RuntimeError("bad frame")
        return acc + x, acc + x

    group = group_of(tmp_path, ACCUMULATE, {"step": failing})
    a = group.join()
    with pytest.raises(SessionFailed):
        group.step({a: -torch.ones(1, 1)})
    with pytest.raises(
        LockstepError,
        match=r"^a member cannot join a failed group \(RuntimeError\('bad frame'\)\); "
        r"reset\(\) the group first$",
    ):
        group.join()
    group.reset()
    b = group.join()
    out = group.step({a: torch.ones(1, 1), b: torch.full((1, 1), 2.0)})
    assert (out[a].item(), out[b].item(), a.instant, b.instant) == (1.0, 2.0, 1, 1)


def test_an_output_without_a_row_is_refused(tmp_path):
    """`y` holds both rows side by side (`2 * B`): no member can be handed its own row of it."""
    text = ACCUMULATE.replace("region y : f32[B, time]", "region y : f32[2 * B, time]")
    with pytest.raises(LockstepError) as error:
        group_of(tmp_path, text, {"step": accumulate})
    assert str(error.value) == (
        "input/output region(s) y have no dimension that is 'B': a lockstep group cannot hand each member its row"
    )
