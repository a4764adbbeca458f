"""SlotKV: steps written at each row's length in shuffled slots, the lengths on the device and host, stable
addresses, clear, the sliding window's drop with re-rotated keys (against the concatenation it replaces),
and the errors a caller can make."""

from __future__ import annotations

import pytest
import torch

from duplexcadence.examples.minicpmo45.live_model import rotate_keys
from duplexcadence.interpreter.engine.kv import SlotKV

SIZES = dict(layers=2, slots=4, kv_heads=2, capacity=12, head_dim=8)


def slot_kv(dtype: torch.dtype = torch.float32, device: str = "cpu") -> SlotKV:
    return SlotKV(**SIZES, dtype=dtype, device=device)


def run_steps(kv: SlotKV, steps: list[tuple[list[int], int]], seed: int = 0) -> dict[int, list[torch.Tensor]]:
    """Writes each (rows, Q) step to every layer and advances (device and host); returns each slot's written
    keys of layer 0 and 1 in order, [kv_heads, n, head_dim] per step (values are keys + 100)."""
    generator = torch.Generator().manual_seed(seed)
    written: dict[int, list[torch.Tensor]] = {}
    for rows, count in steps:
        kv.check_room(rows, count)
        index = torch.tensor(rows, device=kv.device)
        for layer in range(kv.layers):
            k = torch.randn(len(rows), count, kv.kv_heads, kv.head_dim, generator=generator)
            k = k.to(device=kv.device, dtype=kv.dtype)
            kv.write(layer, index, k, k + 100)
            for row, slot in enumerate(rows):
                written.setdefault(slot * 10 + layer, []).append(k[row].transpose(0, 1).cpu())
        kv.advance(index, count)
        kv.host_lengths[rows] += count
    return written


def expected_layer(written: dict[int, list[torch.Tensor]], slot: int, layer: int) -> torch.Tensor:
    return torch.cat(written.get(slot * 10 + layer, [torch.empty(SIZES["kv_heads"], 0, SIZES["head_dim"])]), dim=1)


def check_contents(kv: SlotKV, written: dict[int, list[torch.Tensor]]) -> None:
    assert kv.lengths.tolist() == kv.host_lengths.tolist()
    for slot in range(kv.slots):
        length = int(kv.host_lengths[slot])
        for layer in range(kv.layers):
            expected = expected_layer(written, slot, layer)
            assert torch.equal(kv.keys[layer][slot, :, :length].cpu(), expected)
            assert torch.equal(kv.values[layer][slot, :, :length].cpu(), expected + 100)


STEPS = [([2, 0], 3), ([0, 3, 2], 1), ([3], 4), ([1, 0, 3, 2], 2)]


def test_steps_land_at_each_rows_length_in_shuffled_slots() -> None:
    kv = slot_kv()
    pointers = [t.data_ptr() for t in (*kv.keys, *kv.values, kv.lengths)]
    written = run_steps(kv, STEPS)
    assert kv.host_lengths.tolist() == [6, 2, 6, 7]
    check_contents(kv, written)
    kv.clear(2)
    assert kv.lengths.tolist() == [6, 2, 0, 7] and kv.host_lengths.tolist() == [6, 2, 0, 7]
    written.pop(20), written.pop(21)
    written_after = run_steps(kv, [([2], 2)], seed=1)
    assert kv.host_lengths.tolist() == [6, 2, 2, 7]
    check_contents(kv, written | written_after)
    assert [t.data_ptr() for t in (*kv.keys, *kv.values, kv.lengths)] == pointers
    assert kv.bytes == 2 * 2 * 4 * 2 * 12 * 8 * 4  # layers x (keys, values) x slots x heads x capacity x dim x fp32


