"""Moshi's Mimi decoder tail in a lockstep group: independent conversations in the rows of one B=3 session.

moshi 0.2.13 keeps every decode offset per batch row and its ring keeps its shapes from the first frame,
so the plan lets a member join at any instant (its row zeroed). The reference is moshi's own streaming
decode at the same batch with `reset_streaming(mask)` on the joining row: every member's every frame
`torch.equal` to its row there, past the ring's wrap (frame 125) for a member that joined late, and the
group's regions never move. Whether a row also equals a batch-1 decode depends on the kernels chosen for
the batch (it does not on CPU); docs/benchmarks.md reports it on the GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from duplexcadence.examples.moshi import model as mimi_model  # noqa: E402
from duplexcadence.examples.moshi.cadence import load_runtime  # noqa: E402
from duplexcadence.examples.moshi.stock import MoshiStockDecoder  # noqa: E402
from duplexcadence.interpreter.runtime.lockstep import LockstepGroup  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

ROWS = 3
LATE_JOIN = 5  # row 2's member joins here ...
FRAMES = LATE_JOIN + 132  # ... and decodes 132 frames: past the ring's wrap at 125
SWAP = 60  # row 1's member leaves here and a new one takes the row


def test_members_joining_late_equal_moshis_batched_decode_with_row_resets():
    streams = [mimi_model.random_codes(1, FRAMES, seed=20 + i) for i in range(4)]
    group = LockstepGroup(load_runtime(mimi_model.build_mimi(seed=1234), ROWS))
    assert group.join_problem(LATE_JOIN) is None
    members = {"a": group.join(), "b": group.join()}
    pointers = group.session.data_ptrs()
    position = {"a": 0, "b": 0}
    unequal: dict[str, int] = {}
    with torch.no_grad(), MoshiStockDecoder(mimi_model.build_mimi(seed=1234), ROWS, mode="eager") as stock:
        for t in range(FRAMES):
            if t == LATE_JOIN:
                members["c"] = group.join()
                position["c"] = 0
                stock.reset(torch.tensor([False, False, True]))
            if t == SWAP:
                members.pop("b").leave()
                members["d"] = group.join()
                position["d"] = 0
                stock.reset(torch.tensor([False, True, False]))
            frames = {
                name: streams[ord(name) - ord("a")][:, :, position[name] : position[name] + 1] for name in members
            }
            batch = torch.zeros(ROWS, 8, 1, dtype=torch.long)
            for name, member in members.items():
                batch[member.row] = frames[name][0]
            expected = stock.step(batch)
            outputs = group.step({member: frames[name] for name, member in members.items()})
            for name, member in members.items():
                if not torch.equal(outputs[member], expected[member.row : member.row + 1]):
                    unequal[name] = unequal.get(name, 0) + 1
                position[name] += 1
            assert group.session.data_ptrs() == pointers
    assert unequal == {}
    assert {name: m.row for name, m in members.items()} == {"a": 0, "c": 2, "d": 1}
    assert (members["c"].instant, members["d"].instant) == (FRAMES - LATE_JOIN, FRAMES - SWAP)
    assert group.session.counters.eager_off_plan == 0
