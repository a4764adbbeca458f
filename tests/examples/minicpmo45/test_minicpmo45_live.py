"""MiniCPM-o 4.5's live duplex loop (examples/minicpmo45/live*.py, scripts/minicpmo45_live_duplex.py) on the CPU.

The pieces each on their own (the conversation script, the released sizes on the meta device, the KV
window's re-rotation and unit drops, the streaming mel), the statistics on hand-made records, and one
reduced-size conversation through the command line: its turn structure, the token buffer (three
silence tokens at a turn start, three lookahead tokens carried, the last chunk at the turn's end), the
audio of both tails ``torch.equal``, and the JSON fields. Timings are never checked.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import duplexcadence  # noqa: E402
from duplexcadence.examples.minicpmo45 import live, live_config, live_model  # noqa: E402
from duplexcadence.examples.minicpmo45.live_config import (  # noqa: E402
    CHUNK_EOS_TOKEN,
    LISTEN_TOKEN,
    SPEAK_TOKEN,
    TURN_EOS_TOKEN,
)

SCRIPT = Path(duplexcadence.__file__).parent / "scripts" / "minicpmo45_live_duplex.py"
SILENCE = 4218


def load_script():
    spec = importlib.util.spec_from_file_location("minicpmo45_live_duplex", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- the script


def test_pattern_reads_listening_units_and_speaking_turns():
    assert live.parse_pattern("L4 S8  L1") == [("listen", 4), ("speak", 8), ("listen", 1)]
    for bad, item in (("L4 X2", "X2"), ("S0", "S0"), ("L", "L"), ("s3", "s3")):
        with pytest.raises(live.ScriptError, match=f"pattern item '{item}' is not L<n>"):
            live.parse_pattern(bad)
    with pytest.raises(live.ScriptError, match="the conversation pattern is empty"):
        live.parse_pattern("  ")


def test_default_script_has_64_units_in_five_turns():
    plans = live.conversation_script(seed=3)
    assert len(plans) == 64 and [p.index for p in plans] == list(range(64))
    speaking = [p for p in plans if p.kind == "speak"]
    assert len(speaking) == 36
    turns: dict[int, list[live.UnitPlan]] = {}
    for plan in speaking:
        turns.setdefault(plan.turn, []).append(plan)
    assert [len(units) for units in turns.values()] == [8, 1, 12, 5, 10]
    for units in turns.values():
        assert [p.turn_start for p in units] == [True] + [False] * (len(units) - 1)
        assert [p.turn_end for p in units] == [False] * (len(units) - 1) + [True]
    assert all(p.turn is None and not p.turn_start and not p.turn_end for p in plans if p.kind == "listen")
    assert all(3 <= len(p.text) <= 7 and all(0 <= t < live_config.TEXT_TOKENS for t in p.text) for p in speaking)
    assert live.conversation_script(seed=3) == plans and live.conversation_script(seed=4) != plans


def test_plan_choices_follow_the_explicit_listen_speak_protocol():
    listen, middle, last = live.conversation_script("L1 S2", seed=0)
    assert listen.choices() == (LISTEN_TOKEN,)
    assert middle.choices() == (SPEAK_TOKEN, *middle.text, CHUNK_EOS_TOKEN)
    assert last.choices() == (SPEAK_TOKEN, *last.text, TURN_EOS_TOKEN, CHUNK_EOS_TOKEN)
    with pytest.raises(live.ScriptError, match=r"1 <= low <= high <= 16, got 5\.\.17"):
        live.conversation_script("S1", text_tokens=(5, 17))
    assert live.text_tokens_range("3-7") == (3, 7) and live.text_tokens_range("5") == (5, 5)
    with pytest.raises(live.ScriptError, match="N or LOW-HIGH, got 'a-b'"):
        live.text_tokens_range("a-b")


# ---------------------------------------------------------------------------------------------- the model pieces


def test_released_sizes_are_built_where_asked_in_bfloat16():
    model = live_model.DuplexModel(live_config.RELEASED, "meta")
    assert model.parameter_counts() == {
        "llm": 8_189_195_264,
        "audio_encoder": 307_216_384,
        "audio_projection": 20_979_712,
        "tts": 347_696_290,
        "total": 8_865_087_650,
    }
    parameters = [p for module in model.modules() for p in module.parameters()]
    assert {p.device.type for p in parameters} == {"meta"} and {p.dtype for p in parameters} == {torch.bfloat16}
    assert model.llm.config.num_hidden_layers == 36 and model.llm.config.num_key_value_heads == 8
    assert model.llm.config.vocab_size == 151748 and model.tts.model.config.num_hidden_layers == 20
    assert [layer.self_attn.layer_idx for layer in model.apm.layers] == list(range(24))


def test_rotate_keys_moves_keys_to_new_rope_positions():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

    config = live_config.llm_config(live_config.REDUCED)
    rotary = Qwen3RotaryEmbedding(config)
    raw = torch.randn(1, 2, 5, config.head_dim, generator=torch.Generator().manual_seed(0))

    def at(start: int) -> torch.Tensor:
        cos, sin = rotary(raw, torch.arange(start, start + 5)[None])
        return apply_rotary_pos_emb(raw, raw, cos, sin)[1]

    theta = live_model.rope_theta(config)
    assert theta == 1_000_000.0
    assert torch.allclose(live_model.rotate_keys(at(40), 40, 12, theta), at(12), atol=1e-5)


def _tiny_stream(window: live_model.WindowSettings) -> live_model.LlmStream:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    llm = Qwen3ForCausalLM._from_config(live_config.llm_config(live_config.REDUCED), dtype=torch.float32)
    return live_model.LlmStream(llm.eval(), live_config.DecodeSettings(), window)


@torch.no_grad()
def test_window_drops_whole_units_from_the_front_and_keeps_the_system_prompt():
    stream = _tiny_stream(live_model.WindowSettings("basic", high=30, low=20))
    stream.feed(stream.embed_many([1, 2, 3, 4, 5]))
    stream.register_system_prompt()
    lengths = [6, 7, 8]
    for unit, length in enumerate(lengths):
        stream.register_unit_start()
        stream.feed(stream.embed_many(range(10 * unit, 10 * unit + length)))
        stream.register_unit_end(is_listen=unit == 0)
        assert stream.enforce_window() is False  # 5 + 6 + 7 + 8 = 26 <= 30
    stream.register_unit_start()
    stream.feed(stream.embed_many(range(100, 109)))
    stream.register_unit_end(is_listen=False)
    keys = [layer.keys.clone() for layer in stream.cache.layers]
    values = [layer.values.clone() for layer in stream.cache.layers]
    # 35 > 30: units leave from the front while above 20: 29, 22, then 14
    assert stream.enforce_window() is True
    assert stream.cache_length() == 5 + 9 and stream.dropped_units == 3 and stream.dropped_tokens == 21
    assert [unit.unit_id for unit in stream.units] == [3]
    theta = stream.rope_theta
    for layer, old_keys, old_values in zip(stream.cache.layers, keys, values):
        assert torch.equal(layer.keys[:, :, :5], old_keys[:, :, :5])  # the system prompt, untouched
        assert torch.equal(layer.values[:, :, :5], old_values[:, :, :5])
        # re-rotated once per dropped unit (26 -> 20 -> 13 -> 5): the composition of three rotations
        moved = live_model.rotate_keys(old_keys[:, :, 26:], 26, 5, theta)
        assert torch.allclose(layer.keys[:, :, 5:], moved, atol=1e-5) and not torch.equal(moved, old_keys[:, :, 26:])
        assert torch.equal(layer.values[:, :, 5:], old_values[:, :, 26:])
    assert stream.enforce_window() is False
    stream.register_unit_start()
    _, hidden = stream.feed(stream.embed(7))  # the next position is the cache length again
    assert hidden.shape == (1, 1, live_config.REDUCED.llm_hidden) and stream.cache_length() == 15


def test_window_settings_refuse_what_cannot_slide():
    with pytest.raises(ValueError, match="'off' or 'basic', got 'context'"):
        live_model.WindowSettings("context")
    with pytest.raises(ValueError, match="0 <= low <= high, got low 50, high 40"):
        live_model.WindowSettings("basic", high=40, low=50)


def test_streaming_mel_emits_each_second_with_its_context_and_slides_at_30_s():
    import numpy as np

    mel = live_model.StreamingMel()
    audio = (0.1 * np.random.default_rng(0).standard_normal(40 * 16000)).astype(np.float32)
    assert mel.next_chunk_samples == 16480  # 1035 ms, whole hops
    first = mel.process(audio[:16480])
    assert first.shape == (1, 80, 102)  # frames 0..100 and 2 of right context
    assert torch.equal(first[0], torch.from_numpy(mel.log_mel(audio[:16480], dynamic=False)[:, :102]))
    position = 16480
    shapes = []
    for _ in range(33):
        chunk = mel.process(audio[position : position + 16000])
        position += 16000
        shapes.append(chunk.shape[-1])
    assert shapes == [104] * 33  # 2 frames either side, before and after the buffer slid
    assert mel.base_frame == 1000 and len(mel.buffer) == position - 160000  # slid once by 10 s
    full = mel.log_mel(mel.buffer, dynamic=True)  # the last second: frames 3300..3400 (global) and 2 either side
    assert torch.equal(chunk[0], torch.from_numpy(full[:, 3298 - 1000 : 3402 - 1000]))


def test_streaming_mel_is_transformers_spectrogram_frame_for_frame():
    """The batched FFT computes what ``transformers.audio_utils.spectrogram``'s per-frame loop does, bit for bit."""
    import numpy as np
    from transformers.audio_utils import spectrogram

    mel = live_model.StreamingMel()
    for seconds in (0.5, 7.0):
        audio = (0.1 * np.random.default_rng(3).standard_normal(int(seconds * 16000))).astype(np.float32)
        log_spec = spectrogram(
            audio,
            mel.window,
            frame_length=live_model.N_FFT,
            hop_length=live_model.HOP,
            power=2.0,
            mel_filters=mel.mel_filters,
            log_mel="log10",
        )[:, :-1]
        for dynamic, floor in ((False, -10.0), (True, log_spec.max() - 8.0)):
            expected = (np.maximum(log_spec, floor) + 4.0) / 4.0
            assert np.array_equal(mel.log_mel(audio, dynamic=dynamic), expected)


