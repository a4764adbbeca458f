"""What a checked program says: the evaluation rules and defaults of docs/language.md, read from the
`Program` records the interpreter consumes."""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path

from duplexcadence.dsl import depgraph
from duplexcadence.dsl.frontend import check_file, load_program
from duplexcadence.dsl.loader import stdlib_root

GOOD = Path(__file__).parent / "good"


def program(text: str):
    result = check_file("s.clock", text=textwrap.dedent(text))
    assert result.program is not None, [f"{d.span}: {d.message}" for d in result.diagnostics]
    return result.program


def test_rates_are_exact_and_derived_clocks_follow() -> None:
    p = load_program(GOOD / "units_and_values.clock")
    assert p.clocks["frame"].rate == Fraction(25, 2)
    assert p.clocks["half"].rate == Fraction(25, 2)
    assert p.clocks["fine"].rate == 10 and p.clocks["slow"].rate == 5
    assert p.cadence == Fraction(2, 25)
    assert p.params["hop"] == 1920 and p.params["ratio"] == Fraction(5, 2)
    assert p.params["history"] == Fraction(12, 25)


def test_durations_are_converted_by_the_region_clock() -> None:
    p = load_program(GOOD / "units_and_values.clock")
    assert p.regions["window"].retention.last == 6  # 0.48 s at 12.5 Hz
    assert p.regions["audio"].retention.last == 3840  # 80 ms + 80 ms at 24 kHz
    assert p.regions["fine_state"].retention.horizon == 100  # 10 s at 10 Hz
    flow = load_program(GOOD / "flow_matching_chunks.clock")
    assert flow.regions["estimator_att"].retention.describe() == "first 150 + last 100"  # 2 s at 50 Hz
    assert flow.stages["flow"].accesses[1].advance == 50  # +1 s at 50 Hz
    assert flow.regions["vocoder_tail"].retention.last == 3840  # 160 ms at 24 kHz


def test_start_policies_give_the_units_held_at_session_start() -> None:
    p = program("""
        cadence 1 s
        clock c = 10 Hz
        region zero : f32[time] on c retain last 6 start zeros
        region kv : f32[time] on c retain ring 8 start zeros
        region pinned : f32[time] on c retain first 3 + last 4 start zeros
        region prompt : f32[time] on c retain last 6 start given 2
        region fresh : f32[time] on c retain last 6
        region position : i64[1]
        region speaker : f32[192] start given
        region io : f32[time] on c input start zeros
        stage s on c {
            hook s
            read io last 5
            update zero +1; update kv +1; update pinned +1; update prompt +1; update fresh +1
            update position; read speaker
        }
    """)
    starts = {name: (r.start, r.start_length) for name, r in p.regions.items()}
    assert starts == {
        "zero": ("zeros", 6),
        "kv": ("zeros", 0),
        "pinned": ("zeros", 7),
        "prompt": ("given", 2),
        "fresh": ("empty", 0),
        "position": ("zeros", 0),
        "speaker": ("given", 0),
        "io": ("zeros", 4),
    }


def test_inputs_without_retain_keep_the_history_their_readers_need_and_outputs_nothing() -> None:
    p = load_program(GOOD / "chunked_context.clock")
    assert p.regions["codes"].retention.describe() == "last 25"  # the context; the 12 or 13 new codes arrive
    assert p.regions["wav"].retention.kind == "scratch"
    assert p.stages["decode"].accesses[1].advance is None  # written without an advance: the module decides
    seanet = load_program(GOOD / "seanet_decoder.clock")
    assert seanet.regions["codes"].retention.kind == "scratch"  # read whole: what arrives is all it needs
    assert seanet.regions["pcm"].retention.kind == "scratch"
    assert seanet.stages["decoder"].accesses[-1].advance == 1920  # +80 ms at 24 kHz
    flow = load_program(GOOD / "flow_matching_chunks.clock")
    assert flow.regions["tokens"].retention.describe() == "last 3"  # declared: 25 more arrive each chunk


