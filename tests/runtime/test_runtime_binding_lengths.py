"""Between firings, a bound attribute points at its region's view of the region's current length.

When one stage changes a region's length and a later stage of the same instant fires, the binding
refreshed after the later firing must still reflect the earlier stage's update (not the length the
region had when the instant began).
"""

from __future__ import annotations

import torch
from torch import nn

from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = """
cadence 1 s
clock frame = 12.5 Hz
region x : f32[1, time] on frame input
region y : f32[1, time] on frame output
region carry : f32[1, time] on frame retain last 2 start empty bind "head.carry"
region mid : f32[1, time] on frame retain scratch

stage head on frame {
    module "head"
    read x
    update carry +1
    write mid +1
}

stage second on frame {
    module "second"
    read mid
    write y +1
}
"""


class Carrying(nn.Module):
    """Keeps its last two inputs in `self.carry` (None at start), rebuilt with torch.cat."""

    def __init__(self) -> None:
        super().__init__()
        self.carry: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joined = x if self.carry is None else torch.cat([self.carry, x], dim=-1)
        self.carry = joined[..., -2:]
        return joined.sum(dim=-1, keepdim=True)


class PlusOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def test_binding_after_a_later_stage_keeps_the_earlier_update(tmp_path):
    path = tmp_path / "two_stages.clock"
    path.write_text(CLOCK)
    model = nn.Module()
    model.head = Carrying()
    model.second = PlusOne()
    runtime = Runtime.load(path, model)
    session = runtime.session()
    for tick, expected_length in enumerate([1, 2, 2, 2]):
        session.step(x=torch.full((1, 1), float(tick)))
        carry = model.head.carry
        assert carry.shape == (1, expected_length), tick
        assert carry.data_ptr() == session.data_ptrs()["carry"]
        assert torch.equal(carry, session.region("carry"))