# ---------------------------------------------------------------------------------------------- statistics


def _record(conversation: int, index: int, kind: str, listen_ms: float, llm_ms: float, tts_ms: float, tails):
    plan = live.UnitPlan(index, kind, 0 if kind == "speak" else None, False, False)
    record = live.UnitRecord(conversation, plan, listen_ms, llm_ms, 0, tts_ms=tts_ms)
    record.tail_ms = dict(zip(live.SIDES, tails))
    return record


def test_summary_counts_speak_units_rounds_and_overruns():
    records = [
        _record(0, 0, "listen", 100, 50, 0, (0, 0)),
        _record(1, 0, "speak", 100, 300, 400, (300, 60)),
        _record(0, 1, "speak", 100, 300, 400, (250, 50)),
        _record(1, 1, "listen", 90, 40, 0, (0, 0)),
    ]
    summary = live.summarize(live.LiveRun(records, 2, 2, {}, None, None))
    assert summary["speak"]["stock"]["n"] == 2 and summary["speak"]["stock"]["max_ms"] == 1000
    assert summary["speak"]["duplexcadence"]["mean_ms"] == 755
    assert summary["unit"]["stock"]["over_budget"] == 2 and summary["overran"]["stock"] == [[1, 0], [0, 1]]
    assert summary["overran"]["duplexcadence"] == []
    assert [summary["round"][side]["max_ms"] for side in live.SIDES] == [1100 + 150, 860 + 150]
    share = summary["stage_share_of_speaking_units"]["stock"]
    assert share["tail"] == pytest.approx(550 / 2150) and sum(share.values()) == pytest.approx(1.0)
    assert summary["stages"]["tail_stock"]["n"] == 2 and summary["stages"]["listen"]["n"] == 4


