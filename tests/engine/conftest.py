"""Shared by the engine's primitive tests: random attention cases over a poisoned slot cache, and the float64
reference they are compared with."""

from __future__ import annotations

import attrs
import pytest
import torch


@attrs.frozen
class AttentionCase:
    q: torch.Tensor  # [R, Q, heads, head_dim]
    keys: torch.Tensor  # [slots, kv_heads, capacity, head_dim], NaN past each slot's length + Q
    values: torch.Tensor
    rows: torch.Tensor  # int64 [R]
    lengths: torch.Tensor  # int64 [slots]: entries before the step's Q


def attention_case(
    past: list[int],
    steps: int,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    capacity: int = 96,
    spare_slots: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    seed: int = 0,
) -> AttentionCase:
    """Rows with `past[r]` cached entries each and `steps` new ones, in shuffled slots among `spare_slots`
    unused ones; every entry no row may read is NaN."""
    generator = torch.Generator().manual_seed(seed)
    slots = len(past) + spare_slots
    shape = (slots, kv_heads, capacity, head_dim)
    keys = torch.full(shape, float("nan"), dtype=torch.float32)
    values = torch.full(shape, float("nan"), dtype=torch.float32)
    rows = torch.randperm(slots, generator=generator)[: len(past)]
    lengths = torch.randint(0, capacity, (slots,), generator=generator)  # unused slots: any length
    for slot, length in zip(rows.tolist(), past):
        lengths[slot] = length
        total = length + steps
        keys[slot, :, :total] = torch.randn(kv_heads, total, head_dim, generator=generator)
        values[slot, :, :total] = torch.randn(kv_heads, total, head_dim, generator=generator)
    q = torch.randn(len(past), steps, heads, head_dim, generator=generator)
    return AttentionCase(
        *(t.to(device=device, dtype=dtype) for t in (q, keys, values)), rows.to(device), lengths.to(device)
    )


def reference_attention(case: AttentionCase, *, causal: bool, scale: float) -> torch.Tensor:
    """Float64, row by row, heads repeated: softmax(q k^T * scale) v over each row's exact length."""
    q, keys, values = (t.double().cpu() for t in (case.q, case.keys, case.values))
    steps, heads = q.shape[1], q.shape[2]
    group = heads // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for row, slot in enumerate(case.rows.tolist()):
        past = int(case.lengths[slot])
        k = keys[slot, :, : past + steps].repeat_interleave(group, dim=0)  # [heads, total, head_dim]
        v = values[slot, :, : past + steps].repeat_interleave(group, dim=0)
        scores = torch.einsum("qhd,hkd->hqk", q[row], k) * scale
        if causal:
            visible = torch.arange(past + steps) <= torch.arange(past, past + steps)[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
        out[row] = torch.einsum("hqk,hkd->qhd", scores.softmax(-1), v)
    return out


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference|| / ||reference||, in float64."""
    out = out.double().cpu()
    return float((out - reference).norm() / reference.norm())


@pytest.fixture(scope="session")
def make_attention_case():
    return attention_case


@pytest.fixture(scope="session")
def attention_reference():
    return reference_attention, relative_error


def capture_graph(step):
    """(graph, what `step()` returned inside it): `step` run once on a side stream (warm-up), then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


@pytest.fixture(scope="session")
def captured():
    return capture_graph
