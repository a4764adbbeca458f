"""The engine's transformer stacks against ``transformers``' own forward: MiniCPM-o 4.5's LLM (Qwen3) and TTS
(Llama) decoders and its Whisper encoder at the reduced sizes, several conversations at once at different cache
lengths in shuffled slots, each compared with the model run alone on that conversation's tokens with a
``DynamicCache``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import DynamicCache  # noqa: E402

from duplexcadence.examples.minicpmo45.live_config import REDUCED  # noqa: E402
from duplexcadence.examples.minicpmo45.live_model import DuplexModel  # noqa: E402
from duplexcadence.interpreter.engine.kv import SlotKV  # noqa: E402
from duplexcadence.interpreter.engine.stacks import LlamaStack, WhisperStack  # noqa: E402


@pytest.fixture(scope="module")
def model() -> DuplexModel:
    return DuplexModel(REDUCED, "cpu")


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return float((out.double() - reference.double()).norm() / reference.double().norm())


def slot_kv(layers: int, kv_heads: int, head_dim: int) -> SlotKV:
    return SlotKV(
        layers=layers, slots=4, kv_heads=kv_heads, capacity=64, head_dim=head_dim, dtype=torch.bfloat16, device="cpu"
    )


@pytest.mark.parametrize("name", ["llm", "tts"])
def test_llama_stack_is_the_decoder_run_alone_per_conversation(model, name) -> None:
    decoder = model.llm.model if name == "llm" else model.tts.model
    config = decoder.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = slot_kv(config.num_hidden_layers, config.num_key_value_heads, head_dim)
    stack = LlamaStack(decoder, kv, "torch")
    pasts, slots = [5, 0, 9], [2, 0, 3]
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randn(p + 12, config.hidden_size, generator=generator).to(torch.bfloat16) for p in pasts]
    caches = []
    with torch.no_grad():
        for slot, past, embeds in zip(slots, pasts, tokens):
            cache = DynamicCache()
            if past:
                rows = torch.tensor([slot])
                stack(embeds[None, :past], rows)
                kv.advance(rows, past)
                decoder(inputs_embeds=embeds[None, :past], past_key_values=cache, position_ids=torch.arange(past)[None])
            caches.append(cache)
        rows = torch.tensor(slots)
        prefill = stack(torch.stack([e[p : p + 11] for p, e in zip(pasts, tokens)]), rows)  # 11 tokens a row
        kv.advance(rows, 11)
        step = stack(torch.stack([e[p + 11 : p + 12] for p, e in zip(pasts, tokens)]), rows)  # then one
        kv.advance(rows, 1)
        for row, (past, embeds, cache) in enumerate(zip(pasts, tokens, caches)):
            positions = torch.arange(past, past + 12)[None]
            alone = decoder(
                inputs_embeds=embeds[None, past : past + 11], past_key_values=cache, position_ids=positions[:, :11]
            )
            alone_step = decoder(
                inputs_embeds=embeds[None, past + 11 :], past_key_values=cache, position_ids=positions[:, 11:]
            )
            assert relative_error(prefill[row], alone.last_hidden_state[0]) < 1e-2
            assert relative_error(step[row], alone_step.last_hidden_state[0]) < 1e-2
    assert kv.lengths.tolist() == [12, 0, 17, 21]


def test_whisper_stack_is_the_encoder_run_alone_per_conversation(model) -> None:
    encoder = model.apm
    layer = encoder.layers[0].self_attn
    kv = slot_kv(len(encoder.layers), layer.num_heads, layer.head_dim)
    stack = WhisperStack(encoder, kv, "torch")
    pasts, slots, frames = [6, 0], [1, 3], 5
    generator = torch.Generator().manual_seed(1)
    width = encoder.config.d_model
    hidden = [torch.randn(p + frames, width, generator=generator).to(torch.bfloat16) for p in pasts]
    with torch.no_grad():
        for slot, past, states in zip(slots, pasts, hidden):
            if past:
                rows = torch.tensor([slot])
                stack(states[None, :past], rows)
                kv.advance(rows, past)
        out = stack(torch.stack([h[p:] for p, h in zip(pasts, hidden)]), torch.tensor(slots))
        for row, (past, states) in enumerate(zip(pasts, hidden)):
            cache = DynamicCache()
            mask = torch.zeros(1, 1, past, past, dtype=torch.bfloat16)
            alone = states[None, :past]
            for encoder_layer in encoder.layers:
                alone = encoder_layer(alone, mask, past_key_values=cache) if past else alone
            new = states[None, past:]
            mask = torch.zeros(1, 1, frames, past + frames, dtype=torch.bfloat16)
            for encoder_layer in encoder.layers:
                new = encoder_layer(new, mask, past_key_values=cache)
            assert relative_error(out[row], new[0]) < 1e-2
