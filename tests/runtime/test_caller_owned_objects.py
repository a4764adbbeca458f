"""State that lives in objects the stock call takes and returns (`object`, `bind OBJECT "path"`), on the toy
encoder of `duplexcadence.examples.toy.encoder`: its cache object, a replicate-padded conv history
(`start first-firing`), zero-length caches (`retain last 0`) and a host step counter, every frame
bit-identical to its stock streaming loop; and what loading refuses, with the messages of module paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.examples.toy.encoder import (
    SAMPLES,
    EncoderCache,
    EncoderStockStream,
    build_encoder,
    make_audio,
    new_cache,
)
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = "examples/toy/encoder.clock"
FRAMES = 40  # past the window's fill (3 frames) and two hyperperiods


def frames(audio: torch.Tensor, tick: int) -> dict[str, torch.Tensor]:
    return {"pcm": audio[..., tick * SAMPLES : (tick + 1) * SAMPLES]}


def test_the_encoder_is_bit_identical_to_its_stock_loop_in_every_session_and_after_reset():
    model = build_encoder()
    runtime = Runtime.load(CLOCK, model, hooks={"new_cache": new_cache}, device="cpu", sessions=2)
    audio = [make_audio(FRAMES, seed=seed) for seed in (0, 1)]
    sessions = [runtime.session(), runtime.session()]
    stocks = [EncoderStockStream(build_encoder()) for _ in sessions]
    first_caches = [s.objects["cache"] for s in sessions]
    for tick in range(FRAMES):
        for session, stock, pcm in zip(sessions, stocks, audio):  # interleaved: each has its own cache object
            ours, theirs = session.step(**frames(pcm, tick)), stock.step(**frames(pcm, tick))
            assert torch.equal(ours["latent"], theirs["latent"]) and torch.equal(ours["codes"], theirs["codes"]), tick
    assert all(isinstance(s.objects["cache"], EncoderCache) for s in sessions)
    assert sessions[0].objects["cache"].step == 2 * FRAMES  # what the last call returned
    keys = sessions[0].objects["cache"].keys
    assert keys.data_ptr() == sessions[0].data_ptrs()["keys"] and keys.shape == (1, 2, 6, 4)  # bound between calls
    sessions[0].reset()  # a fresh object from the factory, the replicate padding made again
    assert sessions[0].objects["cache"] is not first_caches[0] and sessions[0].objects["cache"].step == 0
    stock = EncoderStockStream(build_encoder())
    for tick in range(6):
        ours, theirs = sessions[0].step(**frames(audio[1], tick)), stock.step(**frames(audio[1], tick))
        assert torch.equal(ours["latent"], theirs["latent"]), tick


def test_verify_compares_every_output_of_a_stock_step_that_returns_a_dict():
    runtime = Runtime.load(CLOCK, build_encoder(), hooks={"new_cache": new_cache}, device="cpu")
    audio = make_audio(30, seed=3)
    report = runtime.verify(EncoderStockStream(build_encoder()), lambda t: frames(audio, t), ticks=30)
    assert report.equal, str(report)
    assert str(report) == "bit-identical: 60 outputs over 30 ticks are torch.equal to stock eager"


def test_a_zeros_start_where_stock_replicates_is_caught_by_verify(tmp_path):
    text = Path(CLOCK).read_text().replace("retain last 2 start first-firing", "retain last 2 start zeros")
    path = tmp_path / "zeros.clock"
    path.write_text(text)
    runtime = Runtime.load(path, build_encoder(), hooks={"new_cache": new_cache}, device="cpu")
    audio = make_audio(4, seed=5)
    report = runtime.verify(EncoderStockStream(build_encoder()), lambda t: frames(audio, t), ticks=4)
    assert not report.equal  # the first frame pads with zeros, stock with copies of its first sample


OBJECT = """
cadence 1 s
clock frame = 10 Hz
object state{factory}
region x : f32[1, time] on frame input
region hist : f32[1, time] on frame retain last 2 start zeros bind {path}
region y : f32[1, time] on frame output
stage s on frame {{
    hook s
    read x
    update state
    update hist +1
    write y +1
}}
"""


class State:
    def __init__(self):
        self.hist = torch.zeros(1, 2)
        self.calls = 0


def mutate(model, x, state):
    """Takes the state and returns it changed in place: the same object."""
    joined = torch.cat([state.hist, x], dim=1)
    state.hist, state.calls = joined, state.calls + 1
    return state, joined.sum(dim=1, keepdim=True)


def load(tmp_path, factory: str = " from make_state", path: str = 'state "hist"', **options):
    clock = tmp_path / "object.clock"
    clock.write_text(OBJECT.format(factory=factory, path=path))
    hooks = options.pop("hooks", {"s": mutate, "make_state": lambda model: State()})
    return Runtime.load(clock, None, hooks=hooks, device="cpu", **options)


def test_an_object_changed_in_place_or_given_at_load_holds_the_regions_views(tmp_path):
    for runtime in (load(tmp_path), load(tmp_path, factory="", objects={"state": State()})):
        session = runtime.session()
        outputs = [session.step(x=torch.full((1, 1), v)).item() for v in (1.0, 2.0, 3.0)]
        assert outputs == [1.0, 3.0, 6.0]
        assert session.objects["state"].calls == 3
        assert session.objects["state"].hist.data_ptr() == session.data_ptrs()["hist"]


def expect_load_error(tmp_path, **options) -> str:
    with pytest.raises(ClockError) as caught:
        load(tmp_path, **options)
    [diagnostic] = caught.value.diagnostics
    return f"{diagnostic.code.name}: {diagnostic.message}"


def test_what_loading_an_object_refuses(tmp_path):
    assert expect_load_error(tmp_path, hooks={"s": mutate}) == (
        "binding-mismatch: object 'state' is made by 'make_state', which was not registered in hooks="
    )
    assert expect_load_error(tmp_path, factory="") == (
        "binding-mismatch: object 'state' has no factory and none was given"
    )
    assert expect_load_error(tmp_path, objects={"other": State()}) == (
        "binding-mismatch: object 'other' is given in objects= but the .clock declares no such object (`object NAME`)"
    )
    assert expect_load_error(tmp_path, objects={"state": State()}) == (
        "binding-mismatch: object 'state' is given in objects=, but the .clock has 'make_state' make it for each "
        "session"
    )
    assert expect_load_error(tmp_path, path='state "history"') == (
        "binding-mismatch: region 'hist' binds to 'state: history', 'State' has no attribute 'history'"
    )
    assert expect_load_error(tmp_path, hooks={"s": mutate, "make_state": lambda model: {"hist": torch.zeros(1, 2, 3)}})
    assert (
        expect_load_error(tmp_path, hooks={"s": mutate, "make_state": lambda model: {"hist": torch.zeros(1, 2, 3)}})
        == "binding-mismatch: region 'hist' is declared f32[1, time] but 'hist' is f32[1, 2, 3] on cpu"
    )


def test_an_object_path_follows_the_rules_of_model_paths(tmp_path):
    class Holder:
        def __init__(self):
            self.helper = print  # a function on the way

    found = expect_load_error(
        tmp_path, path='state "helper.hist"', hooks={"s": mutate, "make_state": lambda m: Holder()}
    )
    assert found.startswith("unsafe-path: region 'hist' binds to 'state: helper.hist', whose 'helper' is the")
    clock = tmp_path / "private.clock"
    clock.write_text(OBJECT.format(factory=" from make_state", path='state "_hist"'))
    with pytest.raises(ClockError) as caught:
        Runtime.load(clock, None, hooks={"s": mutate}, device="cpu")
    assert caught.value.diagnostics[0].code is messages.UNSAFE_PATH
    assert (
        caught.value.diagnostics[0].message
        == "the binding '_hist' of region 'hist' goes through '_hist', a private attribute"
    )


def test_a_failed_call_is_described_as_made_with_the_object_and_the_first_firings_none(tmp_path):
    clock = tmp_path / "described.clock"
    clock.write_text(
        OBJECT.format(factory=" from make_state", path='state "hist"').replace(
            "    update hist +1\n", "    update hist +1\n    update carry +1\n"
        )
        + "region carry : f32[1, time] on frame retain last 2 start first-firing\n"
    )

    def fails(model, x, state, carry):
        raise RuntimeError("boom")

    runtime = Runtime.load(clock, None, hooks={"s": fails, "make_state": lambda model: State()}, device="cpu")
    with pytest.raises(Exception) as caught:
        runtime.session().step(x=torch.ones(1, 1))
    assert str(caught.value).startswith(
        "stage 's' (hook 's' called as (model, x f32[1, 1], state (object State), carry None (start first-firing)))"
        " raised at instant 0: RuntimeError('boom')"
    )
