"""What a hook is handed (docs/runtime.md, "Binding forms"): an unbound family as one positional argument per
member in member order, its new versions taken back in that order; the firing record, counted from 0; and
verify with several outputs, which needs the stock step to return a dict keyed by output name."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from duplexcadence.interpreter.runtime.runtime import Runtime

FAMILY = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, time] on frame input
region kv[layer < 3] : f32[1, time] on frame retain last 2 start zeros
region y : f32[1, time] on frame output
region z : f32[1, time] on frame output
stage s on frame {
    hook s
    read x
    update kv +1
    write y +1
    write z +1
}
"""


def test_a_family_reaches_a_hook_positionally_in_member_order_and_comes_back_in_that_order(tmp_path):
    path = tmp_path / "family.clock"
    path.write_text(FAMILY)
    firings = []

    def s(model, x, kv0, kv1, kv2, firing):
        firings.append((firing.stage, firing.count, firing.instant, firing.time, firing.last))
        versions = [torch.cat([kv, x * (layer + 1)], dim=1) for layer, kv in enumerate((kv0, kv1, kv2))]
        return (*versions, versions[0][:, -1:], versions[2][:, -1:])

    session = Runtime.load(path, None, hooks={"s": s}, device="cpu").session()
    for value in (1.0, 2.0, 3.0):
        outputs = session.step(x=torch.full((1, 1), value))
    assert (outputs["y"].item(), outputs["z"].item()) == (3.0, 9.0)
    assert [session.region(f"kv[{layer}]").tolist() for layer in range(3)] == [
        [[2.0, 3.0]],
        [[4.0, 6.0]],
        [[6.0, 9.0]],
    ]
    tenth = Fraction(1, 10)  # exact seconds since the session started
    assert firings == [("s", 0, 0, 0, False), ("s", 1, 1, tenth, False), ("s", 2, 2, 2 * tenth, False)]


class TwoOutputs:
    """A stock loop for FAMILY's model that returns one tensor instead of a dict."""

    def reset(self) -> None:
        self.kv = [torch.zeros(1, 2) for _ in range(3)]

    def step(self, x):
        return x


def test_verify_needs_a_dict_from_a_stock_step_with_several_outputs(tmp_path):
    path = tmp_path / "family.clock"
    path.write_text(FAMILY)

    def s(model, x, *kv):
        versions = [torch.cat([one, x], dim=1) for one in kv]
        return (*versions, x, x)

    runtime = Runtime.load(path, None, hooks={"s": s}, device="cpu")
    with pytest.raises(ValueError) as caught:
        runtime.verify(TwoOutputs(), lambda t: {"x": torch.ones(1, 1)}, ticks=2)
    assert str(caught.value) == (
        "the stock step returned one tensor, the session y, z: with several outputs the stock step returns a dict "
        "keyed by output name"
    )
    assert runtime.free_slots == [0]  # the verify session was closed
