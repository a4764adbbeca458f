"""The session pool on the toy tail, through its library API: ticks in order and equal to each session run
alone on stock, admission from the plan with its exact refusal, draining, reset, close, idle timeout, a
stage failure and its recovery, deadline accounting and the metrics. No timing decides a result: admission
tests give the tick model, deadline tests a tick period every tick misses (or none does)."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import AdmissionRefused, AdmissionRule, TickModel, fit
from duplexcadence.interpreter.serve.loadgen import SessionLoad, compare_with_stock
from duplexcadence.interpreter.serve.pool import OBSERVE_EVERY_S, PoolConfig, SessionClosed, SessionPool
from duplexcadence.interpreter.serve.scheduler import TickError
from duplexcadence.interpreter.serve.tail import served_tail

MODEL = TickModel(0.010, 0.020)  # 80 ms period, 15 % headroom: 68 ms of budget, 2 sessions fit
TOY = served_tail("toy")


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


async def started(**options) -> SessionPool:
    config = {"slots": 3, "lanes": 2, "tick_model": MODEL, **options}
    pool = SessionPool(TOY, PoolConfig(**config))
    await pool.start()
    return pool


def equal_to_stock(seed: int, outputs: list[dict]) -> bool:
    compared, unequal = compare_with_stock(TOY, SessionLoad(seed, len(outputs), (), (), 0, None, tuple(outputs)))
    return compared == len(outputs) and unequal == 0


def test_sessions_stepped_together_equal_each_session_alone_on_stock():
    async def scenario():
        pool = await started()
        a, b = await pool.open(seed=4), await pool.open(seed=9)
        outputs = {a: [], b: []}
        for tick in range(12):  # both queued before the scheduler runs: one step_many a round
            fa, fb = a.submit(TOY.inputs(4, tick)), b.submit(TOY.inputs(9, tick))
            outputs[a].append(await fa)
            outputs[b].append(await fb)
        await pool.stop()
        return outputs[a], outputs[b], pool

    first, second, pool = run(scenario())
    assert equal_to_stock(4, first) and equal_to_stock(9, second)
    assert not equal_to_stock(9, first)  # the comparison can fail: another seed's stream differs
    assert pool.deadlines().ticks == 24


def test_a_session_s_pipelined_ticks_run_in_order_and_its_queue_is_bounded():
    async def scenario():
        pool = await started(queue_depth=3)
        session = await pool.open(seed=2)
        futures = [session.submit(TOY.inputs(2, tick)) for tick in range(3)]  # queued, none run yet
        with pytest.raises(TickError) as full:
            session.submit(TOY.inputs(2, 3))
        outputs = [await future for future in futures]
        outputs.append(await session.step(TOY.inputs(2, 3)))
        await pool.stop()
        return full.value, outputs

    full, outputs = run(scenario())
    assert full.code == messages.QUEUE_FULL
    assert full.message == (
        "the session already has 3 ticks queued, the most this pool holds per session; wait for an output before "
        "sending the next tick"
    )
    assert equal_to_stock(2, outputs)


def test_admission_refuses_past_the_tick_budget_and_past_the_slots_with_the_numbers():
    async def scenario():
        pool = await started()
        capacity = pool.capacity()
        first, second = await pool.open(), await pool.open()
        with pytest.raises(AdmissionRefused) as budget:
            await pool.open()
        await first.close()
        third = await pool.open()
        wide = await started(headroom=0.0, tick_model=TickModel(0.001, 0.002))
        for _ in range(3):
            await wide.open()
        with pytest.raises(AdmissionRefused) as slots:
            await wide.open()
        exposition = pool.exposition().decode()
        await pool.stop()
        await wide.stop()
        return capacity, budget.value, slots.value, exposition, (second, third)

    capacity, budget, slots, exposition, _ = run(scenario())
    assert (capacity.slots, capacity.capacity, capacity.free, capacity.budget_s) == (3, 2, 2, pytest.approx(0.068))
    assert str(budget) == (
        "at capacity: 2 of 2 sessions, predicted tick 70.0 ms of 80.0 ms (headroom 15%); one more session would pass "
        "the budget of 68.0 ms"
    )
    assert (budget.reason, budget.sessions, budget.capacity, budget.slots) == (messages.AT_CAPACITY, 2, 2, 3)
    assert (budget.predicted_tick_s, budget.tick_period_s, budget.headroom) == (pytest.approx(0.07), 0.08, 0.15)
    assert str(slots) == (
        "at capacity: 3 of 3 sessions, predicted tick 9.0 ms of 80.0 ms (headroom 0%); all 3 session slots are taken"
    )
    assert 'duplexcadence_sessions_refused_total{reason="at-capacity"} 1.0' in exposition
    assert "duplexcadence_sessions_admitted_total 3.0" in exposition


def test_the_admission_rule_and_the_calibration_line():
    rule = AdmissionRule(24, None, TickModel(0.1, 0.032), 1.0, 0.15)
    assert rule.capacity() == 23 and rule.refusal(22, False) is None
    assert str(rule.refusal(23, False)) == (
        "at capacity: 23 of 23 sessions, predicted tick 868 ms of 1000 ms (headroom 15%); one more session would pass "
        "the budget of 850 ms"
    )
    grouped = AdmissionRule(640, 32, TickModel(0.004, 0.0035), 0.08, 0.15)  # 20 groups of 32 rows
    assert grouped.units(33) == 2 and grouped.capacity() == 576  # 18 groups: 67 ms of the 68 ms budget
    assert str(rule.refusal(3, True)) == "draining: this pool admits no new session while its 3 sessions finish"
    assert rule.refusal(5, False, observed_p99_s=0.85) is None  # at the budget, not over it
    assert str(rule.refusal(5, False, observed_p99_s=0.9)) == (
        "at capacity: 5 sessions open, their ticks' p99 latency over the last 5000 ms is 900 ms of 1000 ms, over the "
        "budget of 850 ms (headroom 15%); the pool admits again once it is under"
    )
    guarded = rule.snapshot(5, False, 1, observed_p99_s=0.9)
    assert (guarded.capacity, guarded.free, guarded.observed_tick_p99_s) == (5, 0, 0.9)
    # with no session open the slow ticks were of sessions that left: the guard admits (a loaded host's)
    assert rule.refusal(0, False, observed_p99_s=0.9) is None
    assert rule.snapshot(0, False, 1, observed_p99_s=0.9).free == 23
    unguarded = AdmissionRule(24, None, TickModel(0.1, 0.032), 1.0, 0.15, enforce_budget=False)
    assert unguarded.refusal(5, False, observed_p99_s=0.9) is None
    model_only = AdmissionRule(24, None, TickModel(0.1, 0.032), 1.0, 0.15, latency_guard=False)
    assert model_only.refusal(5, False, observed_p99_s=0.9) is None and model_only.refusal(23, False) is not None
    line = fit([(1, 0.010), (4, 0.025)], "session")
    assert (line.fixed_s, line.per_unit_s) == (pytest.approx(0.005), pytest.approx(0.005))
    assert line.describe() == (
        "calibrated tick: 5.0 ms + 5.0 ms per session (timed at 1 session(s): 10.0 ms, 4 session(s): 25.0 ms)"
    )


def test_a_session_ahead_of_the_cadence_is_stepped_at_its_pace_in_order():
    """Pace 1 tick a period of 100 ms, queue depth 2: a session that sends each tick as soon as the last is
    answered gets its first two at once (its burst), then one a period: 8 ticks take about 600 ms (550 at the
    least: the allowance also fills between the open and the first tick), in order and equal to stock. Unpaced,
    it takes a few milliseconds, every round its own."""

    async def scenario():
        pool = await started(tick_period_s=0.1, pace=1.0, queue_depth=2, gather_s=0.0)
        session = await pool.open(seed=5)
        began = time.perf_counter()
        outputs = [await session.step(TOY.inputs(5, tick)) for tick in range(8)]
        took = time.perf_counter() - began
        await pool.stop()
        return outputs, took

    outputs, took = run(scenario())
    assert took >= 0.55 and equal_to_stock(5, outputs)


def test_the_latency_guard_forgets_its_window_once_the_last_session_closes():
    """Slow ticks of a session that has left say nothing of a new one: once the pool is empty the guard's
    window is cleared, so a session opened at once is admitted (under CPU load this refused with none open)."""

    async def scenario():
        pool = await started(tick_period_s=0.1, tick_model=TickModel(0.0, 0.0))
        session = await pool.open(seed=3)
        step = pool.mode.step

        def slow_step(ticks):
            time.sleep(0.1)
            return step(ticks)

        pool.mode.step = slow_step
        await session.step(TOY.inputs(3, 0))
        pool.mode.step = step
        observed = pool.observed_tick_p99()
        await session.close()
        after = (pool.observed_tick_p99(), pool.capacity().free)
        again = await pool.open(seed=4)
        await pool.stop()
        return observed, after, again

    observed, after, again = run(scenario())
    assert observed >= 0.1 and after == (None, 3) and again.id == 2


def test_ticks_answered_over_the_budget_stop_admission_until_they_age_out_of_the_window():
    """The model admits every slot; a round made slower than the period (the front or the device slower than
    the model says) stops admission for the guard's window (5 periods), then the pool admits again, and the
    open session's stream goes on equal to stock."""

    async def scenario():
        pool = await started(tick_period_s=0.1, tick_model=TickModel(0.0, 0.0))
        session = await pool.open(seed=3)
        step = pool.mode.step

        def slow_step(ticks):
            time.sleep(0.1)  # every tick of this round answers after at least the period
            return step(ticks)

        pool.mode.step = slow_step
        outputs = [await session.step(TOY.inputs(3, 0))]
        pool.mode.step = step
        capacity = pool.capacity()
        with pytest.raises(AdmissionRefused) as refused:
            await pool.open(seed=4)
        exposition = pool.exposition().decode()
        await asyncio.sleep(0.55)  # the slow ticks leave the 500 ms window
        admitted = await pool.open(seed=4)
        for tick in range(1, 4):
            outputs.append(await session.step(TOY.inputs(3, tick)))
        after = pool.capacity()
        await pool.stop()
        return capacity, refused.value, exposition, admitted, outputs, after

    capacity, refused, exposition, admitted, outputs, after = run(scenario())
    assert (capacity.sessions, capacity.capacity, capacity.free) == (1, 1, 0)
    assert capacity.observed_tick_p99_s >= 0.1
    assert re.fullmatch(
        r"at capacity: 1 session open, their ticks' p99 latency over the last 500 ms is \d+ ms of 100 ms, over the "
        r"budget of 85\.0 ms \(headroom 15%\); the pool admits again once it is under",
        str(refused),
    )
    assert refused.reason == messages.AT_CAPACITY
    observed = re.search(r"^duplexcadence_observed_tick_p99_seconds (\S+)$", exposition, re.MULTILINE)
    assert observed is not None and float(observed.group(1)) >= 0.1
    assert admitted is not None and after.sessions == 2
    assert equal_to_stock(3, outputs)


