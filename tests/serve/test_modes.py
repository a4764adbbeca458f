"""How a pool's rounds move tensors: inputs to the device in one copy per dtype (their order, shapes and values
kept), outputs to the host once, and a lockstep group's outputs copied once with each member given views of
its rows (the values a member gets are its row's)."""

from __future__ import annotations

import torch

from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.interpreter.serve.modes import LockstepMode, to_device, to_host
from duplexcadence.interpreter.serve.tail import LoadedTail

GROUP_CLOCK = """cadence 1 s
param B = 3
clock frame = 12.5 Hz
region x : f32[B, 2, time] on frame input
region y : f32[B, 2, time] on frame output
region acc : f32[B, 2, 1] start zeros
stage s on frame {
    hook step
    read x
    update acc
    write y +1
}
"""


def accumulate(model, x, acc):
    return acc + x, acc + x


def test_inputs_go_to_an_accelerator_in_one_copy_per_dtype_with_their_order_and_shapes():
    inputs = {
        "a": {"codes": torch.zeros(1, 8, 1, dtype=torch.int64), "gain": torch.ones(2)},
        "b": {"codes": torch.ones(1, 8, 3, dtype=torch.int64), "gain": torch.zeros(())},
    }
    placed = to_device(inputs, torch.device("meta"))
    assert list(placed) == ["a", "b"] and all(list(placed[h]) == ["codes", "gain"] for h in placed)
    for handle, named in inputs.items():
        for name, tensor in named.items():
            moved = placed[handle][name]
            assert (moved.device.type, moved.dtype, moved.shape) == ("meta", tensor.dtype, tensor.shape)
    # one flat tensor per dtype: each input is a view of its dtype's storage, at its place in the order
    assert placed["a"]["codes"].untyped_storage().nbytes() == (8 + 24) * 8
    assert (placed["a"]["codes"].storage_offset(), placed["b"]["codes"].storage_offset()) == (0, 8)
    assert placed["b"]["gain"].untyped_storage().nbytes() == 3 * 4 and placed["b"]["gain"].storage_offset() == 2


def test_on_the_cpu_inputs_and_outputs_are_the_tensors_given():
    tensor = torch.arange(6.0).view(2, 3)
    assert to_device({"a": {"x": tensor}}, torch.device("cpu"))["a"]["x"] is tensor
    assert to_host({"a": {"x": tensor}})["a"]["x"] is tensor


def test_a_group_s_outputs_are_copied_once_and_each_member_gets_its_row(tmp_path):
    path = tmp_path / "group.clock"
    path.write_text(GROUP_CLOCK)
    runtime = Runtime.load(path, torch.nn.Module(), device="cpu", hooks={"step": accumulate})
    mode = LockstepMode(LoadedTail(runtime), slots=1, rows=3)
    first, _, third = (mode.join(seed) for seed in range(3))
    values = {first: torch.full((1, 2, 1), 1.5), third: torch.full((1, 2, 1), -4.0)}  # the middle row idles
    for _ in range(2):
        result = mode.step([(member, {"x": value}, False) for member, value in values.items()])
    assert not result.errors and set(result.outputs) == {first, third}
    a, c = result.outputs[first]["y"], result.outputs[third]["y"]
    assert a.shape == c.shape == (1, 2, 1)
    assert torch.equal(a, torch.full((1, 2, 1), 3.0)) and torch.equal(c, torch.full((1, 2, 1), -8.0))
    assert a.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()  # views of one host copy
    assert c.data_ptr() - a.data_ptr() == 2 * 2 * a.element_size()  # row 2 of the group's [3, 2, 1] batch
