"""Fixed regions updated through a stage's return value, and versions of the wrong dtype.

A fixed region (no time axis) that is not bound to an attribute is passed to the stage, which
returns its new version (a packed conv carry rebuilt with `torch.cat`, as Step-Audio2's conformer
does). A new version or written units of another dtype than declared would be cast silently by the
copy into the arena, so they are refused.
"""

from __future__ import annotations

import pytest
import torch

from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, time] on frame input
region carry : f32[1, 3] start zeros
region y : f32[1, time] on frame output
stage conv on frame {
    hook conv
    read x
    update carry
    write y +1
}
"""


def conv(model, x, carry):
    padded = torch.cat([carry, x], dim=1)
    return padded[:, -3:].to(model.carry_dtype), padded.sum(dim=1, keepdim=True).to(model.out_dtype)


class Model:
    carry_dtype = torch.float32
    out_dtype = torch.float32


def load(tmp_path, model):
    path = tmp_path / "fixed.clock"
    path.write_text(CLOCK)
    return Runtime.load(path, model, hooks={"conv": conv}, device="cpu")


def test_an_unbound_fixed_region_takes_the_returned_version(tmp_path):
    runtime = load(tmp_path, Model())
    session = runtime.session()
    inputs = [torch.tensor([[float(v)]]) for v in (1, 2, 3, 4)]
    outputs = [session.step(x=value) for value in inputs]
    assert [float(o) for o in outputs] == [1.0, 3.0, 6.0, 10.0]
    assert torch.equal(session.region("carry"), torch.tensor([[2.0, 3.0, 4.0]]))


@pytest.mark.parametrize("wrong", ["carry_dtype", "out_dtype"])
def test_a_version_or_a_write_of_another_dtype_is_refused(tmp_path, wrong):
    model = Model()
    setattr(model, wrong, torch.float64)
    session = load(tmp_path, model).session()
    with pytest.raises(SessionFailed, match="declared f32"):
        session.step(x=torch.tensor([[1.0]]))


def test_a_write_of_the_wrong_length_fails_the_step_with_both_shapes(tmp_path):
    """A stage that returns more units than its `write` declares is refused, naming both shapes."""
    import pytest
    import torch

    from duplexcadence.interpreter.runtime.errors import SessionFailed
    from duplexcadence.interpreter.runtime.runtime import Runtime

    clock = tmp_path / "w.clock"
    clock.write_text(
        "cadence 1 s\nclock f = 12.5 Hz\n"
        "region x : f32[1, time] on f input\nregion y : f32[1, time] on f output\n"
        "stage s on f { hook twice; read x; write y +1 }\n"
    )

    def twice(model, x):
        return torch.cat([x, x], dim=-1)  # 2 units where the .clock promises 1

    runtime = Runtime.load(clock, torch.nn.Module(), hooks={"twice": twice})
    session = runtime.session()
    with pytest.raises(SessionFailed) as caught:
        session.step(x=torch.zeros(1, 1))
    assert "stage 's' wrote f32[1, 2] on cpu to region 'y', declared f32[1, time] with 1 unit at this firing" in str(
        caught.value.__cause__
    )