def test_a_draining_pool_admits_nothing_while_its_sessions_finish():
    async def scenario():
        pool = await started()
        session = await pool.open(seed=1)
        pool.drain()
        with pytest.raises(AdmissionRefused) as refused:
            await pool.open()
        still = await session.step(TOY.inputs(1, 0))
        waiting = asyncio.create_task(pool.drained())
        await asyncio.sleep(0)
        assert not waiting.done()
        await session.close()
        await asyncio.wait_for(waiting, 10)
        snapshot = pool.capacity()
        await pool.stop()
        return refused.value, still, snapshot

    refused, still, snapshot = run(scenario())
    assert (refused.reason, str(refused)) == (
        messages.DRAINING,
        "draining: this pool admits no new session while its 1 session finish",
    )
    assert equal_to_stock(1, [still])
    assert (snapshot.draining, snapshot.free, snapshot.sessions) == (True, 0, 0)


def test_a_reset_starts_the_stream_over_after_the_ticks_sent_before_it():
    async def scenario():
        pool = await started(queue_depth=6)
        session = await pool.open(seed=7)
        before = [session.submit(TOY.inputs(7, tick)) for tick in range(3)]
        reset = session.reset()
        after = [session.submit(TOY.inputs(7, tick)) for tick in range(3)]
        results = [await f for f in before], await reset, [await f for f in after]
        await pool.stop()
        return results

    before, reset, after = run(scenario())
    assert reset is None
    assert equal_to_stock(7, before) and equal_to_stock(7, after)


