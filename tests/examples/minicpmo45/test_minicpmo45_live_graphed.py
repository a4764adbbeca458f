"""The graphed variant of MiniCPM-o 4.5's live loop (examples/minicpmo45/live_static.py, ``--ar graphed``).

On the CPU the static-cache code runs with direct calls in place of the graphs: its logits against the eager
``DynamicCache`` path (close, not bitwise: attention over the static length with a mask), the window's
compaction on the static buffers, the scripted conversation's token flow and speech tokens, the step functions
under the capture probe (no host reads), and the ``--ar`` flag. On a GPU the captured steps replay to the
logits of the same static-cache code called directly, ``torch.equal``, before and after the window slides.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import duplexcadence  # noqa: E402
from duplexcadence.examples.minicpmo45 import live, live_config, live_model, live_static  # noqa: E402
from duplexcadence.interpreter.runtime.capture.obstacles import HOST_READ, find_obstacles  # noqa: E402

SCRIPT = Path(duplexcadence.__file__).parent / "scripts" / "minicpmo45_live_duplex.py"
LOGIT_ATOL = 0.02
"""Largest |static - eager| of a bfloat16 logit or last hidden state allowed. Measured on the reduced sizes
over 103 feeds and 20 unit drops: 0.0039, one unit in bfloat16's last place for values in [0.5, 1)."""
HIDDEN_ATOL = 0.02
KEY_ATOL = 0.05
"""Cached keys and values, up to about 4 in magnitude: a few units in bfloat16's last place."""


