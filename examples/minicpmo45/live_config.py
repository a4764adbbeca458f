"""Sizes, special tokens and decoding settings of MiniCPM-o 4.5's duplex unit loop (:mod:`.live`).

The released ``config.json`` of ``openbmb/MiniCPM-o-4_5`` (model hub only) cannot be read here. The
values below come from what can be read; README.md ("The live duplex loop", "Sizes") says where
each comes from:

* the LLM is Qwen3-8B's architecture (``MiniCPMOConfig`` subclasses ``Qwen3Config``; the model
  is ``Qwen3ForCausalLM``) with the 151 748-token vocabulary of MiniCPM-o 4.5's tokenizer (its
  highest added token id is 151 747 in OpenBMB/MiniCPM-o-Demo ``MiniCPMO45/added_tokens.json``);
* the audio encoder is Whisper-medium's encoder (``audio_config`` is a ``WhisperConfig``);
* the TTS backbone is the ``MiniCPMTTSConfig`` Llama (768 x 20 layers) with the vocabulary sizes
  of the released TTS config (6562 audio tokens = 6561 S3 tokens + end of speech, 152 064 text
  embeddings, audio BOS 151 687);
* the token2wav tail is :data:`.model.RELEASED`.

:data:`REDUCED` keeps every vocabulary, token id and the streaming shapes (1 s units, 10 audio
embeddings a unit, 25 + 1 speech tokens) but shrinks the widths and depths, for CPU tests.
"""

from __future__ import annotations

import attrs

from duplexcadence.examples.minicpmo45.model import RELEASED as RELEASED_TAIL
from duplexcadence.examples.minicpmo45.model import TailConfig

# Special tokens of the LLM (OpenBMB/MiniCPM-o-Demo MiniCPMO45/added_tokens.json).
UNIT_TOKEN = 151683
"""``<unit>``: fed at the start of every unit."""
UNIT_END_TOKEN = 151684
"""``</unit>``: fed at the end of every unit."""
TTS_BOS_TOKEN = 151703
LISTEN_TOKEN = 151705
SPEAK_TOKEN = 151706
TURN_EOS_TOKEN = 151717
CHUNK_EOS_TOKEN = 151718
CHUNK_TTS_EOS_TOKEN = 151721
TTS_PAD_TOKEN = 151722
CHUNK_TERMINATORS = (LISTEN_TOKEN, CHUNK_EOS_TOKEN, CHUNK_TTS_EOS_TOKEN)
"""A unit's text generation stops at one of these (``chunk_terminator_token_ids``)."""
TEXT_TOKENS = 151643
"""Ordinary text tokens are ids below this (151 643 is ``<|endoftext|>``)."""

TTS_AUDIO_BOS_TOKEN = 151687
"""``tts_config.audio_bos_token_id``: the TTS condition ends with its text embedding."""
TTS_AUDIO_TOKENS = 6562
"""``tts_config.num_audio_tokens``: 6561 S3 speech tokens and the end-of-speech token 6561."""
TTS_TEXT_TOKENS = 152064
"""``tts_config.num_text_tokens``: rows of the TTS text embedding."""
TTS_TOKENS_PER_UNIT = 25 + 1
"""``max_token_per_chunk`` / ``min_token_per_chunk`` of a speaking unit. ``generate_chunk`` returns
the tokens before the last one it samples: 25 per unit, one second of speech at 25 Hz."""

SAMPLE_RATE_IN = 16_000
"""The user's audio (``MiniCPMODuplex.SAMPLE_RATE``)."""
CHUNK_MS = 1000
FIRST_CHUNK_MS = 1035
CNN_REDUNDANCY_MS = 20
"""``MiniCPMODuplex`` defaults: 1 s units, a first unit of 1035 ms, 20 ms of mel context either side."""
AUDIO_POOL_STEP = 5
"""``config.audio_pool_step``: 50 encoder frames a second pooled to 10 LLM embeddings."""


