"""Run-time faults on the CPU path: what a stage gives back must be what the `.clock` declares, a bad
`step()`/`finish()` call changes nothing, and a stage that raises fails only its own session.

A stage's new version or written units that disagree with the declared shape would otherwise be
broadcast by the copy into the arena (a [1, 1, T] version fills every channel of a [1, 2, T] region)
or leave stale units in an output: both are refused, naming the stage, the region and both shapes.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.runtime import Runtime

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


@pytest.mark.parametrize(
    "attribute,bend,says",
    [
        (
            "hist",
            lambda v: v[:, :1],
            "stage 's' gave f32[1, 1, 3] on cpu as the new version of region 'hist', declared f32[1, 2, time]",
        ),
        ("hist", lambda v: v[0], "stage 's' gave f32[2, 3] on cpu as the new version of region 'hist'"),
        (
            "y",
            lambda v: v[:, :1],
            "stage 's' wrote f32[1, 1, 1] on cpu to region 'y', declared f32[1, 2, time] with 1 unit at this firing",
        ),
        (
            "y",
            lambda v: torch.cat([v, v], dim=2),
            "stage 's' wrote f32[1, 2, 2] on cpu to region 'y', declared f32[1, 2, time] with 1 unit at this firing",
        ),
        ("y", lambda v: v[:, :, :0], "stage 's' wrote f32[1, 2, 0] on cpu to region 'y'"),
    ],
)
def test_a_version_or_a_write_of_another_shape_is_refused_not_broadcast(tmp_path, attribute, bend, says):
    model = Model()
    session = load(tmp_path, model).session()
    session.step(x=torch.ones(1, 2, 1))
    setattr(model, attribute, bend)
    with pytest.raises(SessionFailed) as caught:
        session.step(x=torch.ones(1, 2, 1))
    assert says in str(caught.value)


# --- a bad call changes nothing: the toy tail (on the plan, at finish) --------------------------------

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import attrs  # noqa: E402

from duplexcadence.examples.toy.model import ToyStockStream, build_toy, make_prompt  # noqa: E402
from duplexcadence.interpreter.runtime.errors import StepError  # noqa: E402
from duplexcadence.interpreter.runtime.rng import seeded_rng_state  # noqa: E402

TOY = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
PROMPT, WINDOW = 6, 20
CPU = torch.device("cpu")


class ToyStock:
    """The toy's stock loop with its own RNG state (seeded as a session's), stepped beside a session."""

    def __init__(self, prompt: torch.Tensor, seed: int = 0):
        self.stream = ToyStockStream(build_toy(), prompt, WINDOW)
        self.rng = seeded_rng_state(seed, CPU)

    def step(self, codes: torch.Tensor) -> torch.Tensor:
        saved = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            return self.stream.step(codes=codes)
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(saved)


def toy(sessions: int = 1):
    model = build_toy()
    runtime = Runtime.load(TOY, model, device="cpu", sessions=sessions)
    return runtime, make_prompt(model, PROMPT)


def codes_for(ticks: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 64, (1, ticks), generator=torch.Generator().manual_seed(seed))


def snapshot(session) -> dict:
    """Everything a step may change: every persistent region's whole memory (not just its view), the
    clock position and lengths, the RNG state, the counters and the flags."""
    persistent = [n for n, r in session.runtime.plan.schedule.regions.items() if r.persistent]
    lengths = {name: tuple(session.region(name).shape) for name in persistent}
    return {
        "memory": {name: session.storage[name].flat.clone() for name in persistent},
        "lengths": lengths,
        "instant": session.instant,
        "rng": session.rng_state.clone(),
        "counters": attrs.asdict(session.counters),
        "flags": (session.failed, session.finished, session.on_plan),
        "addresses": session.data_ptrs(),
    }


def assert_same(before: dict, after: dict) -> None:
    for name, memory in before["memory"].items():
        assert torch.equal(memory, after["memory"][name]), f"region '{name}' changed"
    assert {k: v for k, v in before.items() if k not in ("memory", "rng")} == {
        k: v for k, v in after.items() if k not in ("memory", "rng")
    }
    assert torch.equal(before["rng"], after["rng"])


def prototype(make):
    """`make()` with PyTorch's warning that the layout is a prototype (nested) or in beta (sparse CSR) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return make()