def test_drop_moves_the_later_entries_down_with_their_keys_re_rotated() -> None:
    """As the LLM's sliding window drops a unit: the cache of slot 3 after dropping entries 2..4 equals the
    concatenation of what is kept (`live_model.LlmStream.drop_unit`), the moved keys re-rotated."""
    kv = slot_kv()
    written = run_steps(kv, STEPS)
    pointers = [t.data_ptr() for t in (*kv.keys, *kv.values)]
    theta = 10000.0
    before = [(kv.keys[layer][3, :, :7].clone(), kv.values[layer][3, :, :7].clone()) for layer in range(2)]
    kv.drop(3, 2, 3, rotate=lambda keys, old, new: rotate_keys(keys[None], old, new, theta)[0])
    assert kv.host_lengths[3] == 4 and kv.lengths.tolist()[3] == 4
    for layer, (keys, values) in enumerate(before):
        moved = rotate_keys(keys[None, :, 5:7], 5, 2, theta)[0]
        assert torch.equal(kv.keys[layer][3, :, :4], torch.cat([keys[:, :2], moved], dim=1))
        assert torch.equal(kv.values[layer][3, :, :4], torch.cat([values[:, :2], values[:, 5:7]], dim=1))
    kv.drop(0, 4, 2)  # the last two entries, nothing to move
    assert kv.host_lengths.tolist() == [4, 2, 6, 4]
    assert torch.equal(kv.keys[0][0, :, :4], expected_layer(written, 0, 0)[:, :4])
    assert [t.data_ptr() for t in (*kv.keys, *kv.values)] == pointers


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda kv: kv.check_room([1, 3], 6), "slot 3 holds 7 of 12 entries: no room for 6 more (at most 5)"),
        (lambda kv: kv.check_room([4], 1), "slot 4 is not one of this SlotKV's slots 0..3"),
        (
            lambda kv: kv.drop(1, 1, 2),
            "SlotKV.drop: entries 1..2 are not within slot 1's 2 entries (0 <= start, 0 <= count, start + count <= 2)",
        ),
        (lambda kv: kv.clear(-1), "slot -1 is not one of this SlotKV's slots 0..3"),
        (
            lambda kv: kv.write(0, torch.tensor([0, 1]), torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 2, 4)),
            "SlotKV.write: keys must be [rows=2, Q>=1, kv_heads=2, head_dim=8], got [2, 1, 2, 4]",
        ),
        (
            lambda kv: kv.write(0, torch.tensor([0]), torch.zeros(1, 1, 2, 8), torch.zeros(1, 2, 2, 8)),
            "SlotKV.write: values must be [rows=1, Q>=1, kv_heads=2, head_dim=8], got [1, 2, 2, 8]",
        ),
        (
            lambda kv: kv.write(
                0, torch.tensor([0]), torch.zeros(1, 1, 2, 8, dtype=torch.float64), torch.zeros(1, 1, 2, 8)
            ),
            "SlotKV.write: keys must be torch.float32 on cpu, got torch.float64 on cpu",
        ),
        (
            lambda kv: kv.write(2, torch.tensor([0]), torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8)),
            "SlotKV.write: layer 2 is not one of 0..1",
        ),
        (
            lambda kv: kv.advance(torch.tensor([0], dtype=torch.int32), 1),
            "rows must be a 1-d int64 tensor of slot indices on cpu, got torch.int32 [1] on cpu",
        ),
        (
            lambda kv: SlotKV(**(SIZES | {"capacity": 0}), dtype=torch.float32, device="cpu"),
            "SlotKV needs a positive integer capacity, got 0",
        ),
    ],
)
def test_errors_say_what_is_wrong(call, message) -> None:
    kv = slot_kv()
    run_steps(kv, STEPS)
    with pytest.raises(ValueError) as raised:
        call(kv)
    assert str(raised.value) == message


@pytest.mark.gpu
def test_a_captured_step_writes_and_advances_at_the_lengths_of_each_replay(captured) -> None:
    """One graph of write + advance at 2 rows, captured once, replayed while the two slots' lengths differ."""
    kv = slot_kv(torch.bfloat16, "cuda")
    rows = torch.tensor([3, 1], device="cuda")
    k = torch.zeros(2, 2, kv.kv_heads, kv.head_dim, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        for layer in range(kv.layers):
            kv.write(layer, rows, k, k + 100)
        kv.advance(rows, 2)

    graph, _ = captured(step)  # the warm-up wrote zeros at 0..1 of both slots
    kv.host_lengths[[3, 1]] += 2
    kv.drop(1, 0, 1)  # slot 1 now one entry shorter than slot 3
    for replay in (1, 2, 3):
        k.fill_(replay)
        graph.replay()
        kv.host_lengths[[3, 1]] += 2
    torch.cuda.synchronize()
    assert kv.lengths.tolist() == kv.host_lengths.tolist() == [0, 7, 0, 8]
    steps = torch.tensor([1, 1, 2, 2, 3, 3], dtype=torch.bfloat16)
    for slot, zeros in ((3, 2), (1, 1)):
        expected = torch.cat([torch.zeros(zeros), steps])[None, :, None].expand(kv.kv_heads, -1, kv.head_dim)
        for layer in range(kv.layers):
            assert torch.equal(kv.keys[layer][slot, :, : zeros + 6].cpu(), expected)
            assert torch.equal(kv.values[layer][slot, :, : zeros + 6].cpu(), expected + 100)
