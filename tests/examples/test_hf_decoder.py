"""A transformers streaming decoder with no workaround: `transformers`' VibeVoice acoustic decoder at a toy size
(duplexcadence.examples.toy.hf_decoder). Its state is a cache container that its first call makes (None before),
its call returns a `ModelOutput`, its cache keys skip numbers, its layers run on three clocks and its input's time
axis is not the last. `dsl draft` drafts it from the stock loop's None start into a `.clock` that only needed
names (the shipped `hf_decoder.clock`), which binds with no hook and no factory and is `torch.equal` to the stock
loop on every frame (on a GPU, replaying its graph)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

from duplexcadence.dsl.frontend import load_program
from duplexcadence.examples.toy.hf_decoder import (
    DecoderStockStream,
    build_decoder,
    make_latents,
    stock_loop,
)
from duplexcadence.interpreter.draft.draft import draft
from duplexcadence.interpreter.runtime.runtime import Runtime

CLOCK = "examples/toy/hf_decoder.clock"
KEYS = [
    "decoder_stem",
    "convnext_layer_1",
    "convnext_layer_2",
    "convnext_layer_3",
    "decoder_layer_0",
    "convnext_layer_5",
    "convnext_layer_6",
    "decoder_layer_1",
    "convnext_layer_8",
    "convnext_layer_9",
    "decoder_head",
]


def frames(latents: torch.Tensor):
    return lambda t: {"latents": latents[:, t : t + 1]}


def test_the_shipped_clock_binds_with_no_hook_and_no_factory_and_equals_the_stock_loop():
    runtime = Runtime.load(CLOCK, build_decoder(), device="cpu")  # no hooks=, no objects=
    report = runtime.verify(DecoderStockStream(build_decoder()), frames(make_latents(60, seed=3)), ticks=60)
    assert report.equal and report.outputs == 60, str(report)


def test_each_session_gets_the_cache_the_first_call_made_with_its_entries_at_the_arena():
    runtime = Runtime.load(CLOCK, build_decoder(), device="cpu", sessions=2)
    latents = make_latents(12, seed=5)
    session, other = runtime.session(), runtime.session()
    first = [session.step(latents=latents[:, t : t + 1]) for t in range(12)]
    cache = session.objects["padding_cache"]
    assert type(cache).__name__ == "VibeVoiceAcousticTokenizerConv1dPaddingCache"
    assert list(cache.layers) == KEYS
    assert cache.layers["convnext_layer_5"].cache.data_ptr() == session.region("mixer0[0]").data_ptr()
    assert cache.layers["decoder_head"].cache.data_ptr() == session.region("head").data_ptr()
    assert other.objects["padding_cache"] is not cache
    assert other.objects["padding_cache"].layers["decoder_head"].cache.data_ptr() == other.region("head").data_ptr()
    session.reset()
    assert session.objects["padding_cache"] is not cache  # a fresh copy, its entries at the same addresses
    again = [session.step(latents=latents[:, t : t + 1]) for t in range(12)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_the_load_time_call_leaves_the_generator_and_the_grad_mode_as_they_were():
    state = torch.get_rng_state()
    Runtime.load(CLOCK, build_decoder(), device="cpu")
    assert torch.equal(torch.get_rng_state(), state) and torch.is_grad_enabled()


def described(program) -> Counter:
    """Everything a program declares but its names: each region's role, dtype, shape, rate, retention, start
    and binding path; each stage's callable, constant keywords and what its accesses and object passes are."""
    found: Counter = Counter()
    for region in program.regions.values():
        rate = program.clocks[region.clock].rate if region.clock else None
        found[
            (region.role, region.dtype, region.shape, rate, region.retention.describe(), region.start, region.bind)
        ] += 1
    for stage in program.stages.values():
        uses = tuple(
            (used.kind, used.alias, used.field, getattr(used, "window", None), getattr(used, "advance", None))
            for used in stage.in_declared_order()
        )
        found[(stage.callable_kind, stage.target, stage.arguments, program.clocks[stage.clock].rate, uses)] += 1
    found[tuple(sorted((o.factory, o.stage is not None) for o in program.objects.values()))] += 1
    return found


def test_the_draft_from_a_none_start_needs_only_names_and_runs_as_it_is(tmp_path):
    result = draft(stock_loop())
    assert result.check.ok and not result.check.diagnostics, result.text
    assert described(result.check.program) == described(load_program(CLOCK))
    for line in (
        "object padding_cache from stage step",
        "region layers_convnext_layer_cache[layer < 3] : f32[1, 16, time] on frame retain ring 6 start zeros\n"
        '    bind padding_cache "layers.convnext_layer_{layer + 1}.cache"',
        "region latents : f32[1, time, 8] on frame input",
        '    module "decode"  # the stock call\n',
        "    read latents new as latents\n    update padding_cache as padding_cache from padding_cache\n"
        "    with use_cache = true\n",
        "    write audio +6 from audio\n",
    ):
        assert line in result.text, line
    path = tmp_path / "drafted.clock"
    path.write_text(result.text)
    runtime = Runtime.load(path, build_decoder(), device="cpu")
    report = runtime.verify(DecoderStockStream(build_decoder()), frames(make_latents(20, seed=4)), ticks=20)
    assert report.equal, str(report)


@pytest.mark.gpu
def test_gpu_graphs_equal_the_stock_loop_under_its_own_settings():
    runtime = Runtime.load(CLOCK, build_decoder(device="cuda"), device="cuda")
    stock = DecoderStockStream(build_decoder(device="cuda"))
    report = runtime.verify(stock, frames(make_latents(300, seed=3, device="cuda")), ticks=300)  # cuDNN as stock has it
    assert report.equal, str(report)
    assert report.runtime_counters.eager_planned == 0 and report.runtime_counters.eager_off_plan == 0
    assert runtime.report().stage_graphs_covered == 1 and not runtime.report().blocked


def test_the_gpu_script_runs_on_cpu_and_writes_its_result(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "hf_decoder_gpu.py"
    spec = importlib.util.spec_from_file_location("hf_decoder_gpu", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "result.json"
    assert module.main(["--device", "cpu", "--frames", "6", "--warmup", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["equal"] == {"stock settings": True, "deterministic": True}
    assert result["command"] == f"python scripts/hf_decoder_gpu.py --device cpu --frames 6 --warmup 1 --out {out}"
    assert result["graphs"]["planned"] == 1 and result["graphs"]["eager_off_plan"] == 0
    assert result["stock"]["frames"] == result["duplexcadence"]["frames"] == 5
