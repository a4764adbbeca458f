"""What the runtime refuses before anything changes, and what a stage must give back exactly.

* `Runtime.load`: `sessions`, `lanes` and `max_graphs` of the wrong type or range (a ValueError), an arena
  over the host's available memory on the CPU (`over-budget`);
* `runtime.session(initial=...)` and `session.reset(initial=...)`: a value on the meta device, sparse or
  nested (a StepError; no slot taken, the session unchanged);
* `check_finite`: NaN and infinite inputs refused (a StepError, the session unchanged); by default they
  propagate, as in the stock model;
* an `update`'s returned length: exactly held + advance, or what the retention keeps of them; a hook that
  hands back the history it was given, unadvanced, or more units than the firing made, fails its session.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter.runtime import runtime as runtime_module
from duplexcadence.interpreter.runtime.errors import SessionFailed, StepError
from duplexcadence.interpreter.runtime.runtime import Runtime

ECHO = """
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


def echo(model, x, hist):
    joined = torch.cat([hist, x], dim=2)
    return model.version(joined, hist), joined.sum(dim=2, keepdim=True)


class Model:
    """`version(joined, handed)` is what the hook returns as the new history: the whole version by default."""

    def __init__(self, version=lambda joined, handed: joined):
        self.version = version


def load(tmp_path, model=None, **options) -> Runtime:
    path = tmp_path / "echo.clock"
    path.write_text(ECHO)
    return Runtime.load(path, model or Model(), hooks={"s": echo}, device="cpu", **options)


def frame(value: float) -> torch.Tensor:
    return torch.full((1, 2, 1), value)


# --- Runtime.load --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,says",
    [
        ({"sessions": "2"}, "sessions must be a whole number of at least 1 (an int), not '2'"),
        ({"sessions": 2.5}, "sessions must be a whole number of at least 1 (an int), not 2.5"),
        ({"sessions": True}, "sessions must be a whole number of at least 1 (an int), not True"),
        ({"sessions": 0}, "sessions must be a whole number of at least 1 (an int), not 0"),
        ({"sessions": 2, "lanes": True}, "lanes must be a whole number from 1 to sessions (2), not True"),
        ({"sessions": 2, "lanes": "1"}, "lanes must be a whole number from 1 to sessions (2), not '1'"),
        ({"sessions": 2, "lanes": 3}, "lanes must be a whole number from 1 to sessions (2), not 3"),
        ({"max_graphs": -1}, "max_graphs must be None (no budget) or a whole number of at least 0, not -1"),
        ({"max_graphs": 1.5}, "max_graphs must be None (no budget) or a whole number of at least 0, not 1.5"),
    ],
)
def test_load_refuses_counts_of_the_wrong_type_or_range(tmp_path, options, says):
    with pytest.raises(ValueError) as caught:
        load(tmp_path, **options)
    assert str(caught.value).startswith(says)


def test_an_arena_over_the_hosts_available_memory_is_refused_on_the_cpu(tmp_path, monkeypatch):
    runtime = load(tmp_path, sessions=3)
    needed = runtime.plan.arena.total_bytes(3)
    monkeypatch.setattr(runtime_module, "host_available_bytes", lambda: needed - 1)
    with pytest.raises(ClockError) as caught:
        load(tmp_path, sessions=3)
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code is messages.BUDGET
    assert diagnostic.message == (
        f"the arena for 3 sessions needs {needed} bytes (3 x {runtime.plan.arena.session_bytes} per session + "
        f"{runtime.plan.arena.scratch_bytes} shared scratch) but the host has {needed - 1} bytes available "
        "(MemAvailable); nothing was allocated"
    )
    monkeypatch.setattr(runtime_module, "host_available_bytes", lambda: needed)
    load(tmp_path, sessions=3)


def test_ten_million_toy_sessions_do_not_fit_this_host():
    model = build_toy()
    one = Runtime.load("examples/toy/toy.clock", model, device="cpu")
    sessions = 10**7
    available = runtime_module.host_available_bytes()
    if available is None or one.plan.arena.total_bytes(sessions) <= available:
        pytest.skip("this host has room for ten million toy sessions, or does not say")
    with pytest.raises(ClockError, match=r"the arena for 10000000 sessions needs \d+ bytes .* but the host has"):
        Runtime.load("examples/toy/toy.clock", model, device="cpu", sessions=sessions)


# --- initial values ---------------------------------------------------------------------------------


