"""The runtime and pruning: a pruned stage is never called and has no bytes; `prune=False` runs every stage.

`side` reads what `main` hands it, an input only it reads and a `start given` region only it reads,
keeps a carry and writes a region nothing reads: the plan prunes it with the four regions only it
touches. Hooks record every call.
"""

from __future__ import annotations

import pytest
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.interpreter.runtime.errors import StepError
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, time] on frame input
region z : f32[1, time] on frame input
region speaker : f32[1, 2] start given
region h : f32[1, time] on frame retain scratch
region y : f32[1, time] on frame output
region carry : f32[1, time] on frame retain last 2 start zeros
region dead : f32[1, time] on frame retain scratch
stage main on frame { hook main; read x new; write y +1; write h +1 }
stage side on frame { hook side; read h; read z new; read speaker; update carry +1; write dead +1 }
"""


class Model:
    def __init__(self) -> None:
        self.calls: list[str] = []


def main(model: Model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    model.calls.append("main")
    return x * 2, x + 1


def side(model: Model, h, z, speaker, carry) -> tuple[torch.Tensor, torch.Tensor]:
    model.calls.append("side")
    new = torch.cat([carry, h + z + speaker.sum()], dim=1)
    return new, new[:, -1:] * 3


HOOKS = {"main": main, "side": side}
SPEAKER = torch.tensor([[0.5, 0.25]])


def load(tmp_path, prune: bool = True) -> Runtime:
    path = tmp_path / "pruned.clock"
    path.write_text(CLOCK)
    return Runtime.load(path, Model(), hooks=HOOKS, device="cpu", prune=prune)


def frames(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.tensor([[float(t)]]), torch.tensor([[10.0 * t]])) for t in range(count)]


def test_a_pruned_stage_is_never_called_and_holds_no_bytes(tmp_path) -> None:
    runtime = load(tmp_path)
    assert [s.name for s in runtime.plan.pruning.stages] == ["side"]
    assert [r.name for r in runtime.plan.pruning.regions] == ["z", "speaker", "carry", "dead"]
    assert set(runtime.callables) == {"main"}
    assert set(runtime.program.regions) == {"x", "h", "y"}
    assert not any(a.name in ("carry", "dead", "speaker", "z") for a in runtime.plan.arena.allocations)
    assert runtime.plan.arena.session_bytes == 0  # the carry was the only state
    session = runtime.session(initial={"speaker": SPEAKER})  # a pruned `start given` region: taken, ignored
    outputs = [session.step(x=x, z=z) for x, z in frames(5)]  # a pruned input: taken, ignored
    outputs.append(session.step(x=torch.tensor([[5.0]])))  # ... or left out
    assert runtime.model.calls == ["main"] * 6
    assert [float(o) for o in outputs] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    with pytest.raises(KeyError, match="region 'carry' was pruned: touched only by pruned stage 'side'; load"):
        session.region("carry")
    session.close()
    assert runtime.session().step(x=torch.tensor([[1.0]])) is not None  # no initial value needed


def test_prune_false_runs_every_stage_as_declared(tmp_path) -> None:
    runtime = load(tmp_path, prune=False)
    program = load_program(tmp_path / "pruned.clock")
    assert runtime.plan.pruning.stages == () and runtime.program == program
    assert [s.name for s in runtime.plan.pruning.unobserved] == ["side"]
    assert runtime.plan.clocks.stage_order == ("main", "side")
    session = runtime.session(initial={"speaker": SPEAKER})
    outputs = [session.step(x=x, z=z) for x, z in frames(3)]
    assert runtime.model.calls == ["main", "side"] * 3
    assert [float(o) for o in outputs] == [0.0, 2.0, 4.0]
    # carry keeps the last 2 of h + z + 0.75: (0 + 1) + 0 + .75, (1 + 1) + 10 + .75, (2 + 1) + 20 + .75
    assert torch.equal(session.region("carry"), torch.tensor([[12.75, 23.75]]))
    with pytest.raises(StepError, match="missing z"):
        session.step(x=torch.tensor([[1.0]]))
    session.close()
    with pytest.raises(StepError, match="needs initial values for speaker"):
        runtime.session()


def test_pruning_keeps_the_outputs_and_the_kept_state(tmp_path) -> None:
    """The same inputs through both runtimes: the same outputs, tick by tick."""
    pruned, everything = load(tmp_path), load(tmp_path, prune=False)
    a, b = pruned.session(), everything.session(initial={"speaker": SPEAKER})
    for x, z in frames(6):
        assert torch.equal(a.step(x=x), b.step(x=x, z=z))
    assert pruned.model.calls.count("side") == 0 and everything.model.calls.count("side") == 6
