"""Moshi's Mimi decoder (released size, seeded weights) through the websocket server, a few frames each:
sessions in lanes equal each session decoded alone by moshi's stock streaming decode; sessions in a lockstep
group (one joining two frames late) equal moshi's own batched decode with the same rows and the row reset at
the join (a row is not bit-equal to a batch-1 decode: docs/runtime.md). On the CPU, and on CUDA where there
is one (the copies to and from the device are batched there)."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

import duplexcadence  # noqa: E402
from duplexcadence.interpreter.serve import messages  # noqa: E402
from duplexcadence.interpreter.serve.admission import TickModel  # noqa: E402
from duplexcadence.interpreter.serve.app import make_app  # noqa: E402
from duplexcadence.interpreter.serve.client import SessionClient  # noqa: E402
from duplexcadence.interpreter.serve.loadgen import SessionLoad, compare_with_stock  # noqa: E402
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool  # noqa: E402
from duplexcadence.interpreter.serve.scheduler import TickError  # noqa: E402
from duplexcadence.interpreter.serve.server import ServerThread  # noqa: E402
from duplexcadence.interpreter.serve.tail import served_tail  # noqa: E402

pytestmark = pytest.mark.models

MODEL = TickModel(0.001, 0.001)
# A Mimi frame on the CPU takes longer than the 80 ms period: the pools admit on this model alone
# (latency_guard=False), or the ticks answered would keep a second session out.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
    ),
]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=600))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.slow
def test_sessions_in_lanes_equal_each_session_decoded_alone_by_moshi(device):
    moshi = served_tail("moshi", device=device)
    pool = SessionPool(moshi, PoolConfig(slots=2, lanes=2, tick_model=MODEL, latency_guard=False))

    async def scenario(url):
        clients = [await SessionClient.connect(url, seed=seed) for seed in (1, 2)]
        outputs = {1: [], 2: []}
        for tick in range(3):
            for client in clients:
                await client.send(moshi.inputs(client.ready["seed"], tick))
            for client in clients:
                outputs[client.ready["seed"]].append(await client.receive())
        for client in clients:
            await client.close()
        return outputs

    with ServerThread(make_app(pool)) as server:
        outputs = run(scenario(server.ws_url()))
    for seed, frames in outputs.items():
        assert [tuple(frame["pcm"].shape) for frame in frames] == [(1, 1, 1920)] * 3
        assert compare_with_stock(moshi, SessionLoad(seed, 3, (), (), 0, None, tuple(frames))) == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.slow
def test_sessions_in_a_lockstep_group_equal_moshis_batched_decode_with_a_late_join(device):
    from duplexcadence.examples.moshi.model import build_mimi
    from duplexcadence.examples.moshi.stock import MoshiStockDecoder
    from duplexcadence.interpreter.serve.tail import deterministic_cudnn

    moshi = served_tail("moshi", device=device)
    pool = SessionPool(moshi, PoolConfig(slots=1, lockstep=2, tick_model=MODEL, latency_guard=False))

    async def scenario(url):
        first = await SessionClient.connect(url, seed=1)
        alone = [await first.step(moshi.inputs(1, tick)) for tick in range(2)]
        second = await SessionClient.connect(url, seed=2)
        together = []
        for tick in range(2):
            await first.send(moshi.inputs(1, tick + 2))
            await second.send(moshi.inputs(2, tick))
            together.append((await first.receive(), await second.receive()))
        rows = (first.ready["row"], second.ready["row"])
        await first.close()
        await second.close()
        return alone, together, rows

    with ServerThread(make_app(pool)) as server:
        alone, together, rows = run(scenario(server.ws_url()))
    assert rows == (0, 1)
    stock = MoshiStockDecoder(build_mimi(seed=1234, device=device), 2, mode="eager_compiled_rope")
    zeros = torch.zeros_like(moshi.inputs(1, 0)["codes"])

    def step(*codes):
        with deterministic_cudnn(), torch.no_grad():
            return stock.step(torch.cat(codes).to(device)).cpu()

    for tick, served in enumerate(alone):
        expected = step(moshi.inputs(1, tick)["codes"], zeros)
        assert torch.equal(served["pcm"], expected[0:1])
    stock.reset(torch.tensor([False, True], device=device))  # the second session's row starts at its join
    for tick, (a, b) in enumerate(together):
        expected = step(moshi.inputs(1, tick + 2)["codes"], moshi.inputs(2, tick)["codes"])
        assert torch.equal(a["pcm"], expected[0:1]) and torch.equal(b["pcm"], expected[1:2])


@pytest.mark.slow
def test_loadgen_verifies_lockstep_rows_against_their_groups_batched_decode():
    """Three sessions in groups of 2 (one group full, one with an idle row), paced off, every output recorded:
    each row equals moshi's batched decode of its group; the full group's rows checked against each other's
    inputs do not."""
    import attrs

    from duplexcadence.interpreter.serve.loadgen import run_load, verify

    moshi = served_tail("moshi")
    pool = SessionPool(moshi, PoolConfig(slots=2, lockstep=2, tick_model=MODEL, latency_guard=False))
    with ServerThread(make_app(pool)) as server:
        report = run(run_load(server.ws_url(), 3, 3, moshi.inputs, paced=False, record=3, first_seed=5))
    assert report.errors == {} and report.opened == 3
    assert sorted((load.group, load.row) for load in report.per_session) == [(0, 0), (0, 1), (1, 0)]
    checked = verify(moshi, report, lockstep_rows=2)
    assert (checked.verified_sessions, checked.verified_ticks, checked.unequal_ticks) == (3, 9, 0)
    assert checked.lines()[-1] == (
        "verify: 9 ticks of 3 sessions compared with the batched stock of their lockstep groups, 0 not torch.equal"
    )
    full = [load for load in report.per_session if load.group == 0]
    seeds = {full[0].seed: full[1].seed, full[1].seed: full[0].seed}
    swapped = [attrs.evolve(load, seed=seeds.get(load.seed, load.seed)) for load in report.per_session]
    wrong = verify(moshi, attrs.evolve(report, per_session=tuple(swapped)), lockstep_rows=2)
    assert (wrong.verified_ticks, wrong.unequal_ticks) == (9, 6)  # the check can fail: each row is its own stream


def test_a_bundle_in_lockstep_fills_a_group_and_its_rows_equal_moshis_batched_decode():
    """A bundle of 2 over one websocket in groups of 2: its members take the group's two rows, and every row
    equals moshi's batched decode of the group."""
    from duplexcadence.interpreter.serve.loadgen import run_load, verify

    moshi = served_tail("moshi")
    pool = SessionPool(moshi, PoolConfig(slots=2, lockstep=2, tick_model=MODEL, latency_guard=False))
    with ServerThread(make_app(pool)) as server:
        report = run(run_load(server.ws_url(), 2, 3, moshi.inputs, paced=False, record=2, first_seed=7, bundle=2))
    assert report.errors == {} and report.opened == 2
    assert sorted((load.group, load.row) for load in report.per_session) == [(0, 0), (0, 1)]
    checked = verify(moshi, report, lockstep_rows=2)
    assert (checked.verified_sessions, checked.verified_ticks, checked.unequal_ticks) == (2, 6, 0)


