"""Run-time faults on the CPU path: what a stage gives back must be what the `.clock` declares, a bad
`step()`/`finish()` call changes nothing, and a stage that raises fails only its own session.

A stage's new version or written units that disagree with the declared shape would otherwise be
broadcast by the copy into the arena (a [1, 1, T] version fills every channel of a [1, 2, T] region)
or leave stale units in an output: both are refused, naming the stage, the region and both shapes.
"""

from __future__ import annotations

import pytest
import torch

from duplexcadence.interpreter.runtime import Runtime, SessionFailed

CLOCK = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, 2, time] on frame input
region hist : f32[1, 2, time] on frame retain last 2 start zeros
region y : f32[1, 2, time] on frame output
stage s on frame {
    hook s
    read x
    update hist +1
    write y +1
}
"""


class Model:
    """The hook's outputs, bent by the test: `hist` and `y` map a correct value to the returned one."""

    def __init__(self):
        self.hist = lambda value: value
        self.y = lambda value: value


def hook(model, x, hist):
    joined = torch.cat([hist, x], dim=2)
    return model.hist(joined), model.y(joined.sum(dim=2, keepdim=True))


def load(tmp_path, model):
    path = tmp_path / "faults.clock"
    path.write_text(CLOCK)
    return Runtime.load(path, model, hooks={"s": hook}, device="cpu")


def test_the_well_behaved_hook_runs(tmp_path):
    session = load(tmp_path, Model()).session()
    outputs = [session.step(x=torch.full((1, 2, 1), float(v))) for v in (1, 2, 3)]
    assert [o[0, 0, 0].item() for o in outputs] == [1.0, 3.0, 6.0]


@pytest.mark.parametrize("attribute,bend,says", [
    ("hist", lambda v: v[:, :1], "stage 's' gave f32[1, 1, 3] on cpu as the new version of region 'hist', "
                                 "declared f32[1, 2, time]"),
    ("hist", lambda v: v[0], "stage 's' gave f32[2, 3] on cpu as the new version of region 'hist'"),
    ("y", lambda v: v[:, :1], "stage 's' wrote f32[1, 1, 1] on cpu to region 'y', declared f32[1, 2, time] "
                              "with 1 units at this firing"),
    ("y", lambda v: torch.cat([v, v], dim=2), "stage 's' wrote f32[1, 2, 2] on cpu to region 'y', declared "
                                              "f32[1, 2, time] with 1 units at this firing"),
    ("y", lambda v: v[:, :, :0], "stage 's' wrote f32[1, 2, 0] on cpu to region 'y'"),
])
def test_a_version_or_a_write_of_another_shape_is_refused_not_broadcast(tmp_path, attribute, bend, says):
    model = Model()
    session = load(tmp_path, model).session()
    session.step(x=torch.ones(1, 2, 1))
    setattr(model, attribute, bend)
    with pytest.raises(SessionFailed) as caught:
        session.step(x=torch.ones(1, 2, 1))
    assert says in str(caught.value)