# ---------------------------------------------------------------------------------------------- the command line


def test_cli_refuses_a_bad_pattern_before_building(capsys):
    assert load_script().main(["--pattern", "L2 Q1"]) == 2
    assert "pattern item 'Q1' is not L<n>" in capsys.readouterr().err


@pytest.fixture(scope="module")
def conversation(tmp_path_factory):
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo")
    out = tmp_path_factory.mktemp("live") / "live.json"
    script = load_script()
    code = script.main(["--pattern", "L1 S2 L1 S1", "--warmup-pattern", "L1", "--out", str(out)])
    return code, json.loads(out.read_text())


@pytest.mark.models
@pytest.mark.slow
def test_conversation_turns_and_token_buffer(conversation):
    code, payload = conversation
    assert code == 0
    units = payload["units"]
    assert [u["kind"] for u in units] == ["listen", "speak", "speak", "listen", "speak"]
    assert [(u["turn"], u["turn_start"], u["turn_end"]) for u in units if u["kind"] == "speak"] == [
        (0, True, False),
        (0, False, True),
        (1, True, True),
    ]
    for unit in units:
        if unit["kind"] == "listen":
            assert unit["windows"] == [] and unit["equal"] is None and unit["speech"] == []
            continue
        assert len(unit["speech"]) == 25  # 25 + 1 sampled, the last one not returned
        assert unit["text_tokens"] >= 3
    # turn 0: [silence x3 + 25] -> [3 carried + 25] and the 3 carried as the last chunk
    first, second, second_turn = units[1], units[2], units[4]
    assert first["windows"] == [[SILENCE] * 3 + first["speech"]]
    assert second["windows"][0] == first["windows"][0][-3:] + second["speech"]
    assert second["windows"][1] == second["speech"][-3:] and second["last_chunk"] == [False, True]
    assert second_turn["windows"] == [[SILENCE] * 3 + second_turn["speech"], second_turn["speech"][-3:]]
    assert [u["samples"] for u in units if u["kind"] == "speak"] == [[20160], [24000, 6720], [20160, 6720]]
    lengths = [u["llm_cache_length"] for u in units]
    assert lengths == sorted(lengths) and lengths[0] == 43 + 13  # system prompt, then <unit> 10 audio listen </unit>


