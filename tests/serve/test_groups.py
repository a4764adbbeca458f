"""Lockstep groups that one member cannot hold hostage: a member that keeps its group waiting past the tick
period three times in a row is closed (`too-slow`) and the group goes on; a member's input outside the tail's
bounds is refused before the group's step, which it would fail for every row. The tail is a small Mimi-shaped
one written here (codes looked up in a table of 2048 rows: a code past it raises in the stage)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

import duplexcadence
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool
from duplexcadence.interpreter.serve.scheduler import TickError
from duplexcadence.interpreter.serve.tail import LoadedTail, ServedTail

CLOCK = """
cadence 1 s
param B = 1
clock frame = 12.5 Hz
region codes : i64[B, 8, time] on frame input
region pcm : f32[B, 1, time] on frame output
region level : f32[B, 1] start zeros
stage decode on frame {
    hook decode
    read codes
    update level
    write pcm +1
}
"""
TABLE = torch.arange(2048, dtype=torch.float32)


def decode(model, codes: torch.Tensor, level: torch.Tensor):
    level = level + TABLE[codes[:, 0, :]]  # IndexError past the table
    return level, level.unsqueeze(-1)


def codes(seed: int, tick: int) -> dict[str, torch.Tensor]:
    return {"codes": torch.full((1, 8, 1), (seed * 7 + tick) % 2048, dtype=torch.int64)}


@pytest.fixture(scope="module")
def tail(tmp_path_factory) -> ServedTail:
    path = Path(tmp_path_factory.mktemp("groups")) / "table.clock"
    path.write_text(CLOCK)

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        runtime = duplexcadence.Runtime.load(
            path, torch.nn.Module(), params={"B": rows or 1}, hooks={"decode": decode}, sessions=sessions
        )
        return LoadedTail(runtime)

    return ServedTail("table", load, inputs=codes, input_bounds={"codes": (0, 2047)})


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


async def started(tail: ServedTail) -> SessionPool:
    config = PoolConfig(slots=1, lockstep=3, tick_model=TickModel(0.001, 0.001), tick_period_s=0.1, gather_s=0.0)
    pool = SessionPool(tail, config)
    await pool.start()
    return pool


def test_a_member_that_keeps_its_group_waiting_is_closed_and_the_group_goes_on(tail):
    """Two members tick at the cadence; the third opens and sends nothing. The group waits three periods for
    it, closes it with `too-slow`, and the two honest members' ticks all run, their levels the sum of their
    own codes (the rows stay independent)."""

    async def scenario():
        pool = await started(tail)
        honest = [await pool.open(seed=1), await pool.open(seed=2)]
        silent = await pool.open(seed=3)
        outputs = {session.id: [] for session in honest}
        for tick in range(6):
            answers = await asyncio.gather(*(session.step(codes(session.seed, tick)) for session in honest))
            for session, answer in zip(honest, answers, strict=True):
                outputs[session.id].append(answer["pcm"].item())
        await pool.stop()
        return honest, silent, outputs

    honest, silent, outputs = run(scenario())
    assert (silent.close_code, silent.close_message) == (messages.TOO_SLOW, messages.too_slow(3, 0.1))
    for session in honest:
        levels = [sum(codes(session.seed, t)["codes"][0, 0, 0].item() for t in range(tick + 1)) for tick in range(6)]
        assert outputs[session.id] == levels


def test_a_members_code_past_the_table_is_refused_alone_before_the_group_steps(tail):
    async def scenario():
        pool = await started(tail)
        members = [await pool.open(seed=seed) for seed in (4, 5, 6)]
        bad = codes(4, 0)
        bad["codes"][0, 0, 0] = 5000  # the stage would raise for every row of the group
        with pytest.raises(TickError) as refused:
            members[0].submit(bad)
        answers = await asyncio.gather(*(member.step(codes(member.seed, 0)) for member in members))
        await pool.stop()
        return refused.value, answers, members

    refused, answers, members = run(scenario())
    assert (refused.code, refused.message) == (messages.BAD_INPUT, messages.out_of_bounds("codes", 5000, 0, 2047))
    assert [answer["pcm"].item() for answer in answers] == [codes(m.seed, 0)["codes"][0, 0, 0].item() for m in members]
    assert all(member.failed is None for member in members)