def test_a_stage_failure_fails_its_session_only_until_a_reset():
    async def scenario():
        pool = await started()
        bad, good = await pool.open(seed=3), await pool.open(seed=5)
        codes = {"codes": torch.tensor([[64]])}  # past the toy's 64-entry embedding: the stage raises
        failing, fine = bad.submit(codes), good.submit(TOY.inputs(5, 0))  # one round
        with pytest.raises(TickError) as failed:
            await failing
        first = await fine
        with pytest.raises(TickError) as refused:
            await bad.step(TOY.inputs(3, 0))
        await bad.reset()
        recovered = [await bad.step(TOY.inputs(3, tick)) for tick in range(2)]
        second = await good.step(TOY.inputs(5, 1))
        errors = pool.exposition().decode()
        await pool.stop()
        return failed.value, refused.value, recovered, [first, second], errors

    failed, refused, recovered, good, errors = run(scenario())
    assert failed.code == messages.STAGE_FAILED and "stage 'encode'" in failed.message
    assert refused.code == messages.SESSION_FAILED
    assert refused.message.startswith("the session failed (stage 'encode'")
    assert refused.message.endswith('send {"type": "reset"} to start it again')
    assert equal_to_stock(3, recovered) and equal_to_stock(5, good)
    assert 'duplexcadence_tick_errors_total{code="stage-failed"} 1.0' in errors


