"""The `triton` attention backend: flash decoding over each row's exact length, read on the device.

The arguments and the result are attention.py's. One program takes one row, one KV head, a block of that
head's queries (its `heads // kv_heads` query heads times the step's Q tokens, so each key and value is
loaded once for the whole group) and one split of the row's keys. It reads the row's slot and length from
the device, so the work of a call follows the lengths while its launch depends on shapes only: a CUDA graph
captured at R rows replays for any lengths. Scores, the running maximum and sums are float32; an entry past a
row's length is never loaded (masked loads), so what lies there, NaN included, changes nothing.

On the CPU the kernels run only in Triton's interpreter (`TRITON_INTERPRET=1`, the tests), which computes no
bfloat16 `tl.dot` (Triton's debugging guide; triton-lang/triton#11584): there the tiles are cast to float32
before each product, which changes no value (a bfloat16 product is exact in float32), only the order of the
float32 sums.

Splits: with few rows, R x kv_heads programs would leave most of the GPU idle, so the keys of each row are
cut into `splits` equal parts (by the row's own length, on the device): each part is reduced to a partial
output with its maximum and sum, and a second kernel combines the parts. `splits` is chosen from the rows,
the heads and the device's multiprocessors (shapes only); one split writes the output directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from duplexcadence.interpreter.engine.attention import check_inputs

BLOCK_N = 64
"""Keys per loop iteration of a program."""
MIN_KEYS_PER_SPLIT = 4 * BLOCK_N
"""A split of a full cache covers at least this many keys: splitting finer costs more than it saves."""
PROGRAMS_PER_SM = 4
"""Splits are chosen for about this many programs per multiprocessor."""


@triton.jit
def _partial_attention(
    q,
    keys,
    values,
    rows,
    lengths,
    out,
    part_out,
    part_max,
    part_sum,
    scale,
    steps,
    sq_r,
    sq_q,
    sq_h,
    sk_s,
    sk_h,
    sk_n,
    sv_s,
    sv_h,
    sv_n,
    so_r,
    so_q,
    so_h,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    FLOAT32_DOT: tl.constexpr,
):
    row_head = tl.program_id(0)
    block_m = tl.program_id(1)
    split = tl.program_id(2)
    row = row_head // KV_HEADS
    kv_head = row_head % KV_HEADS
    slot = tl.load(rows + row).to(tl.int64)
    past = tl.load(lengths + slot)
    total = past + steps

    # query m of the block: token m // GROUP of the step, query head kv_head * GROUP + m % GROUP
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    token = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    valid_m = offs_m < steps * GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q_tile = tl.load(
        q + row * sq_r + token[:, None] * sq_q + head[:, None] * sq_h + offs_d[None, :],
        mask=valid_m[:, None],
        other=0.0,
    )

    # this split's keys: an equal share of the row's blocks; causal: none past the block's last query
    blocks = tl.cdiv(total, BLOCK_N)
    per_split = tl.cdiv(blocks, SPLITS)
    start = split * per_split * BLOCK_N
    end = tl.minimum(total, start + per_split * BLOCK_N)
    if CAUSAL:
        last_token = tl.minimum((block_m * BLOCK_M + BLOCK_M - 1) // GROUP, steps - 1)
        end = tl.minimum(end, past + last_token + 1)
    key_base = keys + slot * sk_s + kv_head * sk_h
    value_base = values + slot * sv_s + kv_head * sv_h

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for block_start in range(start, end, BLOCK_N):
        offs_n = block_start + tl.arange(0, BLOCK_N)
        valid_n = offs_n < end
        k_tile = tl.load(key_base + offs_n[:, None] * sk_n + offs_d[None, :], mask=valid_n[:, None], other=0.0)
        v_tile = tl.load(value_base + offs_n[:, None] * sv_n + offs_d[None, :], mask=valid_n[:, None], other=0.0)
        if FLOAT32_DOT:
            scores = tl.dot(q_tile.to(tl.float32), tl.trans(k_tile.to(tl.float32))) * scale
        else:
            scores = tl.dot(q_tile, tl.trans(k_tile)) * scale
        visible = valid_n[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= past + token[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a query that saw no key yet
        weights = tl.exp(scores - shift[:, None])
        correction = tl.exp(running_max - shift)
        running_sum = running_sum * correction + tl.sum(weights, 1)
        weights = weights.to(v_tile.dtype)  # as flash attention multiplies them with the values
        if FLOAT32_DOT:
            acc = acc * correction[:, None] + tl.dot(weights.to(tl.float32), v_tile.to(tl.float32))
        else:
            acc = acc * correction[:, None] + tl.dot(weights, v_tile)
        running_max = new_max

    if SPLITS == 1:
        result = acc / running_sum[:, None]
        tl.store(
            out + row * so_r + token[:, None] * so_q + head[:, None] * so_h + offs_d[None, :],
            result.to(out.dtype.element_ty),
            mask=valid_m[:, None],
        )
    else:
        queries = steps * GROUP
        part = (row_head * SPLITS + split) * queries + offs_m  # [rows * kv_heads, splits, queries]
        tl.store(part_out + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=valid_m[:, None])
        tl.store(part_max + part, running_max, mask=valid_m)
        tl.store(part_sum + part, running_sum, mask=valid_m)


@triton.jit
def _combine_splits(
    out,
    part_out,
    part_max,
    part_sum,
    steps,
    so_r,
    so_q,
    so_h,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    row_head = tl.program_id(0)
    block_m = tl.program_id(1)
    row = row_head // KV_HEADS
    kv_head = row_head % KV_HEADS
    queries = steps * GROUP
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    valid_m = offs_m < queries
    offs_d = tl.arange(0, HEAD_DIM)
    base = row_head * SPLITS * queries + offs_m

    overall_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    for split in tl.static_range(SPLITS):
        overall_max = tl.maximum(overall_max, tl.load(part_max + base + split * queries, mask=valid_m, other=0.0))
    overall_max = tl.where(overall_max == float("-inf"), 0.0, overall_max)
    total_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for split in tl.static_range(SPLITS):
        part = base + split * queries
        weight = tl.exp(tl.load(part_max + part, mask=valid_m, other=float("-inf")) - overall_max)
        total_sum += weight * tl.load(part_sum + part, mask=valid_m, other=0.0)
        acc += weight[:, None] * tl.load(part_out + part[:, None] * HEAD_DIM + offs_d[None, :], mask=valid_m[:, None])
    token = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    tl.store(
        out + row * so_r + token[:, None] * so_q + head[:, None] * so_h + offs_d[None, :],
        (acc / total_sum[:, None]).to(out.dtype.element_ty),
        mask=valid_m[:, None],
    )


def choose_splits(rows: int, kv_heads: int, query_blocks: int, capacity: int, multiprocessors: int) -> int:
    """Splits of each row's keys so that about `PROGRAMS_PER_SM` programs run per multiprocessor, each split
    of a full cache at least `MIN_KEYS_PER_SPLIT` keys."""
    programs = rows * kv_heads * query_blocks
    wanted = PROGRAMS_PER_SM * multiprocessors // programs
    return max(1, min(wanted, capacity // MIN_KEYS_PER_SPLIT))


class TritonAttention:
    """The `triton` backend (see the module docstring); `splits` fixes the number of splits (tests)."""

    name = "triton"
    capturable = True

    def __init__(self, splits: int | None = None) -> None:
        self.splits = splits

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        rows: torch.Tensor,
        lengths: torch.Tensor,
        *,
        causal: bool,
        scale: float,
    ) -> torch.Tensor:
        check_inputs(q, keys, values, rows, lengths)
        row_count, steps, heads, head_dim = q.shape
        kv_heads, capacity = keys.shape[1], keys.shape[2]
        if head_dim < 16 or head_dim & (head_dim - 1):
            raise ValueError(f"attention backend 'triton': head_dim must be a power of two >= 16, got {head_dim}")
        for name, tensor in (("q", q), ("keys", keys), ("values", values)):
            if tensor.stride(-1) != 1:
                raise ValueError(f"attention backend 'triton': {name} must be contiguous in head_dim")
        group = heads // kv_heads
        queries = steps * group
        block_m = max(16, min(64, triton.next_power_of_2(queries)))
        query_blocks = triton.cdiv(queries, block_m)
        splits = self.splits or choose_splits(row_count, kv_heads, query_blocks, capacity, _multiprocessors(q.device))
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        parts = (row_count * kv_heads * splits * queries,) if splits > 1 else (1,)
        part_out = torch.empty(*parts, head_dim, device=q.device, dtype=torch.float32)
        part_max = torch.empty(parts, device=q.device, dtype=torch.float32)
        part_sum = torch.empty(parts, device=q.device, dtype=torch.float32)
        _partial_attention[(row_count * kv_heads, query_blocks, splits)](
            q,
            keys,
            values,
            rows,
            lengths,
            out,
            part_out,
            part_max,
            part_sum,
            scale,
            steps,
            *q.stride()[:3],
            *keys.stride()[:3],
            *values.stride()[:3],
            *out.stride()[:3],
            KV_HEADS=kv_heads,
            GROUP=group,
            SPLITS=splits,
            CAUSAL=causal,
            BLOCK_M=block_m,
            BLOCK_N=BLOCK_N,
            HEAD_DIM=head_dim,
            FLOAT32_DOT=q.device.type != "cuda",
        )
        if splits > 1:
            _combine_splits[(row_count * kv_heads, query_blocks)](
                out,
                part_out,
                part_max,
                part_sum,
                steps,
                *out.stride()[:3],
                KV_HEADS=kv_heads,
                GROUP=group,
                SPLITS=splits,
                BLOCK_M=block_m,
                HEAD_DIM=head_dim,
            )
        return out


def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter (TRITON_INTERPRET=1) on the CPU
    return torch.cuda.get_device_properties(device).multi_processor_count


TRITON = TritonAttention()