def stacked(moshi, seeds: list[int], tick: int) -> dict:
    """A bundle's tick: the sessions' codes of `tick`, stacked in seed order."""
    return {"codes": torch.stack([moshi.inputs(seed, tick)["codes"] for seed in seeds])}


@pytest.mark.slow
def test_a_bundle_that_fills_whole_groups_steps_them_whole_with_the_outputs_of_its_sessions_stepped_alone():
    """Two groups of 2 rows filled by one bundle of 4 against the same groups filled by 4 sessions opened one by
    one: four ticks, a reset, two ticks, each answer equal; the bundle's sessions kept open past their idle
    timeout by the bundle's ticks alone (they queue none of their own)."""
    moshi = served_tail("moshi")
    # each tick 1.2 s after the last, 4.8 s in all: a session that queued nothing itself would be idle past 3 s
    config = PoolConfig(slots=2, lockstep=2, tick_model=MODEL, latency_guard=False, idle_timeout_s=3.0)
    seeds = [21, 22, 23, 24]

    async def bundled():
        pool = SessionPool(moshi, config)
        await pool.start()
        bundle = await pool.open_bundle(4, seed=21)
        answers = []
        for tick in range(4):
            answers.append((await bundle.submit(stacked(moshi, seeds, tick)))["pcm"])
            await asyncio.sleep(1.2)
        await bundle.reset()
        answers += [(await bundle.submit(stacked(moshi, seeds, tick)))["pcm"] for tick in range(2)]
        rows = [[member.info()["row"] for member in group] for group in bundle.fused or []]
        alive = bundle.closing is None
        exposition = pool.exposition().decode()
        await bundle.close()
        await pool.stop()
        return answers, rows, alive, exposition

    async def alone():
        pool = SessionPool(moshi, config)
        await pool.start()
        sessions = [await pool.open(seed) for seed in seeds]

        async def tick(number: int) -> torch.Tensor:
            inputs = stacked(moshi, seeds, number)["codes"]
            outputs = await asyncio.gather(*(s.submit({"codes": inputs[i]}) for i, s in enumerate(sessions)))
            return torch.stack([output["pcm"] for output in outputs])

        answers = [await tick(number) for number in range(4)]
        await asyncio.gather(*(session.reset() for session in sessions))
        answers += [await tick(number) for number in range(2)]
        exposition = pool.exposition().decode()
        await pool.stop()
        return answers, exposition

    whole, rows, alive, bundled_metrics = run(bundled())
    one_by_one, alone_metrics = run(alone())
    assert rows == [[0, 1], [0, 1]] and alive
    # six ticks of two whole groups; the sessions opened one by one step row by row
    assert "duplexcadence_whole_group_ticks_total 12.0" in bundled_metrics
    assert "duplexcadence_ticks_total 24.0" in bundled_metrics
    assert "duplexcadence_tick_latency_seconds_count 24.0" in bundled_metrics
    assert "duplexcadence_whole_group_ticks_total 0.0" in alone_metrics
    assert [tuple(answer.shape) for answer in whole] == [(4, 1, 1, 1920)] * 6
    assert all(torch.equal(a, b) for a, b in zip(whole, one_by_one, strict=True))