def test_a_write_without_an_advance_gets_the_clocks_advance() -> None:
    p = program("""
        cadence 1 s
        clock frame = 12.5 Hz
        clock latent = frame * 2
        region r : f32[time] on latent retain last 4
        stage s on frame { hook s; write r }
    """)
    assert p.stages["s"].accesses[0].advance == 2


def test_families_expand_into_members_with_their_bindings() -> None:
    p = load_program(GOOD / "families_and_fixed.clock")
    assert p.families["kv"] == ("kv[0]", "kv[1]", "kv[2]", "kv[3]")
    assert p.regions["kv[2]"].bind == "model.layers.2.attn.cache" and p.regions["kv[2]"].family == "kv"
    assert p.regions["conv[0]"].shape == (1, 64, None) and p.regions["conv[1]"].shape == (1, 128, None)
    assert p.regions["kv[0]"].stock_shape == (2, 1, 16, 4096, 64)
    assert [a.region for a in p.stages["attend"].accesses][-4:] == ["kv[0]", "kv[1]", "kv[2]", "kv[3]"]
    assert p.regions["position"].fixed and p.regions["position"].clock is None
    assert p.regions["position"].retention.kind == "fixed"


def test_reads_carry_their_windows() -> None:
    p = load_program(GOOD / "flow_matching_chunks.clock")
    read = p.stages["flow"].accesses[0]
    assert (read.window, read.count, read.lookahead, read.alias) == ("last", 28, 3, "tokens")
    chunked = load_program(GOOD / "chunked_context.clock")
    read = chunked.stages["decode"].accesses[0]
    assert (read.window, read.context) == ("new", 25)
    feedback = load_program(GOOD / "feedback_with_prev.clock")
    assert feedback.stages["predictor"].accesses[0].prev


def test_stage_order_follows_dataflow_and_prev_breaks_cycles() -> None:
    p = load_program(GOOD / "feedback_with_prev.clock")
    assert depgraph.stage_order(p) == ["predictor", "depformer"]
    seanet = load_program(GOOD / "seanet_decoder.clock")
    assert depgraph.stage_order(seanet) == ["upsample", "transformer", "decoder"]


def test_the_dependency_graph_links_params_clocks_regions_and_stages() -> None:
    p = load_program(GOOD / "families_and_fixed.clock")
    graph = p.graph
    assert graph.has_edge(("param", "L"), ("region", "kv[0]"))  # L sizes the family
    assert graph.has_edge(("param", "B"), ("region", "kv[0]"))
    assert graph.has_edge(("clock", "step"), ("stage", "embed"))
    assert graph.has_edge(("stage", "embed"), ("region", "logits"))
    assert graph.has_edge(("region", "tokens"), ("stage", "embed"))
    assert not any(node == ("clock", None) for node in graph.nodes)  # fixed regions advance on no clock


def test_declarations_a_file_does_not_import_keep_a_qualified_name() -> None:
    p = load_program(GOOD / "local_imports.clock")
    assert sorted(p.regions) == ["features", "lib.vocoder_block.speech", "mel"]
    assert p.regions["lib.vocoder_block.speech"].role == "output"
    assert p.stages["vocode"].clock == "frame"
    assert p.clocks["sample"].rate == 24000


def test_the_stdlib_tails_load() -> None:
    mimi = load_program(stdlib_root() / "models" / "mimi_decoder.clock")
    assert len(mimi.families["kv"]) == 8 and mimi.regions["kv[7]"].retention.describe() == "ring 250"
    assert mimi.regions["pcm"].retention.kind == "scratch"
    step = load_program(stdlib_root() / "models" / "step_audio2_token2wav.clock")
    assert step.regions["tokens"].start_length == 3
    assert step.stages["hift_back"].accesses[-1].latency == 3840 and step.stages["hift_front"].rng
    qwen = load_program(stdlib_root() / "models" / "qwen3_omni_code2wav.clock")
    assert qwen.regions["codes"].retention.describe() == "last 25"
    write = qwen.stages["decode"].accesses[-1]
    assert (write.region, write.advance, write.loss, write.loss_intended) == ("wav", None, 555, False)


