"""The attention backends' registry, the `torch` backend against the float64 reference on poisoned caches
(entries past each row's length are NaN), and the errors a caller can make."""

from __future__ import annotations

import math

import pytest
import torch

from duplexcadence.interpreter.engine import attention
from duplexcadence.interpreter.engine.attention import TORCH, available, default_backend, get
from duplexcadence.interpreter.engine.kv import SlotKV


def test_backends_by_name() -> None:
    assert available() == ["torch", "triton"]
    assert get("torch") is TORCH
    assert default_backend("cpu") == "torch" and default_backend(torch.device("cuda", 0)) == "triton"
    with pytest.raises(ValueError) as raised:
        get("flash")
    assert str(raised.value) == "no attention backend named 'flash'; the backends are torch, triton"


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
@pytest.mark.parametrize(
    "past, steps, causal, heads, kv_heads",
    [
        ([0, 5, 37, 90], 1, True, 4, 2),  # decode, grouped heads
        ([3, 41, 17], 5, True, 6, 2),  # a prefill chunk after a past: the new keys seen up to each query
        ([0, 30, 64], 7, False, 4, 4),  # an encoder over its past and a new chunk: every key
        ([12], 1, False, 8, 1),  # one KV head for all
    ],
)
def test_torch_backend_matches_the_float64_reference(
    make_attention_case, attention_reference, past, steps, causal, heads, kv_heads, dtype, tolerance
) -> None:
    reference, relative_error = attention_reference
    case = make_attention_case(past, steps, heads=heads, kv_heads=kv_heads, dtype=dtype, seed=len(past) + steps)
    scale = 1 / math.sqrt(case.q.shape[-1])
    out = TORCH(case.q, case.keys, case.values, case.rows, case.lengths, causal=causal, scale=scale)
    assert out.shape == case.q.shape and out.dtype == dtype
    assert not out.isnan().any()
    assert relative_error(out, reference(case, causal=causal, scale=scale)) < tolerance


def test_a_slot_kv_layer_is_what_the_backends_read() -> None:
    """A step written with SlotKV.write at each row's length, then attention over `lengths` before advance."""
    kv = SlotKV(layers=1, slots=3, kv_heads=2, capacity=8, head_dim=16, dtype=torch.float32, device="cpu")
    rows = torch.tensor([2, 0])
    generator = torch.Generator().manual_seed(3)
    for count in (3, 2):
        k, v = torch.randn(2, 2, count, 2, 16, generator=generator)
        kv.write(0, rows, k, v)
        q = torch.randn(2, count, 4, 16, generator=generator)
        out = TORCH(q, kv.keys[0], kv.values[0], rows, kv.lengths, causal=True, scale=0.25)
        kv.advance(rows, count)
    past = torch.tensor([3, 3])  # the second step's queries at positions 3 and 4 of both slots
    keys = kv.keys[0][rows][:, :, :5].repeat_interleave(2, dim=1)
    values = kv.values[0][rows][:, :, :5].repeat_interleave(2, dim=1)
    visible = torch.arange(5) <= (past[:, None] + torch.arange(2))[:, None, :, None]
    scores = (torch.einsum("rqhd,rhkd->rhqk", q, keys) * 0.25).masked_fill(~visible, -math.inf)
    expected = torch.einsum("rhqk,rhkd->rqhd", scores.softmax(-1), values)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=torch.zeros(2, 4, 16)), "attention: q must be [rows, Q>=1, heads, head_dim], got [2, 4, 16]"),
        (
            dict(keys=torch.zeros(4, 2, 95, 8)),
            "attention: keys and values must both be [slots, kv_heads, capacity, head_dim=16], got [4, 2, 95, 8] and [4, 2, 95, 16]",
        ),
        (dict(q=torch.zeros(2, 1, 3, 16)), "attention: 3 query heads are not a multiple of 2 KV heads"),
        (dict(rows=torch.tensor([0])), "attention: rows must be int64 [2], got torch.int64 [1]"),
        (dict(lengths=torch.zeros(4, dtype=torch.int32)), "attention: lengths must be int64 [4], got torch.int32 [4]"),
        (
            dict(q=torch.zeros(2, 1, 4, 16, dtype=torch.float64)),
            "attention: q, keys and values must share a dtype, got torch.float64, torch.float32, torch.float32",
        ),
        (dict(rows=torch.tensor([0, 4])), "attention: row 1 reads slot 4, not one of 0..3"),
        (
            dict(q=torch.zeros(2, 7, 4, 16)),
            "attention: row 1 (slot 2) needs 96 entries (89 + 7 new), over the capacity 95",
        ),
    ],
)
def test_errors_say_what_is_wrong(make_attention_case, change, message) -> None:
    case = make_attention_case([5, 89], 1, dtype=torch.float32, capacity=95)
    arguments = dict(q=case.q, keys=case.keys, values=case.values, rows=case.rows, lengths=case.lengths)
    arguments["rows"] = torch.tensor([1, 2])
    arguments["lengths"] = torch.tensor([0, 5, 89, 0])
    arguments.update(change)
    with pytest.raises(ValueError) as raised:
        attention.TORCH(**arguments, causal=True, scale=1.0)
    assert str(raised.value) == message
