"""A stage that writes more or fewer units than its `.clock` declares must fail with a message naming
the region, as a wrong-length `update` does (docs/runtime.md, "a stage's new version ... must have
the length the .clock promises"; docs/tutorial.md, section 7).

Unmeasured, fewer units would come back padded with stale arena bytes and more would fail inside a
tensor view, naming neither the stage's region nor the lengths.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = """\
cadence 1 s
clock frame = 12.5 Hz
clock sample = frame * 4
region codes : i64[1, time] on frame input
region pcm : f32[1, time] on sample output
stage emit on frame {
    module ""
    read codes
    write pcm +4
}
"""


class Emit(nn.Module):
    """Writes `samples` samples per frame, whatever the `.clock` says."""

    def __init__(self, samples: int):
        super().__init__()
        self.samples = samples

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.float().repeat(1, self.samples) + 0.5


def test_a_write_of_the_declared_length_is_returned_whole(tmp_path):
    clock = tmp_path / "emit.clock"
    clock.write_text(CLOCK)
    session = Runtime.load(clock, Emit(4), device="cpu").session()
    assert torch.equal(session.step(codes=torch.tensor([[3]])), torch.full((1, 4), 3.5))


@pytest.mark.parametrize("samples", [2, 6])
def test_a_write_of_another_length_fails_naming_the_region(tmp_path, samples):
    clock = tmp_path / "emit.clock"
    clock.write_text(CLOCK)
    session = Runtime.load(clock, Emit(samples), device="cpu").session()
    with pytest.raises(SessionFailed, match="region 'pcm'"):
        session.step(codes=torch.tensor([[3]]))