def test_inputs_the_tail_cannot_take_are_refused_before_anything_is_queued():
    async def scenario():
        pool = await started()
        session = await pool.open(seed=0)
        problems = {}
        for case, inputs in {
            "unknown": {"codes": torch.zeros(1, 1, dtype=torch.int64), "pitch": torch.zeros(1)},
            "missing": {},
            "dtype": {"codes": torch.zeros(1, 1, dtype=torch.int32)},
            "rank": {"codes": torch.zeros(1, dtype=torch.int64)},
            "batch": {"codes": torch.zeros(2, 1, dtype=torch.int64)},
        }.items():
            with pytest.raises(TickError) as raised:
                session.submit(inputs)
            problems[case] = (raised.value.code, raised.value.message)
        outputs = [await session.step(TOY.inputs(0, 0))]
        await pool.stop()
        return problems, outputs

    problems, outputs = run(scenario())
    assert problems == {
        "unknown": (messages.UNKNOWN_INPUT, "'pitch' is not an input of this tail; its inputs are codes"),
        "missing": (messages.MISSING_INPUT, "the tick has no 'codes'; every tick gives codes"),
        "dtype": (messages.WRONG_DTYPE, "input 'codes' is i32; the tail's region is i64"),
        "rank": (
            messages.WRONG_SHAPE,
            "input 'codes' has shape [1]; the tail takes i64[1, time] (2 dimensions, not 1)",
        ),
        "batch": (
            messages.WRONG_SHAPE,
            "input 'codes' has shape [2, 1]; the tail takes i64[1, time] (dimension 0 must be 1)",
        ),
    }
    assert equal_to_stock(0, outputs)  # the refused ticks left the session at its start


