"""The conversation engine's primitives at the released LLM's shape (Qwen3-8B: 36 layers, 32 query and 8 KV
heads of 128, bfloat16), on one GPU, every measurement replayed from a CUDA graph.

Attention, one decode step of all 36 layers at 1, 8, 16 and 32 rows, each row's own length around 2 000 in a
cache of 4 032:

* `masked`: over the whole capacity under a mask, the KV heads repeated to the query heads (what a static
  cache does: transformers' `StaticCache` with sdpa);
* `sdpa_rows`: `scaled_dot_product_attention(..., enable_gqa=True)` row by row over its exact length (the
  lengths are host values baked into the graph: valid for those lengths only);
* `engine`: the engine's default backend (`triton` on CUDA: lengths read on the device, one graph for any
  lengths), with its number of splits;
* `flex`: `flex_attention` (compiled) with a block mask built for the lengths (the block mask is host work
  per step: `flex_block_mask_ms`, eager), where it runs.

FlashInfer is reported as not installed unless it imports. Each variant's last layer is checked against a
float64 reference (relative error, NaN) before it is timed; a variant that fails is not timed.

Then one whole decoder step at 16 rows with random weights built on the device: embedding, 36 layers
(transformers' Qwen3 modules, RoPE at each row's position, `SlotKV.write`, the engine's attention), the norm,
the LM head over 151 748 tokens and the engine's `Sampler` (top-k 20 of 64 candidates, top-p, a 512-token
repetition window), graphed. Checked before it is timed: its logits against transformers' own forward of each
row alone on a `DynamicCache` of the same keys and values (relative error), and its graph replay against the
same step run eagerly (`torch.equal` on logits and tokens). Beside it: transformers' `StaticCache` step at the
same 16 rows, graphed (all rows at position 2 000: it has one position for the batch), and the sampler alone.

    source scripts/device_setup.sh
    python scripts/engine_primitives_bench.py --out engine_primitives.json      # about 3 minutes on an H100
    python scripts/engine_primitives_bench.py --device cpu --out /tmp/engine_primitives.json  # the smoke test

With `--device cpu`: MiniCPM-o 4.5's reduced sizes, 1 and 3 rows, eager (no graphs), the `torch` backend, no
flex_attention: the checks run, the times mean nothing. JSON to --out; a short table printed last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F

from duplexcadence.examples.minicpmo45.live_config import REDUCED, RELEASED, LiveSizes, llm_config
from duplexcadence.interpreter.engine import attention
from duplexcadence.interpreter.engine.kv import SlotKV
from duplexcadence.interpreter.engine.sampling import Sampler, SamplingConfig

DTYPE = torch.bfloat16
TOLERANCE = 1e-2
"""Largest relative error of a variant's attention against the float64 reference."""
STEP_TOLERANCE = 0.1
"""Largest relative error of the decoder step's logits against transformers' own forward: the two differ in
bfloat16 roundings over 36 layers (batched products, another attention kernel); a RoPE position one off
gives 0.44 at the reduced sizes."""


@attrs.frozen
class Setting:
    sizes: LiveSizes
    rows: tuple[int, ...]
    step_rows: int
    capacity: int
    length: int  # rows' lengths are this +- spread
    spread: int
    replays: int
    graphs: bool