BAD_CALLS = [
    (
        (),
        {"codes": torch.zeros(1, 1, dtype=torch.int32)},
        "step() input 'codes': dtype i32[1, 1] on cpu; expected i64[1, 1] on cpu",
    ),
    ((), {"codes": torch.zeros(1, 1, dtype=torch.int64, device="meta")}, "step() input 'codes': on meta"),
    ((), {"codes": [[1]]}, "step() input 'codes': got list, not a tensor"),
    ((), {"codes": torch.zeros(2, 1, dtype=torch.int64)}, "got i64[2, 1] on cpu; expected i64[1, 1]"),
    (
        (),
        {"codes": torch.zeros(1, 100, dtype=torch.int64)},
        "region 'codes' would hold 100 units, over its capacity "
        "of 1 (scratch); input 'codes' has 100 units where the "
        "plan feeds 1: feed at most the planned units an instant",
    ),
    (
        (),
        {"codes": torch.zeros(1, 0, dtype=torch.int64)},
        "step() input 'codes' has no units; this instant takes i64[1, 1] on cpu",
    ),
    (
        (),
        {"codes": torch.zeros(1, 1, dtype=torch.int64).to_sparse()},
        "step() input 'codes': got a tensor of layout torch.sparse_coo (sparse); give a dense (strided) tensor",
    ),
    ((), {"codes": prototype(lambda: torch.zeros(1, 1, dtype=torch.int64).to_sparse_csr())}, "torch.sparse_csr"),
    (
        (),
        {"codes": prototype(lambda: torch.nested.nested_tensor([torch.zeros(1, 1, dtype=torch.int64)]))},
        "step() input 'codes': got a nested tensor; give a dense (strided) tensor",
    ),
    ((), {"tokens": torch.zeros(1, 1, dtype=torch.int64)}, "missing codes; unexpected tokens"),
    ((), {}, "missing codes"),
    ((torch.zeros(1, 1, dtype=torch.int32),), {}, "step() input 'codes': dtype i32[1, 1]"),
    ((torch.zeros(1, 1, dtype=torch.int64),) * 2, {}, "pass inputs by name: this instant takes codes"),
]


@pytest.mark.parametrize("at", ["step", "finish"])
def test_a_bad_call_leaves_the_toy_session_exactly_as_it_was(at):
    """At planned instants (every kind of bad input, with the warm-up under way and in the steady
    state) and at `finish`: StepError, the session bit for bit as before, and its continuation equal
    to stock's."""
    runtime, prompt = toy()
    session = runtime.session(initial={"cache": prompt})
    stock = ToyStock(prompt)
    codes = codes_for(40)
    for tick in range(40):
        if tick in (3, 30):  # in the warm-up and in the steady state
            for args, inputs, says in BAD_CALLS:
                before = snapshot(session)
                with pytest.raises(StepError) as caught:
                    getattr(session, at)(*args, **dict(inputs))
                assert says in str(caught.value)
                assert_same(before, snapshot(session))
        frame = codes[:, tick : tick + 1]
        assert torch.equal(session.step(codes=frame), stock.step(frame)), f"tick {tick}"
    assert session.counters.eager_off_plan == 0  # the refused calls left the session on its plan
    last = codes_for(1, seed=9)
    assert torch.equal(session.finish(last), stock.step(last))  # the toy holds nothing back
    before = snapshot(session)
    for call in (session.step, session.finish):
        with pytest.raises(StepError, match=r"finished its stream at instant 40; call reset\(\)"):
            call(codes=last)
    assert_same(before, snapshot(session))
    session.reset()
    fresh = ToyStock(prompt)
    for tick in range(25):
        frame = codes[:, tick : tick + 1]
        assert torch.equal(session.step(frame), fresh.step(frame)), f"after reset, tick {tick}"


# --- a bad call changes nothing: off the plan (a short input, then the end of the stream) -------------


