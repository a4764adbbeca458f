"""MiniCPM-o 4.5's duplex unit planned at the sizes of the live loop: `stdlib/models/minicpmo45_duplex.clock`
with its params from a :class:`.live_config.LiveSizes` (the released sizes or the reduced CPU ones), the
sliding window and the decoding settings.

:func:`clock_params` gives the `--param` values (every size of the `.clock` is a param); :func:`unit_plan`
the :class:`~duplexcadence.interpreter.plans.conversations.ConversationPlan` a conversation engine reads:
each conversation's bytes by region, the graphs of LISTEN and of the LLM's and the TTS's one-token steps per
row count, how many conversations fit.
"""

from __future__ import annotations

from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.examples.minicpmo45.live import (
    AUDIO_EMBEDDINGS_PER_SECOND,
    REFERENCE_AUDIO_SECONDS,
    SYSTEM_PREFIX,
    SYSTEM_SUFFIX,
)
from duplexcadence.examples.minicpmo45.live_config import (
    TTS_AUDIO_TOKENS,
    TTS_TOKENS_PER_UNIT,
    DecodeSettings,
    LiveSizes,
)
from duplexcadence.examples.minicpmo45.live_model import WindowSettings
from duplexcadence.interpreter.plans.conversations import ConversationPlan
from duplexcadence.interpreter.plans.plan import conversation_plan

MODULE = "models.minicpmo45_duplex"
AUDIO_FRAMES_PER_SECOND = 50
"""Whisper encoder positions a second (100 mel frames, halved by its strided convolution)."""
AUDIO_CONTEXT_FRAMES = 2
"""Encoder frames of a unit beyond its 50: the 20 ms of mel context either side (``CNN_REDUNDANCY_MS``)."""


def audio_kept(positions: int) -> int:
    """The encoder cache's high mark: the longest cache after which the next unit's frames (50 and the
    context) still fit in its `positions` (``audio_embeddings_streaming`` starts over beyond it)."""
    fits = positions - AUDIO_FRAMES_PER_SECOND - AUDIO_CONTEXT_FRAMES - 1
    return fits // AUDIO_FRAMES_PER_SECOND * AUDIO_FRAMES_PER_SECOND


def clock_params(
    sizes: LiveSizes,
    window: WindowSettings | None = None,
    settings: DecodeSettings | None = None,
    conversations: int = 16,
    n_timesteps: int = 10,
    turn_seconds: int = 60,
) -> dict[str, str]:
    """The params of `models.minicpmo45_duplex` for these sizes (as `--param` takes them); `turn_seconds`: the
    longest speaking turn, which sizes the TTS cache."""
    window = window or WindowSettings()
    settings = settings or DecodeSettings()
    system = len(SYSTEM_PREFIX) + int(REFERENCE_AUDIO_SECONDS * AUDIO_EMBEDDINGS_PER_SECOND) + len(SYSTEM_SUFFIX)
    values = {
        "conversations": conversations,
        "llm_layers": sizes.llm_layers,
        "llm_kv_heads": sizes.llm_kv_heads,
        "llm_head_dim": sizes.llm_head_dim,
        "llm_hidden": sizes.llm_hidden,
        "llm_vocab": sizes.llm_vocab,
        "system": system,
        "high": window.high,
        "low": window.low,
        "decode_steps": settings.max_new_speak_tokens_per_chunk,
        "audio_layers": sizes.audio_layers,
        "audio_heads": sizes.audio_heads,
        "audio_head_dim": sizes.audio_d_model // sizes.audio_heads,
        "audio_kept": audio_kept(sizes.audio_max_positions),
        "audio_embeddings": AUDIO_EMBEDDINGS_PER_SECOND,
        "tts_layers": sizes.tts_layers,
        "tts_kv_heads": sizes.tts_kv_heads,
        "tts_head_dim": sizes.tts_hidden // sizes.tts_heads,
        "tts_vocab": TTS_AUDIO_TOKENS,
        "tts_positions": sizes.tts_max_positions,
        "speech_tokens": TTS_TOKENS_PER_UNIT - 1,
        "turn": f"{turn_seconds} s",
        "P": sizes.prompt_frames,
        "steps": n_timesteps,
        "layers": sizes.tail.encoder_blocks + sizes.tail.encoder_up_blocks,
    }
    return {name: str(value) for name, value in values.items()}


def unit_plan(sizes: LiveSizes, **options) -> ConversationPlan:
    """The conversation plan of the duplex unit at these sizes (`options`: as :func:`clock_params`)."""
    return conversation_plan(stdlib_path(MODULE), clock_params(sizes, **options))