@pytest.mark.models
@pytest.mark.slow
def test_conversation_audio_equal_and_json(conversation):
    _, payload = conversation
    assert payload["bit_identical"] is True
    assert payload["chunks_compared"] == 5 and payload["units_differing"] == 0
    assert all(u["equal"] for u in payload["units"] if u["kind"] == "speak")
    config = payload["config"]
    assert config["units"] == 5 and config["conversations"] == 1 and config["pattern"] == "L1 S2 L1 S1"
    assert config["sizes"]["name"] == "reduced" and config["n_timesteps"] == 2 and config["tail_dtype"] == "float32"
    assert config["parameters"]["total"] == sum(v for k, v in config["parameters"].items() if k != "total")
    assert config["sliding_window"] == {"mode": "basic", "high": 4000, "low": 3500}
    assert payload["environment"]["device"] == "cpu" and payload["environment"]["cudnn_deterministic"] is True
    assert payload["speak"]["stock"]["n"] == 3 and payload["unit"]["duplexcadence"]["n"] == 5
    assert payload["stages"]["tts_generate"]["n"] == 3 and payload["stages"]["listen"]["n"] == 5
    for side in live.SIDES:
        assert payload["speak"][side]["budget_ms"] == 1000.0 and side in payload["overran"]
        assert set(payload["stage_share_of_speaking_units"][side]) == {"listen", "llm_generate", "tts_generate", "tail"}
    assert "round" not in payload and "memory" not in payload  # one conversation, CPU
    assert payload["runtime"]["replays"] == 0 and payload["runtime"]["eager_planned"] > 0  # CPU: no graphs
    assert payload["llm_window"] == [
        {"conversation": 0, "cache_length": units_end(payload), "dropped_units": 0, "dropped_tokens": 0}
    ]
    assert set(payload["setup_s"]) == {"model_build", "stock_tail", "duplexcadence_tail", "prepare", "warmup"}


def units_end(payload) -> int:
    return payload["units"][-1]["llm_cache_length"]


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_released_conversation_on_gpu(tmp_path, capsys):
    """The released sizes on the GPU: the planned chunks replay graphs, every chunk equal to stock's."""
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo")
    out = tmp_path / "live.json"
    code = load_script().main(["--device", "cuda", "--pattern", "L1 S2 L1 S1", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert code == 0 and payload["bit_identical"] is True and payload["chunks_compared"] == 5
    assert payload["config"]["sizes"]["name"] == "released" and payload["config"]["n_timesteps"] == 10
    assert payload["config"]["parameters"]["llm"] == 8_189_195_264
    assert payload["runtime"]["graphs_captured"] > 0 and payload["runtime"]["replays"] > 0
    memory = payload["memory"]
    assert memory["peak_allocated_bytes"] >= payload["config"]["parameter_bytes"]
    assert memory["resident_bytes"]["duplexcadence_tail"] < memory["resident_bytes"]["stock_tail"]
    assert "bit-identical: all 5 chunks of audio torch.equal" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_scripted_conversation_fires_nothing_eagerly_after_warm_up():
    """Two conversations of the default 64-unit script (five speaking turns each), reduced sizes, the LLM
    and TTS graphed: after the warm-up the DuplexCadence tail replays a captured graph for every chunk, each
    turn's end included (the turn boundaries `load_runtime` declares), and every chunk of audio is
    `torch.equal` to the stock tail's."""
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo")
    from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

    with deterministic_cudnn():
        duplex = live.LiveDuplex(live_config.REDUCED, device="cuda", n_timesteps=2, conversations=2, ar="graphed")
        duplex.warmup()
        run = duplex.run(duplex.scripts(live.DEFAULT_PATTERN))
    speaking = [record for record in run.records if record.speaking]
    # each TTS unit brought a whole chunk (25 tokens): a turn's first chunk is the planned one and its end streams
    # the 3 lookahead tokens, which is what load_runtime declares by default (cadence.turn_boundaries)
    assert all(len(record.speech) == 25 for record in speaking), "declare the other turn boundaries"
    chunks = sum(len(record.samples) for record in speaking)
    assert chunks == 2 * (36 + 5) and run.mismatches() == [] and all(record.equal for record in speaking)
    assert run.runtime_counters == {"replays": 3 * chunks, "eager_planned": 0, "eager_off_plan": 0}