def _short_and_last():
    spec = importlib.util.spec_from_file_location(
        "short_and_last", Path(__file__).with_name("test_short_and_last_instants.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_bad_call_off_the_plan_and_at_finish_changes_nothing(tmp_path):
    chunked = _short_and_last()
    runtime, _ = chunked.load(tmp_path)
    session = runtime.session(initial=chunked.initial())
    chunks = [[1, 2], [5, 6, 7, 8], [8, 9, 10, 11], [12, 13, 14, 15], [16]]
    expected = chunked.reference(chunks, last_index=4)
    bad = [
        (  # a quarter chunk: coarse +1/2
            {"tokens": torch.tensor([[5]])},
            "covers 1/4 of one (input 'tokens' brings 1 of the 4 units planned), which is not a whole number of units",
        ),
        ({"tokens": torch.tensor([[5.0, 6.0]])}, "dtype f32[1, 2] on cpu"),
        ({"tokens": torch.tensor([[5, 6]], device="meta")}, "on meta"),
        ({"tokens": torch.zeros(1, 36, dtype=torch.int64)}, "input 'tokens' has 36 units where the plan feeds 4"),
        ({"tokens": torch.tensor([[5, 6]]), "x": torch.tensor([[1]])}, "unexpected x"),
    ]
    got = [session.step(**chunked.feed(chunks[0]))]
    # the short first chunk took the session off its plan (6 history frames where the plan has 8)
    assert not session.on_plan
    for index in (1, 2, 3):  # off the plan, then back on it: the next full chunk trims the history to 8
        for inputs, says in bad:
            before = snapshot(session)
            with pytest.raises(StepError, match=re.escape(says)):
                session.step(**inputs)
            assert_same(before, snapshot(session))
        got.append(session.step(**chunked.feed(chunks[index])))
        assert session.on_plan
    at_finish = [(inputs, says) for inputs, says in bad[1:] if "where the plan feeds" not in says]
    at_finish.append(({"tokens": torch.zeros(1, 36, dtype=torch.int64)}, "is not a whole number of units"))
    for inputs, says in at_finish:  # the last instant has no planned feed: a long one is a fraction of a firing
        before = snapshot(session)
        with pytest.raises(StepError, match=re.escape(says)):
            session.finish(**inputs)
        assert_same(before, snapshot(session))
    got.append(session.finish(**chunked.feed(chunks[4])))
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)


def test_one_positional_input_is_accepted_off_the_plan_too(tmp_path):
    """A positional input that is not the planned shape (a short chunk) is named by the off-plan path,
    like a keyword one; a positional input of the wrong dtype says so."""
    chunked = _short_and_last()
    runtime, _ = chunked.load(tmp_path)
    by_name = runtime.session(initial=chunked.initial())
    chunks = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10]]
    expected = [by_name.step(**chunked.feed(chunk)) for chunk in chunks]
    by_name.close()
    positional = runtime.session(initial=chunked.initial())
    with pytest.raises(StepError, match=r"step\(\) input 'tokens': dtype f32\[1, 4\]"):
        positional.step(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    got = [positional.step(torch.tensor([chunk])) for chunk in chunks]
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)


# --- a stage that raises: only its session fails, and reset() brings it back exactly ------------------


def test_a_stage_raising_mid_stream_fails_its_session_only_and_reset_restores_stock_outputs():
    runtime, prompt = toy(sessions=2)
    broken = runtime.session(initial={"cache": prompt}, seed=1)
    healthy = runtime.session(initial={"cache": prompt}, seed=2)
    broken_stock, healthy_stock = ToyStock(prompt, seed=1), ToyStock(prompt, seed=2)
    codes = codes_for(60)
    original = runtime.callables["attend"]

    def explode(*args, **kwargs):
        raise RuntimeError("injected fault")

    for tick in range(60):
        frame = codes[:, tick : tick + 1]
        if tick == 25:  # the steady state; 'encode' has already advanced the carry in this instant
            runtime.callables["attend"] = attrs.evolve(original, fn=explode)
            with pytest.raises(
                SessionFailed,
                match=r"stage 'attend' .* raised at instant 25: "
                r"RuntimeError\('injected fault'\)",
            ):
                broken.step(codes=frame)
            runtime.callables["attend"] = original
            for call in (broken.step, broken.finish):
                with pytest.raises(SessionFailed, match=r"the session failed at instant 25 .*call reset\(\)"):
                    call(codes=frame)
        elif tick < 25:
            assert torch.equal(broken.step(codes=frame), broken_stock.step(frame))
        assert torch.equal(healthy.step(codes=frame), healthy_stock.step(frame)), f"healthy, tick {tick}"
    broken.reset()
    fresh = ToyStock(prompt, seed=1)
    for tick in range(40):  # through the warm-up again, into the steady state
        frame = codes[:, tick : tick + 1]
        assert torch.equal(broken.step(codes=frame), fresh.step(frame)), f"after reset, tick {tick}"


# --- a closed session: its slot may be another session's now ----------------------------------------


def test_a_closed_session_refuses_reset_and_region_and_leaves_its_slots_new_owner_alone():
    runtime, prompt = toy(sessions=1)
    old = runtime.session(initial={"cache": prompt}, seed=1)
    old.close()
    new = runtime.session(initial={"cache": prompt}, seed=1)  # the same slot, the same addresses
    assert new.slot == old.slot and new.data_ptrs() == old.data_ptrs()
    stock = ToyStock(prompt, seed=1)
    codes = codes_for(10)
    for tick in range(10):
        frame = codes[:, tick : tick + 1]
        if tick == 5:
            for call in (old.reset, lambda: old.region("cache")):
                with pytest.raises(RuntimeError, match="this session is closed"):
                    call()
        assert torch.equal(new.step(codes=frame), stock.step(frame)), f"tick {tick}"
