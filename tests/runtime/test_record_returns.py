"""Calls in the style of `transformers`, with hooks small enough to read: returns taken from a record's fields
(`from FIELD`), keyword constants (`with`), keywords on updates (`as`), objects a stage's call makes at load
(`object NAME from stage STAGE`), factories given the params, lazily created state accepted at load, and the
messages that say what is wrong when a record, a container or a call does not fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.runtime import Runtime

HEADER = """cadence 1 s
clock frame = 12.5 Hz
region x : f32[1, time] on frame input
region y : f32[1, time] on frame output
"""


@dataclasses.dataclass
class Output:
    audio: torch.Tensor
    cache: dict | None = None


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "record.clock"
    path.write_text(HEADER + text)
    return path


RECORD = """object cache from stage s
region carry : f32[1, time] on frame retain last 2 start zeros bind cache "layers.carry"
region total : f32[1, time] on frame retain last 1 start zeros
stage s on frame {
    hook decode
    read x as x
    update cache as state from cache
    update carry +1
    update total +1 as total from running
    with scale = 2
    with mode = "sum"
    with strict = true
    write y +1 from audio
}
"""


def decode(model, x, state, total, scale, mode, strict):
    """Stock code that makes its cache container on its first call, as `transformers` does."""
    assert (scale, mode, strict) == (2, "sum", True)
    if state is None:
        state = {"layers": {"carry": torch.zeros(1, 2)}}
    carry = state["layers"]["carry"]
    y = scale * x + carry.sum(dim=-1, keepdim=True)
    state["layers"]["carry"] = torch.cat([carry, x], dim=-1)[:, -2:]
    return {"audio": y, "cache": state, "running": torch.cat([total, total[:, -1:] + y], dim=-1)}


def stock_run(xs: torch.Tensor) -> list[torch.Tensor]:
    state, total, ys = None, torch.zeros(1, 1), []
    for t in range(xs.shape[-1]):
        out = decode(None, xs[:, t : t + 1], state, total, 2, "sum", True)
        state, total = out["cache"], out["running"][:, -1:]
        ys.append(out["audio"])
    return ys


def test_a_record_s_fields_keywords_and_an_object_the_first_call_made(tmp_path):
    runtime = Runtime.load(write(tmp_path, RECORD), None, hooks={"decode": decode}, device="cpu", sessions=2)
    xs = torch.randn(1, 20, generator=torch.Generator().manual_seed(0))
    session = runtime.session()
    ys = [session.step(x=xs[:, t : t + 1]) for t in range(20)]
    assert all(torch.equal(a, b) for a, b in zip(ys, stock_run(xs), strict=True))
    carry = session.objects["cache"]["layers"]["carry"]
    assert carry.data_ptr() == session.region("carry").data_ptr()
    assert runtime.session().objects["cache"] is not session.objects["cache"]  # a copy per session


def test_a_record_without_the_field_fails_naming_the_field_and_the_fields_it_has(tmp_path):
    def loses_running(model, x, state, total, scale, mode, strict):
        out = decode(model, x, state, total, scale, mode, strict)
        return Output(out["audio"], out["cache"])  # a dataclass with no field `running`

    with pytest.raises(ClockError) as error:  # the load-time call meets it first
        Runtime.load(write(tmp_path, RECORD), None, hooks={"decode": loses_running}, device="cpu")
    assert error.value.diagnostics[0].message.endswith(
        "raised TypeError(\"stage 's' takes 'total' from the field 'running' of what its call returned, a Output, "
        'which has no such field (its fields: audio, cache)")'
    )


def test_a_record_where_a_tuple_is_expected_says_how_to_take_its_fields(tmp_path):
    path = write(
        tmp_path,
        "region z : f32[1, time] on frame output\nstage s on frame { hook h; read x; write y +1; write z +1 }\n",
    )
    runtime = Runtime.load(path, None, hooks={"h": lambda model, x: Output(x, None)}, device="cpu")
    with pytest.raises(SessionFailed) as failed:
        runtime.session().step(x=torch.ones(1, 1))
    assert str(failed.value.__cause__) == (
        "stage 's' must return 2 values as a tuple (its unbound updates, writes and updated objects, in declared "
        "order: y, z), got Output; it returned a record (fields audio, cache): take each return from its field "
        "with `from FIELD` (`write z from audio`)"
    )


def test_a_stage_call_that_fails_at_load_says_how_it_was_called(tmp_path):
    def broken(model, x, state, total, scale, mode, strict):
        raise RuntimeError("no cache")

    with pytest.raises(ClockError) as error:
        Runtime.load(write(tmp_path, RECORD), None, hooks={"decode": broken}, device="cpu")
    (found,) = error.value.diagnostics
    assert found.code.name == "binding-mismatch"
    assert found.message == (
        "object 'cache' could not be made: stage 's' called at load as (x=x zeros f32[1, 1], state=cache (NoneType), "
        "total=total zeros f32[1, 1], scale=2, mode='sum', strict=True) raised RuntimeError('no cache')"
    )


def test_an_empty_container_from_a_factory_names_its_keys_and_the_fix(tmp_path):
    text = RECORD.replace("object cache from stage s", "object cache from new_cache")
    hooks = {"decode": decode, "new_cache": lambda model: {"layers": {}}}
    with pytest.raises(ClockError) as error:
        Runtime.load(write(tmp_path, text), None, hooks=hooks, device="cpu")
    (found,) = error.value.diagnostics
    assert found.message == "region 'carry' binds to 'cache: layers.carry', 'dict' has no key 'carry' (it is empty)"
    assert "`object cache from stage STAGE`" in found.helps[0]


def test_a_factory_that_takes_params_gets_them(tmp_path):
    text = "param W = 3\n" + RECORD.replace("object cache from stage s", "object cache from new_cache")
    seen = []

    def new_cache(model, params):
        seen.append(params)
        return {"layers": {"carry": torch.zeros(1, 2)}}

    Runtime.load(write(tmp_path, text), None, hooks={"decode": decode, "new_cache": new_cache}, device="cpu").session()
    assert seen and all(params == {"W": 3} for params in seen)


def test_lazily_created_state_is_accepted_at_load_whatever_its_retention(tmp_path):
    model = torch.nn.Module()
    model.slots = None  # made by the module on its first call
    model.window = None
    program = HEADER + (
        'region slots : f32[1, time] on frame retain ring 2 start zeros bind "slots"\n'
        'region window : f32[1, time] on frame retain last 2 start zeros bind "window"\n'
        "stage s on frame { hook h; read x; update slots +1; update window +1; write y +1 }\n"
    )
    path = tmp_path / "lazy.clock"
    path.write_text(program)

    def h(model, x):
        model.window = torch.cat([model.window, x], dim=-1)
        return x + model.slots.sum()

    session = Runtime.load(path, model, hooks={"h": h}, device="cpu").session()
    assert torch.equal(session.step(x=torch.ones(1, 1)), torch.ones(1, 1))


def test_a_session_s_copy_of_the_object_shares_what_points_into_the_model(tmp_path):
    model = torch.nn.Linear(1, 1)

    def decode_with_layer(model, x, state, total, scale, mode, strict):
        out = decode(model, x, state, total, scale, mode, strict)
        out["cache"]["layer"] = model  # stock caches may keep a module or a config of the model
        return out

    runtime = Runtime.load(write(tmp_path, RECORD), model, hooks={"decode": decode_with_layer}, device="cpu")
    cache = runtime.session().objects["cache"]
    assert cache["layer"] is model and cache["layers"]["carry"] is not None