def load_script():
    spec = importlib.util.spec_from_file_location("minicpmo45_live_duplex", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model():
    with torch.no_grad():
        return live_model.DuplexModel(live_config.REDUCED, "cpu")


def _embeds(count: int, seed: int, width: int, device="cpu") -> torch.Tensor:
    noise = torch.randn(count, width, generator=torch.Generator().manual_seed(seed))
    return noise.to(device=device, dtype=torch.bfloat16)


def _feed_units(streams, units: int, width: int, device="cpu"):
    """Feed every stream the same system prompt and ``units`` units of 2 to 6 tokens (single-token feeds and a
    few multi-token ones), the window after each; yields each feed's outputs of every stream."""
    prompt = _embeds(43, 0, width, device)
    yield [stream.feed(prompt) for stream in streams]
    for stream in streams:
        stream.register_system_prompt()
    for unit in range(units):
        for stream in streams:
            stream.register_unit_start()
        feeds = [_embeds(3, 100 + unit, width, device)] if unit % 3 == 0 else []
        feeds += [_embeds(1, 1000 * unit + t, width, device) for t in range(2 + unit % 5)]
        for embeds in feeds:
            yield [stream.feed(embeds) for stream in streams]
        for stream in streams:
            stream.register_unit_end(is_listen=unit % 2 == 0)
        assert len({stream.enforce_window() for stream in streams}) == 1


@torch.no_grad()
def test_static_llm_is_close_to_the_eager_llm_through_window_compactions(model):
    window = live_model.WindowSettings("basic", high=70, low=55)
    settings = live_config.DecodeSettings()
    eager = live_model.LlmStream(model.llm, settings, window)
    static = live_static.StaticLlmStream(model.llm, settings, window, capacity=70 + 9)
    worst_logits = worst_hidden = 0.0
    for (eager_logits, eager_hidden), (static_logits, static_hidden) in _feed_units(
        (eager, static), 24, model.sizes.llm_hidden
    ):
        assert static_logits.shape == eager_logits.shape and static_hidden.shape == eager_hidden.shape
        worst_logits = max(worst_logits, float((static_logits.float() - eager_logits.float()).abs().max()))
        worst_hidden = max(worst_hidden, float((static_hidden.float() - eager_hidden.float()).abs().max()))
        # the same choice: the greedy token agrees
        assert torch.equal(static_logits.argmax(-1), eager_logits.argmax(-1))
        assert worst_logits <= LOGIT_ATOL and worst_hidden <= HIDDEN_ATOL
        assert static.cache_length() == eager.cache_length()
    assert eager.dropped_units > 3 and static.dropped_units == eager.dropped_units
    assert static.dropped_tokens == eager.dropped_tokens
    assert [(u.unit_id, u.length) for u in static.units] == [(u.unit_id, u.length) for u in eager.units]
    assert static.graph.calls > 0 and static.graph.captures == 0 and static.graph.replays == 0  # CPU: direct


@torch.no_grad()
def test_window_compaction_on_the_static_cache_matches_the_eager_window(model):
    """The cache contents after each slide: the system prompt untouched, the kept units moved to the front
    with their keys re-rotated, the freed slots zero."""
    window = live_model.WindowSettings("basic", high=60, low=50)
    settings = live_config.DecodeSettings()
    eager = live_model.LlmStream(model.llm, settings, window)
    static = live_static.StaticLlmStream(model.llm, settings, window, capacity=80)
    prompt = _embeds(43, 0, model.sizes.llm_hidden)
    eager.feed(prompt)
    static.feed(prompt)
    eager.register_system_prompt()
    static.register_system_prompt()
    prompt_keys = [keys[:, :, :43].clone() for keys in static.kv.keys]
    slides = 0
    for unit in range(12):
        for stream in (eager, static):
            stream.register_unit_start()
            for t in range(3 + unit % 4):
                stream.feed(_embeds(1, 50 * unit + t, model.sizes.llm_hidden))
            stream.register_unit_end(is_listen=False)
        slid = eager.enforce_window()
        assert static.enforce_window() is slid
        slides += slid
        length = eager.cache_length()
        assert static.cache_length() == length and static.kv.length == length
        for layer, keys, values, first in zip(eager.cache.layers, static.kv.keys, static.kv.values, prompt_keys):
            assert torch.allclose(keys[:, :, :length].float(), layer.keys.float(), atol=KEY_ATOL, rtol=0)
            assert torch.allclose(values[:, :, :length].float(), layer.values.float(), atol=KEY_ATOL, rtol=0)
            assert not keys[:, :, length:].any() and not values[:, :, length:].any()
            assert torch.equal(keys[:, :, :43], first)
    assert slides >= 3 and static.dropped_units == eager.dropped_units > 0
    # the next feed's position is the cache length again: a greedy step agrees with the eager stream
    logits_e, _ = eager.feed(_embeds(1, 7, model.sizes.llm_hidden))
    logits_s, _ = static.feed(_embeds(1, 7, model.sizes.llm_hidden))
    assert float((logits_s.float() - logits_e.float()).abs().max()) <= LOGIT_ATOL


@torch.inference_mode()
def test_static_speech_backbone_samples_the_eager_speech_tokens(model):
    """Three units of one turn, the cache carried: the same seeded sampling makes the same 25 tokens."""
    tts = model.tts
    settings = live_config.DecodeSettings()
    temperature = torch.tensor([settings.tts_temperature])
    backbone = live_static.StaticSpeechBackbone(tts, capacity=model.sizes.tts_max_positions)
    generator = torch.Generator().manual_seed(3)
    past, start = None, 0
    for unit in range(3):
        hidden = [torch.randn(1, 1, model.sizes.llm_hidden, generator=generator).bfloat16() for _ in range(4)]
        condition = live_model.tts_condition(tts, [11 * unit + t for t in range(4)], hidden)
        torch.manual_seed(unit)
        eager_tokens, past = live_model.generate_speech_tokens(
            tts, condition, past, start, 26, 26, temperature, settings
        )
        torch.manual_seed(unit)
        static_tokens, _ = live_model.generate_speech_tokens(
            tts, condition, None, start, 26, 26, temperature, settings, backbone
        )
        assert static_tokens.shape == (1, 25, 1) and torch.equal(static_tokens, eager_tokens)
        start += condition.shape[1] + 25
        assert backbone.kv.length == past.get_seq_length() == start
    # the logits of one more step, both ways
    token = tts.emb_code[0](eager_tokens[:, -1:, 0])
    position = torch.tensor([start])
    out = tts.model(position_ids=position[None], past_key_values=past, inputs_embeds=token, use_cache=True)
    eager_logits = tts.head_code[0](out.last_hidden_state)[:, -1].float()
    static_logits = backbone.forward(token, position)
    assert float((static_logits - eager_logits).abs().max()) <= LOGIT_ATOL
    backbone.clear()
    assert backbone.kv.length == 0 and not any(k.any() for k in backbone.kv.keys)


class _HostData(TorchDispatchMode):
    """Counts tensors made from Python data (``torch.tensor``: a host-to-device copy on CUDA), which the
    probe does not count on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) == "aten.lift_fresh.default":
            self.made += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def test_captured_steps_read_nothing_back_to_the_host(model):
    """The capture probe over the two step functions a graph holds: no host read, no data-sized operation."""
    settings = live_config.DecodeSettings()
    stream = live_static.StaticLlmStream(model.llm, settings, live_model.WindowSettings(), capacity=64)
    stream.feed(_embeds(5, 0, model.sizes.llm_hidden))
    stream.kv.step_index.fill_(stream.kv.length)
    with torch.inference_mode():
        backbone = live_static.StaticSpeechBackbone(model.tts, capacity=64)
        backbone.forward(torch.zeros(1, 4, model.sizes.tts_hidden, dtype=torch.bfloat16), torch.arange(4))
        backbone.kv.step_index.fill_(backbone.kv.length)
    for step, mode in ((stream.graph.step, torch.no_grad), (backbone.graph.step, torch.inference_mode)):
        with mode():  # as each runs in the loop
            assert find_obstacles(step, "cpu") == []
            made = _HostData()
            with made:
                step()
        assert made.made == 0
    # the probe does see what stays eager: the sampling reads the device
    logits, _ = stream.feed(_embeds(1, 1, model.sizes.llm_hidden))
    [read, *_] = find_obstacles(lambda: stream.decode(logits, live_config.LISTEN_TOKEN), "cpu")
    assert read.kind == HOST_READ and read.count >= 3


@torch.no_grad()
def test_scripted_conversation_has_the_same_token_flow_in_both_variants(model):
    """The LLM and TTS stages of ``L1 S2 L1 S1`` (no tails) in both variants on the same weights and seeds:
    the same text tokens, cache lengths and speech tokens; the LISTEN logits close."""
    plans = live.conversation_script("L1 S2 L1 S1", seed=0)
    audio = live.user_audio(len(plans), seed=100)
    flows = {}
    for ar in live.AR_VARIANTS:
        conversation = live.Conversation(
            0, model, {}, live_config.DecodeSettings(), live_model.WindowSettings(), seed=0, ar=ar
        )
        torch.manual_seed(0)
        conversation.prepare()
        flow = []
        for plan, waveform in zip(plans, audio):
            conversation.listen(waveform)
            pending = conversation.pending_logits.clone()
            text = conversation.generate_text(plan)
            speech = conversation.generate_speech(text).tokens if not text.is_listen else ()
            flow.append((text.tokens, text.end_of_turn, conversation.llm.cache_length(), speech, pending))
        flows[ar] = flow
    assert isinstance(conversation.llm, live_static.StaticLlmStream) and conversation.speech_backbone is not None
    for eager, graphed in zip(flows["eager"], flows["graphed"]):
        assert eager[:4] == graphed[:4]
        assert float((eager[4].float() - graphed[4].float()).abs().max()) <= LOGIT_ATOL
    assert [len(f[3]) for f in flows["graphed"]] == [0, 25, 25, 0, 25]


def test_live_duplex_refuses_an_unknown_variant(model):
    with pytest.raises(ValueError, match="run 'eager' or 'graphed', got 'jit'"):
        live.Conversation(0, model, {}, live_config.DecodeSettings(), live_model.WindowSettings(), 0, ar="jit")


@torch.no_grad()
def test_static_cache_refuses_a_feed_past_its_capacity(model):
    stream = live_static.StaticLlmStream(
        model.llm, live_config.DecodeSettings(), live_model.WindowSettings(), capacity=8
    )
    stream.feed(_embeds(6, 0, model.sizes.llm_hidden))
    with pytest.raises(live_static.CacheFull, match="holds 8 tokens: 6 cached \\+ 3 new do not fit"):
        stream.feed(_embeds(3, 1, model.sizes.llm_hidden))
    assert live.llm_cache_capacity(live_model.WindowSettings(), live_config.DecodeSettings()) == 4000 + 32


# ---------------------------------------------------------------------------------------------- the command line


def test_cli_refuses_an_unknown_ar_variant(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_script().main(["--ar", "jit"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --ar: invalid choice: 'jit'" in error and "eager" in error and "graphed" in error


@pytest.mark.models
@pytest.mark.slow
def test_graphed_conversation_through_the_command_line(tmp_path, capsys):
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo")
    out = tmp_path / "live_graphed.json"
    code = load_script().main(
        ["--ar", "graphed", "--pattern", "L1 S2 L1 S1", "--warmup-pattern", "L1", "--out", str(out)]
    )
    payload = json.loads(out.read_text())
    assert code == 0 and payload["bit_identical"] is True and payload["chunks_compared"] == 5
    assert payload["autoregressive"] == "graphed" and "graphed" in payload["title"]
    assert [u["kind"] for u in payload["units"]] == ["listen", "speak", "speak", "listen", "speak"]
    assert all(len(u["speech"]) == 25 for u in payload["units"] if u["kind"] == "speak")
    graphs = payload["autoregressive_graphs"]
    assert graphs["llm"]["cache_capacity"] == 4032 and graphs["tts"]["cache_capacity"] == 4096
    assert graphs["llm"]["calls"] > 0 and graphs["tts"]["calls"] > 0 and graphs["llm"]["captures"] == 0
    printed = capsys.readouterr().out
    assert "autoregressive stages graphed" in printed and "bit-identical: all 5 chunks" in printed


# ---------------------------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_steps_replay_the_static_cache_logits_exactly_on_gpu():
    """Reduced sizes on CUDA: a stream whose one-token steps replay a captured graph and one that calls the
    same step directly, fed the same embeddings through window slides: logits and hidden states
    ``torch.equal`` at every feed; the same for the TTS backbone's steps."""
    device = torch.device("cuda")
    with torch.no_grad():
        model = live_model.DuplexModel(live_config.REDUCED, device)
        window = live_model.WindowSettings("basic", high=70, low=55)
        settings = live_config.DecodeSettings()
        graphed = live_static.StaticLlmStream(model.llm, settings, window, capacity=79, capture=True)
        direct = live_static.StaticLlmStream(model.llm, settings, window, capacity=79, capture=False)
        for (logits_g, hidden_g), (logits_d, hidden_d) in _feed_units(
            (graphed, direct), 24, model.sizes.llm_hidden, device
        ):
            assert torch.equal(logits_g, logits_d) and torch.equal(hidden_g, hidden_d)
        assert graphed.dropped_units == direct.dropped_units > 3
        assert graphed.graph.captures == 1 and graphed.graph.replays > 20 and direct.graph.replays == 0
        for a, b in zip(graphed.kv.keys, direct.kv.keys):
            assert torch.equal(a, b)

    with torch.inference_mode():
        tts = model.tts
        backbones = [live_static.StaticSpeechBackbone(tts, capacity=256, capture=capture) for capture in (True, False)]
        condition = tts.emb_text(torch.arange(5, device=device))[None]
        outputs = [b.forward(condition, torch.arange(5, device=device)) for b in backbones]
        assert torch.equal(outputs[0], outputs[1])
        for step in range(40):
            token = tts.emb_code[0](torch.tensor([[step * 37 % 6561]], device=device))
            position = torch.tensor([5 + step], device=device)
            outputs = [b.forward(token, position) for b in backbones]
            assert torch.equal(outputs[0], outputs[1])
        assert backbones[0].graph.captures == 1 and backbones[0].graph.replays == 40


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_released_graphed_conversation_on_gpu(tmp_path):
    """The released sizes, graphed: one LLM and one TTS graph captured and replayed; the tails still equal."""
    if importlib.util.find_spec("stepaudio2") is None:
        pytest.skip("needs stepaudio2-minicpmo")
    out = tmp_path / "live_graphed.json"
    code = load_script().main(["--device", "cuda", "--ar", "graphed", "--pattern", "L1 S2 L1 S1", "--out", str(out)])
    payload = json.loads(out.read_text())
    assert code == 0 and payload["bit_identical"] is True and payload["chunks_compared"] == 5
    assert payload["autoregressive"] == "graphed" and payload["config"]["sizes"]["name"] == "released"
    graphs = payload["autoregressive_graphs"]
    for stage in ("llm", "tts"):
        assert graphs[stage]["captures"] == 1 and graphs[stage]["replays"] == graphs[stage]["calls"] > 0