def test_an_idle_session_is_closed_and_its_slot_freed():
    async def scenario():
        pool = await started(idle_timeout_s=0.2)
        session = await pool.open(seed=0)
        await asyncio.wait_for(session.closed_event.wait(), 30)
        with pytest.raises(SessionClosed) as closed:
            session.submit(TOY.inputs(0, 0))
        snapshot = pool.capacity()
        exposition = pool.exposition().decode()
        await pool.stop()
        return session, closed.value, snapshot, exposition

    session, closed, snapshot, exposition = run(scenario())
    assert session.close_code == messages.IDLE_TIMEOUT
    assert closed.message == (
        "the session is closed (the session sent nothing for 0.2 s (the pool's idle timeout) and was closed; its "
        "slot is free)"
    )
    assert (snapshot.sessions, snapshot.free) == (0, 2)
    assert 'duplexcadence_sessions_closed_total{reason="idle-timeout"} 1.0' in exposition


def test_the_latency_histograms_take_the_answered_ticks_within_a_publish_period_without_a_scrape():
    async def scenario():
        pool = await started(enforce_tick_budget=False)
        session = await pool.open(seed=0)
        for tick in range(3):
            await session.step(TOY.inputs(0, tick))
        await asyncio.sleep(3 * OBSERVE_EVERY_S)
        samples = {
            sample.name: sample.value
            for histogram in (pool.metrics.tick_latency, pool.metrics.tick_wait)
            for sample in histogram.collect()[0].samples
            if sample.name.endswith("_count")
        }
        await pool.stop()
        return samples

    assert run(scenario()) == {
        "duplexcadence_tick_latency_seconds_count": 3.0,
        "duplexcadence_tick_wait_seconds_count": 3.0,
    }


@pytest.mark.parametrize(("period", "missed"), [(1e-9, 5), (3600.0, 0)])
def test_deadline_accounting_counts_the_ticks_over_the_period(period, missed):
    async def scenario():
        pool = await started(tick_period_s=period, enforce_tick_budget=False, pace=None)
        session = await pool.open(seed=0)
        for tick in range(5):
            await session.step(TOY.inputs(0, tick))
        report, exposition = pool.deadlines(), pool.exposition().decode()
        await pool.stop()
        return report, exposition

    report, exposition = run(scenario())
    assert (report.ticks, report.missed, report.tick_period_s) == (5, missed, period)
    (stats,) = report.sessions
    assert (stats.ticks, stats.missed, stats.errors) == (5, missed, 0)
    assert report.latency_p50_s <= report.latency_p99_s <= report.latency_max_s
    assert f"duplexcadence_ticks_missed_total {missed:.1f}" in exposition
    assert "duplexcadence_ticks_total 5.0" in exposition
    assert "duplexcadence_tick_latency_seconds_count 5.0" in exposition
    assert "duplexcadence_tick_wait_seconds_count 5.0" in exposition
    assert f"duplexcadence_tick_period_seconds {period}" in exposition


def test_a_calibrated_pool_reports_its_tick_model_and_the_runtime_s_numbers():
    async def scenario():
        pool = SessionPool(TOY, PoolConfig(slots=6, lanes=2, calibration_warmup=1, calibration_repeats=2))
        await pool.start()
        text, model, exposition = pool.describe(), pool.model, pool.exposition().decode()
        await pool.stop()
        return text, model, exposition

    text, model, exposition = run(scenario())
    assert [units for units, _ in model.points] == [1, 4, 6]  # 1, min(slots, 2 x lanes) and every slot
    assert model.fixed_s >= 0 and model.per_unit_s >= 0 and model.unit == "session"
    lines = text.splitlines()
    assert lines[0] == "serving 'toy' on cpu: 6 session slots in 2 lane(s); tick period 80.0 ms"
    assert lines[1] == "arena 48128 bytes (7680 per slot + 2 x 1024 scratch); 0 graphs captured"
    assert lines[2] == model.describe() and lines[2].startswith("calibrated tick: ")
    assert "duplexcadence_arena_bytes 48128.0" in exposition
    assert 'duplexcadence_eager_firings_total{kind="planned"}' in exposition


def test_lockstep_is_refused_where_the_plan_cannot_take_a_session_into_a_running_group():
    async def scenario():
        pool = SessionPool(TOY, PoolConfig(slots=1, lockstep=2, tick_model=MODEL))
        with pytest.raises(ValueError) as refused:
            await pool.start()
        return str(refused.value)

    assert run(scenario()) == (
        "--lockstep 2: this plan cannot take a session into a running group: region(s) cache do not start as "
        "zeros, so a zeroed row is not a fresh one; members join at the group's start"
    )