def test_a_stage_failure_in_a_bundles_whole_group_fails_every_member_and_a_reset_recovers_them():
    """A code past the codebook in one row is refused before the group's step (it would make the stage raise
    for every row); a stage that raises in the group's step (made to here) fails the whole group's tick for
    both members, the next one is refused as failed, and after a reset the bundle steps again with the outputs
    of a fresh bundle."""
    moshi = served_tail("moshi")
    config = PoolConfig(slots=2, lockstep=2, tick_model=MODEL, latency_guard=False)
    seeds = [31, 32]

    async def scenario():
        pool = SessionPool(moshi, config)
        await pool.start()
        bundle = await pool.open_bundle(2, seed=31)
        fresh_bundle = await pool.open_bundle(2, seed=31)
        first = await bundle.submit(stacked(moshi, seeds, 0))
        poisoned = stacked(moshi, seeds, 1)
        poisoned["codes"][1] = 100_000
        with pytest.raises(TickError) as out_of_bounds:
            bundle.submit(poisoned)
        runtime = pool.mode.runtime
        step_many = runtime.step_many

        def stage_raises(batched):
            runtime.step_many = step_many
            (session,) = batched
            cause = duplexcadence.SessionFailed("IndexError: index out of range in self")
            raise duplexcadence.SessionsFailed("a stage raised", {}, {session: cause})

        runtime.step_many = stage_raises
        with pytest.raises(TickError) as failed:
            await bundle.submit(stacked(moshi, seeds, 1))
        with pytest.raises(TickError) as refused:
            await bundle.submit(stacked(moshi, seeds, 1))
        await bundle.reset()
        again = [await bundle.submit(stacked(moshi, seeds, tick)) for tick in range(2)]
        fresh = [await fresh_bundle.submit(stacked(moshi, seeds, tick)) for tick in range(2)]
        whole = (bundle.fused is not None, fresh_bundle.fused is not None)
        await pool.stop()
        return first, out_of_bounds.value, failed.value, refused.value, again, fresh, whole

    first, out_of_bounds, failed, refused, again, fresh, whole = run(scenario())
    assert whole == (True, True)
    assert (out_of_bounds.code, out_of_bounds.message) == (
        messages.BAD_INPUT,
        messages.out_of_bounds("codes", 100_000, 0, 2047),
    )
    assert (failed.code, failed.members) == (messages.STAGE_FAILED, [0, 1])
    assert (refused.code, refused.members) == (messages.SESSION_FAILED, [0, 1])
    assert torch.equal(first["pcm"], fresh[0]["pcm"])
    assert all(torch.equal(a["pcm"], b["pcm"]) for a, b in zip(again, fresh, strict=True))


def test_a_session_opened_while_a_bundle_fills_its_group_takes_another_group():
    moshi = served_tail("moshi")
    config = PoolConfig(slots=3, lockstep=2, tick_model=MODEL, latency_guard=False)

    async def scenario():
        pool = SessionPool(moshi, config)
        await pool.start()
        bundle, single, later = await asyncio.gather(pool.open_bundle(4, seed=1), pool.open(seed=9), pool.open(seed=10))
        groups = ([member.group for member in bundle.members], single.group, later.group)
        whole = bundle.fused is not None
        codes = torch.stack([moshi.inputs(seed, 0)["codes"] for seed in range(1, 5)])
        stepped = await asyncio.gather(
            bundle.submit({"codes": codes}), single.submit(moshi.inputs(9, 0)), later.submit(moshi.inputs(10, 0))
        )
        await pool.stop()
        return groups, whole, stepped

    (bundled, single, later), whole, stepped = run(scenario())
    assert whole and len(set(bundled)) == 2 and single == later and single not in bundled
    assert tuple(stepped[0]["pcm"].shape) == (4, 1, 1, 1920)