SETTINGS = {
    "cuda": Setting(RELEASED, (1, 8, 16, 32), 16, 4032, 2000, 200, 20, True),
    "cpu": Setting(REDUCED, (1, 3), 3, 96, 40, 8, 2, False),
}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def lengths_for(rows: int, setting: Setting) -> list[int]:
    """Deterministic lengths spread over `length +- spread`."""
    width = 2 * setting.spread + 1
    return [setting.length - setting.spread + (37 * row) % width for row in range(rows)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def capture(step: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """(graph, what `step()` returned inside it): warmed up on a side stream, then captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


def time_ms(run: Callable[[], object], replays: int, device: torch.device) -> float:
    """Milliseconds per call of `run` (a graph's replay on CUDA, timed with events; an eager call on the CPU)."""
    for _ in range(2):
        run()
    if device.type != "cuda":
        began = time.perf_counter()
        for _ in range(replays):
            run()
        return round((time.perf_counter() - began) / replays * 1000, 3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        run()
    end.record()
    torch.cuda.synchronize(device)
    return round(start.elapsed_time(end) / replays, 3)


def graphed_ms(step: Callable[[], object], setting: Setting, device: torch.device) -> float:
    if not setting.graphs:
        return time_ms(step, setting.replays, device)
    graph, _ = capture(step)
    return time_ms(graph.replay, setting.replays, device)


# ---------------------------------------------------------------------------------------------- attention


def reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, totals: list[int], scale: float
) -> torch.Tensor:
    """Float64 attention of one query per row over its `totals[r]` keys, heads repeated: [R, 1, H, D]."""
    group = q.shape[2] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for row, total in enumerate(totals):
        k = keys[row, :, :total].double().repeat_interleave(group, dim=0)
        v = values[row, :, :total].double().repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hkd->hk", q[row, 0].double(), k) * scale
        out[row, 0] = torch.einsum("hk,hkd->hd", scores.softmax(-1), v)
    return out


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.double() - expected).norm() / expected.norm())


def attention_variants(
    q: torch.Tensor, kv: SlotKV, rows: torch.Tensor, totals: list[int], scale: float, device: torch.device
) -> dict[str, Callable[[], torch.Tensor]]:
    """Each variant: all layers of one decode step, returning the last layer's output [R, 1, H, D]."""
    count, _, heads, head_dim = q.shape
    group = heads // kv.kv_heads
    capacity = kv.capacity
    mask = torch.full((count, 1, 1, capacity), float("-inf"), dtype=DTYPE, device=device)
    for row, total in enumerate(totals):
        mask[row, ..., :total] = 0
    q_heads_first = q.transpose(1, 2)  # [R, H, 1, D]
    backend = attention.get(attention.default_backend(device))

    def masked() -> torch.Tensor:
        for keys, values in zip(kv.keys, kv.values):
            k = (
                keys[:count, :, None]
                .expand(count, kv.kv_heads, group, capacity, head_dim)
                .reshape(count, heads, capacity, head_dim)
            )
            v = (
                values[:count, :, None]
                .expand(count, kv.kv_heads, group, capacity, head_dim)
                .reshape(count, heads, capacity, head_dim)
            )
            out = F.scaled_dot_product_attention(q_heads_first, k, v, attn_mask=mask, scale=scale)
        return out.transpose(1, 2)

    def sdpa_rows() -> torch.Tensor:
        for keys, values in zip(kv.keys, kv.values):
            outs = [
                F.scaled_dot_product_attention(
                    q_heads_first[row : row + 1],
                    keys[row : row + 1, :, :total],
                    values[row : row + 1, :, :total],
                    scale=scale,
                    enable_gqa=True,
                )
                for row, total in enumerate(totals)
            ]
        return torch.cat(outs).transpose(1, 2)

    def engine() -> torch.Tensor:
        for keys, values in zip(kv.keys, kv.values):
            out = backend(q, keys, values, rows, kv.lengths, causal=True, scale=scale)
        return out

    return {"masked": masked, "sdpa_rows": sdpa_rows, "engine": engine}


def flex_variant(
    q: torch.Tensor, kv: SlotKV, totals: list[int], scale: float, device: torch.device
) -> tuple[Callable[[], torch.Tensor], float]:
    """flex_attention over the rows' lengths (a block mask built once for them), and the block mask's build
    time in ms (eager)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    count = q.shape[0]
    total = torch.tensor(totals, device=device)

    def visible(batch, head, query, key):
        return key < total[batch]

    create_block_mask(visible, count, None, 1, kv.capacity, device=str(device))
    synchronize(device)
    began = time.perf_counter()
    block_mask = create_block_mask(visible, count, None, 1, kv.capacity, device=str(device))
    synchronize(device)
    build_ms = round((time.perf_counter() - began) * 1000, 3)
    compiled = torch.compile(flex_attention, dynamic=False)
    q_heads_first = q.transpose(1, 2)

    def flex() -> torch.Tensor:
        for keys, values in zip(kv.keys, kv.values):
            out = compiled(
                q_heads_first, keys[:count], values[:count], block_mask=block_mask, scale=scale, enable_gqa=True
            )
        return out.transpose(1, 2)

    return flex, build_ms


def attention_section(setting: Setting, device: torch.device, flex: bool, deadline: float) -> dict:
    sizes = setting.sizes
    heads, head_dim = sizes.llm_heads, sizes.llm_head_dim
    scale = head_dim**-0.5
    most = max(setting.rows)
    kv = SlotKV(
        layers=sizes.llm_layers,
        slots=most,
        kv_heads=sizes.llm_kv_heads,
        capacity=setting.capacity,
        head_dim=head_dim,
        dtype=DTYPE,
        device=device,
    )
    generator = torch.Generator(device=device).manual_seed(0)
    totals_all = [length + 1 for length in lengths_for(most, setting)]  # the step's own key included
    for keys, values in zip(kv.keys, kv.values):
        for tensor in (keys, values):
            tensor.normal_(generator=generator)
            for row, total in enumerate(totals_all):
                tensor[row, :, total:] = 0  # as a static cache holds them
    kv.lengths.copy_(torch.tensor([total - 1 for total in totals_all], device=device))
    results: dict[str, dict] = {}
    for count in setting.rows:
        totals = totals_all[:count]
        rows = torch.arange(count, device=device)
        q = torch.randn(count, 1, heads, head_dim, generator=generator, device=device, dtype=DTYPE)
        expected = reference(q, kv.keys[-1], kv.values[-1], totals, scale)
        variants = attention_variants(q, kv, rows, totals, scale, device)
        entry: dict = {"lengths": [min(totals) - 1, max(totals) - 1]}
        if device.type == "cuda":
            from duplexcadence.interpreter.engine.attention_triton import choose_splits

            multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
            entry["engine_splits"] = choose_splits(count, kv.kv_heads, 1, kv.capacity, multiprocessors)
        if flex and device.type == "cuda" and time.perf_counter() < deadline:
            try:
                variants["flex"], entry["flex_block_mask_ms"] = flex_variant(q, kv, totals, scale, device)
            except Exception as error:  # report what stops it, measure the rest
                entry["flex_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        elif flex and device.type == "cuda":
            entry["flex_error"] = "skipped: past the time budget"
        for name, run in variants.items():
            try:
                out = run()
                error = relative_error(out, expected)
                entry[f"{name}_relative_error"] = round(error, 6)
                if out.isnan().any() or not error < TOLERANCE:
                    entry[f"{name}_ms"] = None
                    entry[f"{name}_error"] = (
                        f"failed the check: relative error {error:.3g}, NaN {bool(out.isnan().any())}"
                    )
                    continue
                if name == "engine" and setting.graphs:
                    graph, graphed_out = capture(run)
                    graph.replay()
                    synchronize(device)
                    entry["engine_graph_equals_eager"] = bool(torch.equal(graphed_out, run()))
                entry[f"{name}_ms"] = graphed_ms(run, setting, device)
            except Exception as error:
                entry[f"{name}_ms"] = None
                entry[f"{name}_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        log(f"attention, {count} rows:", entry)
        results[str(count)] = entry
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del kv
    return results


# ---------------------------------------------------------------------------------------------- a decoder step


@contextmanager
def built_on(device: torch.device):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


class DecoderStep:
    """One token of each of R rows through a transformers Qwen3 model's modules, on a SlotKV and the
    engine's attention and sampler (see the module docstring)."""

    def __init__(self, model, kv: SlotKV, sampler: Sampler, rows: torch.Tensor, backend: str) -> None:
        self.model = model
        self.kv = kv
        self.sampler = sampler
        self.rows = rows
        self.attend = attention.get(backend)
        self.ids = torch.zeros(rows.shape[0], dtype=torch.int64, device=rows.device)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

        body, kv, rows = self.model.model, self.kv, self.rows
        count = rows.shape[0]
        x = body.embed_tokens(self.ids)[:, None]  # [R, 1, hidden]
        cos, sin = body.rotary_emb(x, kv.lengths[rows][:, None])  # each row at its own position
        for index, layer in enumerate(body.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_norm(attn.q_proj(h).view(count, 1, -1, attn.head_dim))
            k = attn.k_norm(attn.k_proj(h).view(count, 1, -1, attn.head_dim))
            v = attn.v_proj(h).view(count, 1, -1, attn.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)  # [R, 1, heads, D] layout
            kv.write(index, rows, k, v)
            out = self.attend(q, kv.keys[index], kv.values[index], rows, kv.lengths, causal=True, scale=attn.scaling)
            x = x + attn.o_proj(out.reshape(count, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        kv.advance(rows, 1)
        logits = self.model.lm_head(body.norm(x))[:, 0]
        tokens = self.sampler.sample(rows, logits)
        self.sampler.record(rows, tokens)
        self.ids.copy_(tokens)
        return logits, tokens

    def state(self) -> list[torch.Tensor]:
        return [
            t.clone()
            for t in (self.ids, self.kv.lengths, self.sampler.counters, self.sampler.window, self.sampler.recorded)
        ]

    def restore(self, state: list[torch.Tensor]) -> None:
        for mine, saved in zip(
            (self.ids, self.kv.lengths, self.sampler.counters, self.sampler.window, self.sampler.recorded), state
        ):
            mine.copy_(saved)


def transformers_logits(model, kv: SlotKV, row: int, token: int) -> torch.Tensor:
    """Row `row`'s next logits by transformers' own forward, alone, on a DynamicCache of its SlotKV entries."""
    from transformers import DynamicCache

    length = int(kv.host_lengths[row])
    cache = DynamicCache()
    for index in range(kv.layers):
        cache.update(
            kv.keys[index][row : row + 1, :, :length].clone(),
            kv.values[index][row : row + 1, :, :length].clone(),
            index,
        )
    ids = torch.tensor([[token]], device=kv.device)
    positions = torch.tensor([[length]], device=kv.device)
    return model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True).logits[0, -1]


def static_cache_ms(model, config, setting: Setting, device: torch.device) -> float:
    """transformers' StaticCache step at `step_rows` rows, all at position `length` (as reference/ar-floor)."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_batch_size=setting.step_rows, max_cache_len=4096, device=device, dtype=DTYPE)
    ids = torch.zeros(setting.step_rows, 1, dtype=torch.int64, device=device)
    position = torch.full((1,), setting.length, dtype=torch.int64, device=device)

    def step() -> torch.Tensor:
        return model(input_ids=ids, past_key_values=cache, cache_position=position, use_cache=True).logits

    return graphed_ms(step, setting, device)


def decoder_section(setting: Setting, device: torch.device) -> dict:
    from transformers import Qwen3ForCausalLM

    sizes, count = setting.sizes, setting.step_rows
    config = llm_config(sizes)
    torch.manual_seed(0)
    began = time.perf_counter()
    with built_on(device):
        model = Qwen3ForCausalLM._from_config(config, dtype=DTYPE, attn_implementation="sdpa").eval()
    synchronize(device)
    result: dict = {"rows": count, "build_s": round(time.perf_counter() - began, 1)}
    kv = SlotKV(
        layers=sizes.llm_layers,
        slots=count,
        kv_heads=sizes.llm_kv_heads,
        capacity=setting.capacity,
        head_dim=sizes.llm_head_dim,
        dtype=DTYPE,
        device=device,
    )
    generator = torch.Generator(device=device).manual_seed(1)
    for tensor in (*kv.keys, *kv.values):
        tensor.normal_(generator=generator)
    lengths = lengths_for(count, setting)
    kv.lengths.copy_(torch.tensor(lengths, device=device))
    kv.host_lengths[:] = lengths
    sampler = Sampler(
        SamplingConfig(vocab=sizes.llm_vocab, window=512, penalty="distinct", banned=2, candidates=64), count, device
    )
    for slot in range(count):
        sampler.open(
            slot, seed=slot, temperature=0.7, top_k=20, top_p=0.8, penalty=1.05, banned=[(0, 2**62), (1, 2**62)]
        )
    rows = torch.arange(count, device=device)
    backend = attention.default_backend(device)
    step = DecoderStep(model, kv, sampler, rows, backend)
    step.ids.copy_(torch.arange(100, 100 + count, device=device))
    result["backend"] = backend
    with torch.inference_mode():
        start = step.state()
        first_ids = step.ids.tolist()
        logits, tokens = step()
        errors = [
            relative_error(logits[row].float(), transformers_logits(model, kv, row, first_ids[row]).double())
            for row in range(count)
        ]
        result["relative_error_vs_transformers"] = round(max(errors), 6)
        result["checked"] = max(errors) < STEP_TOLERANCE
        eager_logits, eager_tokens = logits.clone(), tokens.clone()
        if setting.graphs:
            step.restore(start)
            graph, (graphed_logits, graphed_tokens) = capture(step)
            step.restore(start)
            graph.replay()
            synchronize(device)
            result["graph_equals_eager"] = bool(
                torch.equal(graphed_logits, eager_logits) and torch.equal(graphed_tokens, eager_tokens)
            )
            result["graphed_ms"] = time_ms(graph.replay, setting.replays, device) if result["checked"] else None
            del graph
        else:
            result["graphed_ms"] = time_ms(step, setting.replays, device) if result["checked"] else None
        probe = torch.randn(count, sizes.llm_vocab, device=device)

        def sampling() -> torch.Tensor:
            drawn = sampler.sample(rows, probe)
            sampler.record(rows, drawn)
            return drawn

        result["sampling_ms"] = graphed_ms(sampling, setting, device)
        result["static_cache_graphed_ms"] = static_cache_ms(model, config, setting, device)
    log("decoder step:", result)
    return result


# ---------------------------------------------------------------------------------------------- the run


def environment(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "device": str(device)}
    for package in ("triton", "transformers", "flashinfer"):
        spec = importlib.util.find_spec(package)
        info[package] = getattr(__import__(package), "__version__", "?") if spec else None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def table(result: dict) -> str:
    def cell(entry: dict, name: str) -> str:
        value = entry.get(f"{name}_ms")
        return "-" if value is None else f"{value:.2f} ms"

    lines = ["rows | masked over capacity | sdpa exact, by row | engine (splits) | flex_attention (+ block mask)"]
    for count, entry in result["attention"].items():
        engine = cell(entry, "engine") + (f" ({entry['engine_splits']})" if "engine_splits" in entry else "")
        flex = cell(entry, "flex") + (f" (+{entry['flex_block_mask_ms']:.2f})" if "flex_block_mask_ms" in entry else "")
        lines.append(f"{count} | {cell(entry, 'masked')} | {cell(entry, 'sdpa_rows')} | {engine} | {flex}")
    step = result.get("decoder_step")
    if step:
        lines.append(
            f"decoder step, {step['rows']} rows: {step['graphed_ms']} ms ({step['backend']} attention, sampling "
            f"{step['sampling_ms']} ms of it); StaticCache {step['static_cache_graphed_ms']} ms; "
            f"logits vs transformers {step['relative_error_vs_transformers']:.2g}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--no-flex", action="store_true", help="skip flex_attention (its compile takes a while)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="no new flex compile after this many seconds")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    device = torch.device(args.device)
    setting = SETTINGS[args.device]
    result: dict = {
        "command": "python scripts/engine_primitives_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": environment(device),
        "shape": {
            "layers": setting.sizes.llm_layers,
            "heads": setting.sizes.llm_heads,
            "kv_heads": setting.sizes.llm_kv_heads,
            "head_dim": setting.sizes.llm_head_dim,
            "capacity": setting.capacity,
            "lengths": f"{setting.length} +- {setting.spread}",
            "dtype": str(DTYPE),
        },
    }
    if result["environment"]["flashinfer"] is None:
        result["flashinfer"] = "not installed"
    with torch.inference_mode():
        result["attention"] = attention_section(setting, device, not args.no_flex, began + args.budget_s)
    result["decoder_step"] = decoder_section(setting, device)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    args.out.write_text(json.dumps(result, indent=1))
    print(table(result))
    checks = [
        entry.get(f"{name}_ms") is not None
        for entry in result["attention"].values()
        for name in ("masked", "sdpa_rows", "engine")
    ]
    return 0 if all(checks) and result["decoder_step"]["checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