def test_a_config_out_of_range_is_refused_with_every_problem():
    with pytest.raises(ValueError) as refused:
        SessionPool(TOY, PoolConfig(slots=2, lanes=3, headroom=1.5, queue_depth=0))
    assert str(refused.value) == (
        "lanes must be from 1 to slots (2), not 3; headroom must be from 0 to below 1, not 1.5; the queue depth must "
        "be at least 1, not 0"
    )


def test_a_round_gathers_the_ticks_of_every_session_paced_by_the_cadence():
    async def scenario():
        pool = await started(gather_s=60.0)
        a, b = await pool.open(seed=1), await pool.open(seed=2)
        first = a.submit(TOY.inputs(1, 0))
        await asyncio.sleep(0.05)  # the scheduler holds the round: b has nothing queued yet
        assert not first.done() and len(pool.round_log) == 0
        second = b.submit(TOY.inputs(2, 0))
        outputs = [await first, await second]
        rounds = [units for units, _ in pool.round_log]
        exposition = pool.exposition().decode()
        await pool.stop()
        wait = {
            name: float(value)
            for name, _, value in (line.partition(" ") for line in exposition.splitlines())
            if name.startswith("duplexcadence_tick_wait_seconds_")
        }
        return outputs, rounds, wait

    outputs, rounds, wait = run(scenario())
    assert rounds == [2]  # one step_many for both sessions
    # both ticks' waits are counted; a's includes the 50 ms the round was held for b
    assert wait["duplexcadence_tick_wait_seconds_count"] == 2 and wait["duplexcadence_tick_wait_seconds_sum"] >= 0.05
    assert equal_to_stock(1, outputs[:1]) and equal_to_stock(2, outputs[1:])


@pytest.mark.parametrize("freeze", [True, False])
def test_a_started_pool_keeps_what_it_loaded_out_of_the_collectors_walk_until_it_stops(freeze):
    import gc

    before = gc.get_freeze_count()

    async def scenario():
        pool = SessionPool(TOY, PoolConfig(slots=1, tick_model=TickModel(0.001, 0.001), freeze_gc=freeze))
        await pool.start()
        frozen = gc.get_freeze_count()
        runtime_frozen = any(obj is pool.loaded.runtime for obj in gc.get_objects()) is False
        session = await pool.open(seed=3)
        outputs = [await session.step(TOY.inputs(3, tick)) for tick in range(3)]
        await session.close()
        await pool.stop()
        return frozen, runtime_frozen, outputs

    frozen, runtime_frozen, outputs = run(scenario())
    assert (frozen > before, runtime_frozen) == (freeze, freeze)
    assert gc.get_freeze_count() == (0 if freeze else before)
    assert equal_to_stock(3, outputs)


def test_a_fault_of_the_scheduler_itself_closes_its_sessions_with_internal_and_the_pool_serves_on():
    """A bug in a round's choice (made to raise here) fails the tick with `internal` and closes the pool's
    sessions with that code instead of leaving them waiting for ever; a session opened after is served."""

    async def scenario():
        pool = await started()
        session = await pool.open(seed=8)
        choose = pool.choose

        def broken(candidates, work):
            pool.choose = choose
            raise RuntimeError("a bug")

        pool.choose = broken
        with pytest.raises(TickError) as failed:
            await session.step(TOY.inputs(8, 0))
        await asyncio.wait_for(session.closed_event.wait(), 10)
        again = await pool.open(seed=8)
        outputs = [await again.step(TOY.inputs(8, tick)) for tick in range(3)]
        await pool.stop()
        return failed.value, session, outputs

    failed, session, outputs = run(scenario())
    assert (failed.code, session.close_code) == (messages.INTERNAL, messages.INTERNAL)
    assert failed.message == messages.internal(RuntimeError("a bug")) and equal_to_stock(8, outputs)
