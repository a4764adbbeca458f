"""Plan numbers pinned for the stdlib tails, from the released models' shapes (each clock's header names its
upstream files)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from duplexcadence.interpreter.plans.plan import plan_file, to_json

STDLIB = Path(__file__).resolve().parents[2] / "stdlib" / "models"


@pytest.fixture(scope="module")
def mimi():
    return plan_file(STDLIB / "mimi_decoder.clock")


def test_mimi_clocks_hyperperiod_and_warmup(mimi):
    assert mimi.clocks.rates["frame"] == Fraction(25, 2)
    assert mimi.clocks.rates["latent"] == 25
    assert mimi.clocks.cadence == 1
    assert mimi.clocks.hyperperiod == 2  # 12.5 Hz frames in a 1 s cadence repeat every 2 s
    assert mimi.clocks.instants_per_hyperperiod == 25
    assert mimi.clocks.base_tick == Fraction(1, 24000)
    assert mimi.clocks.stage_order == ("upsample", "transformer", "seanet")
    assert {t.per_cadence for t in mimi.clocks.stages.values()} == {Fraction(25, 2)}
    assert mimi.trace.warmup_instants == 125  # 250-step KV window filled 2 latent steps per frame
    assert mimi.trace.period_instants == 25


def test_mimi_kv_regions(mimi):
    kv = [mimi.schedule.regions[f"kv[{i}]"] for i in range(8)]
    assert all(r.shape == (2, 1, 8, 250, 64) and r.dtype == "f32" for r in kv)
    assert all(r.bytes == 2 * 8 * 250 * 64 * 4 for r in kv)
    assert all(r.stock_bytes == r.bytes for r in kv)  # moshi's ring is already demand-sized


def test_mimi_kv_fill_grows_two_per_frame_to_250(mimi):
    program = mimi.program
    advance = next(a.advance for a in program.stages["transformer"].accesses if a.region == "kv[0]")
    fills = [min(advance * (frame + 1), 250) for frame in range(mimi.trace.end_instant)]
    assert fills[:3] == [2, 4, 6] and fills[124] == 250 and fills[123] == 248


def test_mimi_seanet_carries_have_the_anatomy_shapes(mimi):
    shapes = {
        name: mimi.schedule.regions[name].shape
        for name in (
            "upsample_partial",
            "conv_in",
            "up8",
            "res8",
            "up6",
            "res6",
            "up5",
            "res5",
            "up4",
            "res4",
            "conv_out",
        )
    }
    assert shapes == {
        "upsample_partial": (1, 512, 2),
        "conv_in": (1, 512, 6),
        "up8": (1, 512, 8),
        "res8": (1, 512, 2),
        "up6": (1, 256, 6),
        "res6": (1, 256, 2),
        "up5": (1, 128, 5),
        "res5": (1, 128, 2),
        "up4": (1, 64, 4),
        "res4": (1, 64, 2),
        "conv_out": (1, 64, 2),
    }


def test_mimi_one_graph_per_stage_because_rings_keep_shapes_constant(mimi):
    assert [g.stage for g in mimi.capture.graphs] == ["upsample", "transformer", "seanet"]
    assert all(g.steady and g.captured for g in mimi.capture.graphs)
    assert mimi.capture.eager_firings == 0
    assert mimi.trace.shape_warmup_instants == 0


def test_mimi_batch_param_scales_state():
    plan = plan_file(STDLIB / "mimi_decoder.clock", {"B": "8"})
    assert plan.schedule.regions["kv[0]"].shape == (2, 8, 8, 250, 64)
    assert plan.arena.session_bytes >= 8 * 8 * 1024000


def test_qwen_code2wav_chunk_shapes_12_25_then_37_38():
    plan = plan_file(STDLIB / "qwen3_omni_code2wav.clock")
    reads = [next(v for v in f.views if v.kind == "read") for f in plan.trace.firings]
    assert [v.length for v in reads] == [12, 25, 37, 38]
    assert plan.clocks.hyperperiod == 2
    assert plan.trace.warmup_instants == 2 and plan.trace.period_instants == 2
    assert len(plan.capture.graphs) == 4 and sum(g.steady for g in plan.capture.graphs) == 2
    codes = plan.schedule.regions["codes"]
    assert codes.capacity == 38 and codes.kept == 25 and codes.double_buffer_units == 38


def test_plan_json_is_deterministic_and_serialisable(mimi):
    first = json.dumps(to_json(mimi), sort_keys=True)
    second = json.dumps(to_json(plan_file(STDLIB / "mimi_decoder.clock")), sort_keys=True)
    assert first == second
    data = json.loads(first)
    assert data["trace"]["warmup_instants"] == 125
    assert data["clocks"]["hyperperiod_s"] == "2"


def test_graph_budget_keeps_steady_graphs_first():
    plan = plan_file(STDLIB / "qwen3_omni_code2wav.clock", max_graphs=2)
    kept = [g for g in plan.capture.graphs if g.captured]
    assert [g.steady for g in kept] == [True, True]
    assert plan.capture.eager_firings == 2  # the two start-up chunks


def test_qwen_code2wav_arena_is_what_stock_holds_while_it_cats():
    """Stock's `StockSecondDecoder.step` holds the last window (its history is a view of it) and the new
    `torch.cat` window at once: two [1, 16, 38] int64 tensors, 4864 B each, 5120 B as the CUDA caching
    allocator rounds them (to 512 B). The arena holds the code window and the double buffer its trim
    moves the kept codes through: the same two blocks. So the arena adds nothing over stock; a peak above
    stock's comes from elsewhere (graph pools, cuBLAS workspaces)."""
    plan = plan_file(STDLIB / "qwen3_omni_code2wav.clock")
    window = 16 * 38 * 8
    assert plan.schedule.regions["codes"].bytes == plan.schedule.regions["codes"].double_buffer_bytes == window
    assert plan.schedule.regions["wav"].bytes == 0  # the module's output, handed back, not kept
    block = -(-window // 512) * 512
    assert plan.arena.session_bytes == plan.arena.scratch_bytes == block
    assert plan.arena.total_bytes(1) == 2 * block == 10_240


def test_qwen_code2wav_streaming_state_is_state_md():
    """The opt-in streaming clock: every region at the shape examples/qwen3omni/README.md lists, one firing per code."""
    plan = plan_file(STDLIB / "qwen3_omni_code2wav_streaming.clock")
    regions = plan.schedule.regions
    assert plan.clocks.rates["code"] == Fraction(25, 2) and plan.clocks.rates["dec8k"] == 8000
    assert plan.clocks.hyperperiod == 2 and plan.trace.period_instants == 25
    assert plan.trace.warmup_instants == 71  # the KV window fills one code per firing
    assert all(regions[f"{kv}[{i}]"].shape == (1, 16, 71, 64) for kv in ("keys", "values") for i in range(8))
    carries = {name: regions[name].shape for name in regions if name.startswith(("dwconv", "conv_", "res_", "frame_"))}
    assert carries == {
        "dwconv_25hz": (1, 1024, 6),
        "dwconv_50hz": (1, 1024, 6),
        "conv_in": (1, 1024, 6),
        "conv_out": (1, 96, 6),
        **{
            f"res_{rate}[{unit}]": (1, channels, 6 * dilation)
            for rate, channels in (("400hz", 768), ("2khz", 384), ("8khz", 192), ("24khz", 96))
            for unit, dilation in enumerate((1, 3, 9))
        },
        "frame_50hz": (1, 1536, 1),
        "frame_400hz": (1, 768, 1),
        "frame_2khz": (1, 384, 1),
        "frame_8khz": (1, 192, 1),
    }
    state = [r for r in regions.values() if r.persistent and r.name != "position"]
    assert not any(r.double_buffer_bytes for r in state)
    elements = sum(r.bytes for r in state) // 4
    assert elements == 8 * 2 * 16 * 71 * 64 + 131_328 + 2_880 == 1_297_472  # the README's totals
    assert regions["position"].bytes == 8
    # a code's 1920 samples: the 555 held back on the first code are `dropped`, so no last instant adds them
    assert regions["wav"].capacity == 1920 and regions["codes"].capacity == 1
    assert plan.trace.last_instants == ()
    steady = [g for g in plan.capture.graphs if g.steady]
    assert len(plan.capture.graphs) == 72 and len(steady) == 1  # KV fill 0..70, then one shape forever
    wav = [next(v for v in f.views if v.region == "wav") for f in plan.trace.firings[:3]]
    assert [v.length for v in wav] == [1920 - 555, 1920, 1920]


def test_qwen_code2wav_streaming_batch_scales_state():
    plan = plan_file(STDLIB / "qwen3_omni_code2wav_streaming.clock", {"B": "8"})
    assert plan.schedule.regions["keys[0]"].shape == (8, 16, 71, 64)
    assert plan.schedule.regions["res_24khz[2]"].shape == (8, 96, 54)


def test_a_first_firing_latency_is_warm_up_even_when_no_region_grows():
    """`write pcm +4 latency 1` changes nothing but the first firing: the state repeats from instant 0
    in lengths alone, yet instant 10 (one hyperperiod later) must not hold the latency back again."""
    from duplexcadence.dsl.frontend import check_file
    from duplexcadence.interpreter.plans.plan import make_plan

    text = (
        "cadence 1 s\nclock frame = 10 Hz\nclock sample = frame * 4\nregion codes : i64[1, time] on frame input\n"
        "region pcm : f32[1, time] on sample output\nstage emit on frame { hook emit; read codes; write pcm +4 latency 1 }\n"
    )
    plan = make_plan(check_file("latency.clock", text=text).program)
    assert (plan.trace.warmup_instants, plan.trace.period_instants) == (1, 10)
    written = {f.instant: next(v.length for v in f.views if v.kind == "write") for f in plan.trace.firings}
    assert [written[plan.trace.planned_index(i)] for i in range(12)] == [3] + [4] * 11
