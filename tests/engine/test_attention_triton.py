"""The `triton` attention backend without running it: both kernels compiled for an H100 (sm_90) without one,
so a change that breaks the GPU build fails on the CPU, and the splits it chooses. On a GPU: the released
shapes against the float64 reference on caches poisoned with NaN past each row's length, and a graph captured
at R rows replayed for other lengths. (test_attention_interpreted.py runs the kernels on the CPU.)"""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from duplexcadence.interpreter.engine import attention_triton  # noqa: E402
from duplexcadence.interpreter.engine.attention import get  # noqa: E402
from duplexcadence.interpreter.engine.attention_triton import choose_splits  # noqa: E402


def test_the_kernels_compile_for_an_h100_without_one() -> None:
    """The bfloat16 build of both kernels (the one the engine runs) compiles to PTX for sm_90."""
    from triton.backends.compiler import GPUTarget

    if not isinstance(attention_triton._partial_attention, triton.runtime.JITFunction):  # interpreted
        pytest.skip("TRITON_INTERPRET is set: the kernels are interpreted here")
    strides = dict.fromkeys(
        ["sq_r", "sq_q", "sq_h", "sk_s", "sk_h", "sk_n", "sv_s", "sv_h", "sv_n", "so_r", "so_q", "so_h"], "i32"
    )
    partial = {"q": "*bf16", "keys": "*bf16", "values": "*bf16", "rows": "*i64", "lengths": "*i64", "out": "*bf16"}
    parts = {"part_out": "*fp32", "part_max": "*fp32", "part_sum": "*fp32"}
    shape = dict(KV_HEADS=8, GROUP=4, BLOCK_M=16, HEAD_DIM=128)
    builds = [
        (
            attention_triton._partial_attention,
            partial | parts | {"scale": "fp32", "steps": "i32"} | strides,
            shape | dict(SPLITS=5, CAUSAL=True, BLOCK_N=attention_triton.BLOCK_N, FLOAT32_DOT=False),
        ),
        (
            attention_triton._combine_splits,
            {"out": "*bf16"} | parts | {"steps": "i32", "so_r": "i32", "so_q": "i32", "so_h": "i32"},
            shape | dict(SPLITS=5),
        ),
    ]
    for kernel, signature, constants in builds:
        source = triton.compiler.ASTSource(
            fn=kernel, signature=signature | dict.fromkeys(constants, "constexpr"), constexprs=constants
        )
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert ".target sm_90" in compiled.asm["ptx"]


def test_splits_follow_the_rows_and_the_multiprocessors() -> None:
    """An H100 has 132 multiprocessors: at 16 rows of 8 KV heads, 4 splits; at 1 row, as many as a 4032-entry
    cache allows (15 of at least 256 keys); at 64 rows, none."""
    assert [choose_splits(rows, 8, 1, 4032, 132) for rows in (1, 8, 16, 32, 64)] == [15, 8, 4, 2, 1]
    assert choose_splits(1, 8, 1, 200, 132) == 1
    assert get("triton") is attention_triton.TRITON


# ---------------------------------------------------------------------------------------------- on a GPU

RELEASED_SHAPES = {  # (past lengths, Q, causal, heads, kv_heads, head_dim, capacity)
    "llm decode, 16 rows": ([1500 + 61 * r for r in range(16)], 1, True, 32, 8, 128, 4032),
    "llm decode, 1 row": ([2000], 1, True, 32, 8, 128, 4032),
    "llm prefill chunk": ([0, 700, 3000, 13], 12, True, 32, 8, 128, 4032),
    "tts decode": ([40 * r for r in range(16)], 1, True, 12, 12, 64, 1024),
    "whisper encoder chunk": ([0, 50, 600, 1400], 50, False, 16, 16, 64, 1500),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", RELEASED_SHAPES)
def test_the_kernel_at_the_released_shapes(make_attention_case, attention_reference, name) -> None:
    past, steps, causal, heads, kv_heads, head_dim, capacity = RELEASED_SHAPES[name]
    reference, relative_error = attention_reference
    case = make_attention_case(
        past, steps, heads=heads, kv_heads=kv_heads, head_dim=head_dim, capacity=capacity, device="cuda"
    )
    scale = 1 / math.sqrt(head_dim)
    out = attention_triton.TRITON(case.q, case.keys, case.values, case.rows, case.lengths, causal=causal, scale=scale)
    assert not out.isnan().any()
    assert relative_error(out, reference(case, causal=causal, scale=scale)) < 1e-2


@pytest.mark.gpu
def test_a_graph_captured_at_r_rows_replays_for_any_lengths(make_attention_case, attention_reference, captured) -> None:
    """Captured once over 4 rows at one set of lengths; the lengths, rows and cache change in place; each replay
    equals an eager call on the new inputs (torch.equal) and the float64 reference."""
    reference, relative_error = attention_reference
    shape = dict(heads=32, kv_heads=8, head_dim=128, capacity=4032, device="cuda")
    case = make_attention_case([100, 2000, 5, 3900], 1, **shape, seed=1)
    q, keys, values, rows, lengths = (t.clone() for t in (case.q, case.keys, case.values, case.rows, case.lengths))
    scale = 128**-0.5
    attend = attention_triton.TRITON

    def call():
        return attend(q, keys, values, rows, lengths, causal=True, scale=scale)

    graph, out = captured(call)
    for seed, past in ((2, [3000, 0, 64, 1999]), (3, [1, 1, 4000, 700])):
        fresh = make_attention_case(past, 1, **shape, seed=seed)
        for mine, new in zip(
            (q, keys, values, rows, lengths), (fresh.q, fresh.keys, fresh.values, fresh.rows, fresh.lengths)
        ):
            mine.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call())
        assert relative_error(out, reference(fresh, causal=True, scale=scale)) < 1e-2