def test_families_of_clocks_and_families_with_several_indices() -> None:
    p = load_program(GOOD / "clock_families.clock")
    assert [p.clocks[f"rate[{k}]"].rate for k in range(3)] == [Fraction(15, 2), Fraction(45, 2), 45]
    mixers = [p.regions[f"mixer[{k}]"] for k in range(4)]  # [level < 2, layer < 2]: the last index fastest
    assert [(m.clock, m.shape[1], m.bind) for m in mixers] == [
        ("rate[1]", 8, "layers.convnext_layer_5.cache"),
        ("rate[1]", 8, "layers.convnext_layer_6.cache"),
        ("rate[2]", 4, "layers.convnext_layer_8.cache"),
        ("rate[2]", 4, "layers.convnext_layer_9.cache"),
    ]
    assert [p.regions[f"upsampler[{k}]"].retention.last for k in range(2)] == [5, 3]
    advances = {a.region: a.advance for a in p.stages["decode"].accesses if a.kind == "update"}
    assert advances == {
        "upsampler[0]": 1,
        "upsampler[1]": 3,
        "mixer[0]": 3,
        "mixer[1]": 3,
        "mixer[2]": 6,
        "mixer[3]": 6,
    }


def test_record_returns_keywords_and_an_object_a_stage_makes() -> None:
    p = load_program(GOOD / "record_returns.clock")
    decode = p.stages["decode"]
    assert decode.arguments == (("use_cache", True), ("padding_mode", "zeros"), ("chunk", 2), ("strict", False))
    assert [(a.region, a.alias, a.field) for a in decode.accesses if a.kind != "read"] == [
        *[
            (name, None, None)
            for name in ("stem", "mixer[0]", "mixer[1]", "mixer[2]", "mixer[3]", "head[0]", "head[1]")
        ],
        ("scale", None, "gain"),
        ("audio", None, "audio"),
    ]
    (cache,) = decode.passes
    assert (cache.object, cache.kind, cache.alias, cache.field) == ("cache", "update", "padding_cache", "padding_cache")
    assert p.objects["cache"].stage == "decode" and p.objects["cache"].factory is None
    assert [p.regions[f"mixer[{k}]"].bind for k in range(4)] == [
        f"layers.convnext_layer_{n}.cache" for n in (1, 2, 4, 6)
    ]
    assert [p.regions[f"head[{k}]"].bind for k in range(2)] == ["layers.head_1.cache", "layers.head_3.cache"]


def test_run_time_counts_beside_record_returns_and_a_family_of_clocks() -> None:
    p = load_program(GOOD / "unit_with_records.clock")
    assert [(p.clocks[c].bound, p.clocks[c].per) for c in ("token", "position")] == [(8, "unit"), (18, "unit")]
    assert [p.clocks[f"rate[{k}]"].rate for k in range(2)] == [10, 20]
    assert [p.regions[f"carry[{k}]"].clock for k in range(2)] == ["rate[0]", "rate[1]"]
    listen, decode = p.stages["listen"], p.stages["decode"]
    assert (listen.rows, listen.arguments, decode.rows, decode.arguments) == (None, (("use_cache", True),), 4, ())
    assert [(a.region, a.advance, a.up_to, a.alias, a.field) for a in listen.accesses if a.kind == "update"] == [
        ("kv", 10, True, "past", "past_key_values"),
        ("logits", None, False, None, "logits"),
    ]
    assert [(a.region, a.advance, a.up_to) for a in decode.accesses if a.kind != "read"] == [
        ("logits", None, False),
        ("kv", 1, False),
        ("text", 1, False),
    ]
    assert p.regions["kv"].retention.describe() == "first 4 + slide 64 to 48"