@attrs.frozen
class DecodeSettings:
    """``MiniCPMODuplex`` / ``streaming_generate`` defaults of the text and speech-token sampling."""

    max_new_speak_tokens_per_chunk: int = 20
    temperature: float = 0.7
    top_k: int = 20
    top_p: float = 0.8
    text_repetition_penalty: float = 1.05
    text_repetition_window_size: int = 512
    length_penalty: float = 1.1
    listen_prob_scale: float = 1.0
    tts_temperature: float = 0.8
    tts_repetition_penalty: float = 1.05
    tts_repetition_window: int = 16


@attrs.frozen
class LiveSizes:
    """Widths and depths of the duplex loop's modules."""

    name: str
    llm_hidden: int = 4096
    llm_intermediate: int = 12288
    llm_layers: int = 36
    llm_heads: int = 32
    llm_kv_heads: int = 8
    llm_head_dim: int = 128
    llm_vocab: int = 151748
    llm_rope_theta: float = 1_000_000.0
    llm_max_positions: int = 40960
    audio_d_model: int = 1024
    audio_layers: int = 24
    audio_heads: int = 16
    audio_ffn: int = 4096
    audio_max_positions: int = 1500
    mel_bins: int = 80
    tts_hidden: int = 768
    tts_intermediate: int = 3072
    tts_layers: int = 20
    tts_heads: int = 12
    tts_kv_heads: int = 12
    tts_max_positions: int = 4096
    tail: TailConfig = RELEASED_TAIL
    prompt_frames: int = 150
    """The voice prompt of the token2wav tail in mel frames (3 s)."""

    @property
    def audio_output_dim(self) -> int:
        """Input width of the audio projector: ``encoder_ffn_dim // 4`` (as ``MiniCPMO.__init__``)."""
        return self.audio_ffn // 4


RELEASED = LiveSizes("released")
REDUCED = LiveSizes(
    "reduced",
    llm_hidden=64,
    llm_intermediate=128,
    llm_layers=2,
    llm_heads=4,
    llm_kv_heads=2,
    llm_head_dim=16,
    audio_d_model=64,
    audio_layers=2,
    audio_heads=4,
    audio_ffn=256,
    tts_hidden=64,
    tts_intermediate=128,
    tts_layers=2,
    tts_heads=4,
    tts_kv_heads=4,
    tail=TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32),
    prompt_frames=20,
)
SIZES = {sizes.name: sizes for sizes in (RELEASED, REDUCED)}


def llm_config(sizes: LiveSizes):
    """The ``Qwen3Config`` of the LLM (sdpa attention; no flash-attn on the GPU image)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=sizes.llm_vocab,
        hidden_size=sizes.llm_hidden,
        intermediate_size=sizes.llm_intermediate,
        num_hidden_layers=sizes.llm_layers,
        num_attention_heads=sizes.llm_heads,
        num_key_value_heads=sizes.llm_kv_heads,
        head_dim=sizes.llm_head_dim,
        max_position_embeddings=sizes.llm_max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": sizes.llm_rope_theta},
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
    )


def audio_config(sizes: LiveSizes):
    """The ``WhisperConfig`` of the audio encoder (only its encoder is built)."""
    from transformers import WhisperConfig

    return WhisperConfig(
        d_model=sizes.audio_d_model,
        encoder_layers=sizes.audio_layers,
        encoder_attention_heads=sizes.audio_heads,
        encoder_ffn_dim=sizes.audio_ffn,
        decoder_layers=1,
        num_mel_bins=sizes.mel_bins,
        max_source_positions=sizes.audio_max_positions,
    )


def tts_backbone_config(sizes: LiveSizes):
    """The ``LlamaConfig`` that ``MiniCPMTTS`` builds its backbone from (eager attention: upstream's choice
    when the model does not run flash attention)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=sizes.tts_hidden,
        intermediate_size=sizes.tts_intermediate,
        num_attention_heads=sizes.tts_heads,
        num_hidden_layers=sizes.tts_layers,
        num_key_value_heads=sizes.tts_kv_heads,
        max_position_embeddings=sizes.tts_max_positions,
    )
