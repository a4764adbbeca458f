"""The `triton` attention kernels run on the CPU in Triton's interpreter, against the float64 reference on
caches poisoned with NaN past each row's length (an entry read there would show as NaN in the output), over
random lengths, rows, Q, head groups, head sizes, splits and dtypes.

These tests run in a child pytest of their own (`own_process`, tests/conftest.py), which sets TRITON_INTERPRET=1
before the kernels are defined, so no other test sees it."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

if os.environ.get("DUPLEXCADENCE_TEST_CHILD"):  # the child pytest of own_process
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")

from duplexcadence.interpreter.engine.attention_triton import TritonAttention  # noqa: E402

pytestmark = pytest.mark.own_process

TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@pytest.fixture(scope="module")
def interpreter() -> None:
    """Skips where this Triton's interpreter cannot take a loop bound loaded from memory: Triton 3.6 under
    numpy >= 2.4 (triton-lang/triton#9171, fixed in later releases)."""
    import triton.language as tl

    @triton.jit
    def count(bound, out):
        total = 0
        for _ in range(0, tl.load(bound)):
            total += 1
        tl.store(out, total)

    out = torch.zeros(1, dtype=torch.int32)
    try:
        count[(1,)](torch.tensor([3]), out)
    except Exception as error:  # triton's InterpreterError around numpy's TypeError
        if "0-dimensional" not in str(error):
            raise
        pytest.skip(f"triton {triton.__version__}'s interpreter fails under this numpy: triton-lang/triton#9171")
    assert int(out) == 3


@settings(max_examples=25, deadline=None)
@given(
    past=st.lists(st.integers(0, 150), min_size=1, max_size=4),
    steps=st.sampled_from([1, 1, 2, 5, 9]),
    causal=st.booleans(),
    heads=st.sampled_from([(4, 2), (4, 4), (8, 1), (6, 2)]),
    head_dim=st.sampled_from([16, 32]),
    splits=st.sampled_from([None, 1, 2, 5]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_the_kernel_matches_the_float64_reference(
    interpreter, make_attention_case, attention_reference, past, steps, causal, heads, head_dim, splits, dtype, seed
) -> None:
    reference, relative_error = attention_reference
    case = make_attention_case(
        past, steps, heads=heads[0], kv_heads=heads[1], head_dim=head_dim, capacity=160, dtype=dtype, seed=seed
    )
    scale = 1 / math.sqrt(head_dim)
    out = TritonAttention(splits)(case.q, case.keys, case.values, case.rows, case.lengths, causal=causal, scale=scale)
    assert out.shape == case.q.shape and out.dtype == dtype
    assert not out.isnan().any()
    assert relative_error(out, reference(case, causal=causal, scale=scale)) < TOLERANCE[dtype]