def prototype(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return make()


@pytest.mark.parametrize(
    "value,says",
    [
        (lambda p: torch.empty_like(p, device="meta"), "is on the meta device, which holds no values"),
        (lambda p: p.to_sparse(), "is a tensor of layout torch.sparse_coo (sparse)"),
        (lambda p: prototype(lambda: torch.nested.nested_tensor([p[0], p[1]])), "is a nested tensor"),
        (lambda p: p[:, :, :, :3], "is f32[2, 1, 4, 3, 8] on cpu; expected f32[2, 1, 4, 6, 8]"),
    ],
)
def test_an_initial_value_that_cannot_be_copied_is_refused_before_anything_changes(value, says):
    model = build_toy()
    prompt = make_prompt(model, 6)
    runtime = Runtime.load("examples/toy/toy.clock", model, device="cpu")
    with pytest.raises(StepError) as caught:
        runtime.session(initial={"cache": value(prompt)})
    assert str(caught.value).startswith("initial value for 'cache' ")
    assert says in str(caught.value)
    assert runtime.free_slots == [0]  # no slot taken
    session = runtime.session(initial={"cache": prompt})
    codes = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    first = [session.step(codes=codes[:, t : t + 1]) for t in range(4)]
    cache = session.region("cache").clone()
    with pytest.raises(StepError):
        session.reset(initial={"cache": value(prompt)})
    assert session.instant == 4 and torch.equal(session.region("cache"), cache)
    session.reset()
    assert all(torch.equal(session.step(codes=codes[:, t : t + 1]), first[t]) for t in range(4))


# --- check_finite -------------------------------------------------------------------------------------


def test_check_finite_refuses_nan_and_infinity_and_changes_nothing(tmp_path):
    runtime = load(tmp_path, sessions=2, check_finite=True)
    session = runtime.session()
    session.step(x=frame(1.0))
    hist = session.region("hist").clone()
    for bad, says in ((float("nan"), "1 NaN, 0 infinite"), (float("inf"), "0 NaN, 1 infinite")):
        x = frame(2.0)
        x[0, 1, 0] = bad
        with pytest.raises(StepError) as caught:
            session.step(x=x)
        assert str(caught.value) == (
            f"step() input 'x' has 1 non-finite value(s) ({says}); check_finite refuses them (load without it to "
            "let them propagate, as the stock model does)"
        )
        assert session.instant == 1 and torch.equal(session.region("hist"), hist)
    assert session.step(x=frame(2.0)).flatten().tolist() == [3.0, 3.0]
    unchecked = runtime.session(check_finite=False)  # a session may opt out
    assert torch.isnan(unchecked.step(x=frame(float("nan")))).all()


def test_nan_propagates_by_default_as_in_stock(tmp_path):
    session = load(tmp_path).session()
    assert torch.isnan(session.step(x=frame(float("nan")))).all()
    assert torch.isnan(session.step(x=frame(1.0))).all()  # the history holds the NaN, as stock's would


# --- an update's length, exactly --------------------------------------------------------------------


def failure(session) -> str:
    with pytest.raises(SessionFailed) as caught:
        session.step(x=frame(1.0))
    return str(caught.value.__cause__)


def test_the_history_handed_back_unadvanced_fails_the_session(tmp_path):
    session = load(tmp_path, Model(lambda joined, handed: handed)).session()
    assert failure(session) == (
        "stage 's' returned the 2 units it was handed as the new version of region 'hist'; the .clock says it "
        "held 2 and advances 1 per firing (last 2), so the version has 3 units (held + advance), or 2 (what the "
        "retention keeps of them); check its `start` and `update` declarations"
    )


def test_a_version_longer_than_held_plus_advance_fails_the_session(tmp_path):
    session = load(tmp_path, Model(lambda joined, handed: torch.cat([joined, joined], dim=2))).session()
    assert failure(session).startswith("stage 's' returned 6 units as the new version of region 'hist'; the .clock")


def test_a_version_trimmed_by_the_stage_or_whole_is_kept(tmp_path):
    for version in (lambda joined, handed: joined, lambda joined, handed: joined[..., -2:].clone()):
        session = load(tmp_path, Model(version)).session()
        outputs = [session.step(x=frame(v)).flatten().tolist() for v in (1.0, 2.0, 3.0)]
        assert outputs == [[1.0, 1.0], [3.0, 3.0], [6.0, 6.0]]


BOUND = """
cadence 1 s
clock frame = 10 Hz
region x : f32[1, time] on frame input
region hist : f32[1, time] on frame retain last 3 start empty bind "hist"
region y : f32[1, time] on frame output
stage s on frame {
    module ""
    read x
    update hist +1
    write y +1
}
"""


class InPlace(torch.nn.Module):
    """Leaves `hist` as the tensor it was handed (an in-place update of a window that is still filling)."""

    def __init__(self):
        super().__init__()
        self.hist = None

    def forward(self, x):
        return x + self.hist.sum()


def test_a_bound_window_left_as_handed_while_it_should_grow_fails_the_session(tmp_path):
    path = tmp_path / "bound.clock"
    path.write_text(BOUND)
    session = Runtime.load(path, InPlace(), device="cpu").session()
    with pytest.raises(SessionFailed) as caught:
        session.step(x=torch.ones(1, 1))
    assert re.search(
        r"stage 's' left region 'hist' as the 0 units it was handed \(updated in place, or not at all\); the "
        r"\.clock says it advances 1 per firing and keeps 1 \(last 3\)",
        str(caught.value.__cause__),
    )
