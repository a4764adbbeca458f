"""MiniCPM-o 4.5's autoregressive stages for the duplex unit loop, with seeded random weights, on ``transformers``.

What each piece reproduces (OpenBMB/MiniCPM-o-Demo ``MiniCPMO45/modeling_minicpmo.py``,
``MiniCPMO45/utils.py``, ``MiniCPMO45/processing_minicpmo.py``; the algorithms are re-expressed here, no
code is copied):

* :class:`StreamingMel`: ``StreamingMelProcessorExact`` in the duplex settings (1 s chunks, a first chunk
  of 1035 ms, 20 ms of context either side, a 30 s buffer slid by 10 s): every call recomputes the log-mel
  of the whole buffer on the CPU with the Whisper filter bank (``MiniCPMAAudioProcessor``: a fixed
  -10 floor under 5 s of buffer, max - 8 dB above) and emits the stable frames of the new second.
* :class:`DuplexModel`: the modules of ``MiniCPMO`` that audio duplex runs, built at a
  :class:`~.live_config.LiveSizes` directly on the device, in bfloat16 (as ``MiniCPMODuplex`` casts
  the model): ``llm`` (``Qwen3ForCausalLM``, sdpa), ``apm`` (``WhisperEncoder``, sdpa), the audio
  projector (Linear -> ReLU -> Linear) and ``AvgPool1d(5)``, and ``tts`` (:class:`SpeechTokenModel`,
  ``MiniCPMTTS``'s modules around a ``LlamaModel`` backbone, eager attention). The vision encoder and
  resampler are not built (audio duplex never calls them).
  :meth:`DuplexModel.audio_embeddings_streaming` is ``get_audio_embedding_streaming`` with
  ``MiniCPMWhisperEncoder``'s cached forward (the encoder's KV cache grows by 50 frames a second and
  is dropped before it would pass 1500 positions); :meth:`DuplexModel.audio_embeddings` the
  non-streaming ``get_audio_embedding`` with 1 s chunk masks (the reference audio of the system prompt).
* :class:`LlmStream`: ``StreamDecoder``: ``feed`` (one ``Qwen3ForCausalLM`` call on the new embeddings
  with the growing ``DynamicCache``; logits and last hidden state of the last position), ``decode``
  (its two-stage sampling: chunk-eos check on the raw distribution, then forbidden tokens, the
  repetition penalty over the last 512 tokens, the turn-eos length penalty, the listen rank, top-k /
  top-p), the per-unit bookkeeping (``register_unit_start`` / ``register_unit_end``) and the
  ``basic`` sliding window: above ``high`` cached tokens, whole units are dropped from the front
  (the system prompt is kept) until at most ``low`` remain, the keys after the cut re-rotated to
  their new positions (``drop_tokens_from_cache``, ``realign_rotary_suffix``).
* :func:`generate_speech_tokens`: ``MiniCPMTTS.generate_chunk``: the condition prefilled at
  ``text_start_pos``, then one backbone step per token with the repetition penalty over the last 16
  tokens, end of speech masked before ``min_new_tokens``; the last sampled token is not returned.

``decode`` runs the whole sampling and then returns the token the caller chose (the scripted
conversation's): with random weights the model's own choices are noise, and upstream's
``force_listen`` substitutes a token the same way. What the choice changes (the repetition set,
the path of a chunk-eos decision) follows the chosen token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import attrs
import numpy as np
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as parametrize
from numpy.lib.stride_tricks import sliding_window_view
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from duplexcadence.examples.minicpmo45.live_config import (
    AUDIO_POOL_STEP,
    CHUNK_EOS_TOKEN,
    CHUNK_MS,
    CNN_REDUNDANCY_MS,
    FIRST_CHUNK_MS,
    LISTEN_TOKEN,
    SAMPLE_RATE_IN,
    TTS_AUDIO_BOS_TOKEN,
    TTS_AUDIO_TOKENS,
    TTS_PAD_TOKEN,
    TTS_TEXT_TOKENS,
    TURN_EOS_TOKEN,
    DecodeSettings,
    LiveSizes,
    audio_config,
    llm_config,
    tts_backbone_config,
)

MODEL_DTYPE = torch.bfloat16
N_FFT = 400
HOP = 160
MEL_FLOOR_SECONDS = 5.0
"""Under this much buffered audio the mel uses a fixed floor of -10 (log10), above it max - 8 dB."""
SLIDE_TRIGGER_SECONDS = 30.0
SLIDE_STRIDE_SECONDS = 10.0


# ---------------------------------------------------------------------------------------------- mel front end


class StreamingMel:
    """The duplex mel front end (``StreamingMelProcessorExact``, see the module docstring); CPU, numpy."""

    def __init__(self, mel_bins: int = 80) -> None:
        from transformers import WhisperFeatureExtractor
        from transformers.audio_utils import window_function

        extractor = WhisperFeatureExtractor(
            feature_size=mel_bins, sampling_rate=SAMPLE_RATE_IN, hop_length=HOP, n_fft=N_FFT
        )
        self.mel_filters = extractor.mel_filters
        self.window = window_function(N_FFT, "hann").astype(np.float64)
        self.chunk_samples = CHUNK_MS * SAMPLE_RATE_IN // 1000
        self.chunk_frames = self.chunk_samples // HOP
        self.first_chunk_samples = max(HOP, (FIRST_CHUNK_MS * SAMPLE_RATE_IN // 1000) // HOP * HOP)
        self.redundancy_frames = CNN_REDUNDANCY_MS * SAMPLE_RATE_IN // 1000 // HOP
        self.reset()

    def reset(self) -> None:
        self.buffer = np.zeros(0, dtype=np.float32)
        self.emitted_frames = 0
        self.base_frame = 0
        self.first = True

    @property
    def next_chunk_samples(self) -> int:
        """Samples the next call takes (``get_streaming_chunk_size``)."""
        return self.first_chunk_samples if self.first else self.chunk_samples

    def log_mel(self, waveform: np.ndarray, dynamic: bool) -> np.ndarray:
        """[mel_bins, frames] log10 mel of ``waveform`` (``MiniCPMAAudioProcessor``'s numpy path): the arithmetic
        of ``transformers.audio_utils.spectrogram`` (reflect-padded frames, float64 window and FFT stored as
        complex64, power 2, the mel filter bank, log10), its per-frame loop run as one batched FFT."""
        padded = np.pad(waveform, [(N_FFT // 2, N_FFT // 2)], mode="reflect").astype(np.float64)
        frames = sliding_window_view(padded, N_FFT)[::HOP] * self.window
        power = np.abs(np.fft.rfft(frames, axis=-1).astype(np.complex64), dtype=np.float64) ** 2.0
        log_spec = np.log10(np.maximum(1e-10, np.dot(self.mel_filters.T, power.T))).astype(np.float32)[:, :-1]
        floor = log_spec.max() - 8.0 if dynamic else -10.0
        return (np.maximum(log_spec, floor) + 4.0) / 4.0

    def _slide(self) -> None:
        if len(self.buffer) < SLIDE_TRIGGER_SECONDS * SAMPLE_RATE_IN:
            return
        stride = int(SLIDE_STRIDE_SECONDS * SAMPLE_RATE_IN)
        keep = min(SAMPLE_RATE_IN, len(self.buffer) - stride)
        drop = min(stride, max(0, len(self.buffer) - keep)) // HOP * HOP
        if drop > 0:
            self.buffer = self.buffer[drop:]
            self.base_frame += drop // HOP

    def process(self, chunk: np.ndarray) -> torch.Tensor:
        """Append ``chunk``; the frames of the new second with their context, float32 [1, mel_bins, frames]."""
        self.buffer = np.concatenate([self.buffer, chunk.astype(np.float32)])
        self._slide()
        mel = self.log_mel(self.buffer, dynamic=len(self.buffer) >= MEL_FLOOR_SECONDS * SAMPLE_RATE_IN)
        stable = min(mel.shape[-1], (len(self.buffer) - N_FFT // 2) // HOP + 1)
        core_end = self.emitted_frames + self.chunk_frames
        if self.base_frame + stable >= core_end + self.redundancy_frames:
            start = max(0, self.emitted_frames - self.redundancy_frames) - self.base_frame
            end = core_end + self.redundancy_frames - self.base_frame
            out = mel[:, max(0, start) : min(end, mel.shape[-1])]
            self.emitted_frames = core_end
        else:
            out = mel[:, :0]
        self.first = False
        return torch.from_numpy(np.ascontiguousarray(out))[None]


class UnitAudio:
    """``streaming_prefill``'s front end over :class:`StreamingMel`: the user's audio buffered, the first unit
    left-padded to 1035 ms, and each unit's mel with its context (a first unit has none on its left)."""

    def __init__(self, mel_bins: int = 80) -> None:
        self.mel = StreamingMel(mel_bins)
        self.reset()

    def reset(self) -> None:
        self.mel.reset()
        self.buffer = np.zeros(0, dtype=np.float32)
        self.units = 0

    def next_unit(self, waveform: np.ndarray) -> tuple[torch.Tensor, bool]:
        """The mel of the unit ``waveform`` completes, float32 [1, mel_bins, frames], and whether it is the
        conversation's first."""
        self.buffer = np.concatenate([self.buffer, waveform.astype(np.float32, copy=False)])
        first = self.units == 0
        required = FIRST_CHUNK_MS * SAMPLE_RATE_IN // 1000
        if first and len(self.buffer) < required:
            self.buffer = np.concatenate([np.zeros(required - len(self.buffer), dtype=np.float32), self.buffer])
        take = self.mel.next_chunk_samples
        mel = self.mel.process(self.buffer[:take])
        self.buffer = self.buffer[take:]
        self.units += 1
        return mel, first


# ---------------------------------------------------------------------------------------------- modules


class AudioProjector(nn.Module):
    """``MultiModalProjector``: Linear -> ReLU -> Linear."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim, bias=True)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(out_dim, out_dim, bias=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.relu(self.linear1(features)))


class SpeechTokenModel(nn.Module):
    """``MiniCPMTTS``'s modules: text embedding, ``LlamaModel`` backbone, speaker and semantic projectors
    (``projector_type="mlp"``), speech-token embedding and weight-normalised head (``num_vq = 1``)."""

    def __init__(self, sizes: LiveSizes) -> None:
        from transformers import LlamaModel

        super().__init__()
        self.emb_text = nn.Embedding(TTS_TEXT_TOKENS, sizes.tts_hidden)
        self.model = LlamaModel._from_config(
            tts_backbone_config(sizes), dtype=torch.get_default_dtype(), attn_implementation="eager"
        )
        self.projector_spk = AudioProjector(sizes.llm_hidden, sizes.tts_hidden)
        self.projector_semantic = AudioProjector(sizes.llm_hidden, sizes.tts_hidden)
        self.emb_code = nn.ModuleList([nn.Embedding(TTS_AUDIO_TOKENS, sizes.tts_hidden)])
        self.head_code = nn.ModuleList(
            [weight_norm(nn.Linear(sizes.tts_hidden, TTS_AUDIO_TOKENS, bias=False), name="weight")]
        )


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


class DuplexModel:
    """The modules audio duplex runs (see the module docstring), on one device, in bfloat16, eval mode."""

    def __init__(self, sizes: LiveSizes, device: str | torch.device = "cpu", seed: int = 4242) -> None:
        """Built under ``torch.device(device)`` and a bfloat16 default dtype, so every parameter is created and
        initialised on the device (the ``transformers`` modules by their ``_init_weights``, the others by
        torch's defaults), from ``seed``; the CPU and device generators are left as they were."""
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        self.sizes = sizes
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        fork = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork), torch.device(self.device), _default_dtype(MODEL_DTYPE):
            torch.manual_seed(seed)
            from transformers import Qwen3ForCausalLM

            self.llm = Qwen3ForCausalLM._from_config(llm_config(sizes), dtype=MODEL_DTYPE, attn_implementation="sdpa")
            self.apm = WhisperEncoder._from_config(audio_config(sizes), dtype=MODEL_DTYPE, attn_implementation="sdpa")
            for index, layer in enumerate(self.apm.layers):
                layer.self_attn.layer_idx = index  # MiniCPMWhisperEncoderLayer(config, layer_idx=i): a cached forward
            self.audio_projection = AudioProjector(sizes.audio_output_dim, sizes.llm_hidden)
            self.audio_pool = nn.AvgPool1d(AUDIO_POOL_STEP, stride=AUDIO_POOL_STEP)
            self.tts = SpeechTokenModel(sizes)
        for module in self.modules():
            module.eval()

    def modules(self) -> tuple[nn.Module, ...]:
        return (self.llm, self.apm, self.audio_projection, self.audio_pool, self.tts)

    def parameter_counts(self) -> dict[str, int]:
        counts = {
            "llm": _count(self.llm),
            "audio_encoder": _count(self.apm),
            "audio_projection": _count(self.audio_projection),
            "tts": _count(self.tts),
        }
        counts["total"] = sum(counts.values())
        return counts

    def parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for module in self.modules() for p in module.parameters())

    # -- LISTEN

    def _encode(
        self, mel: torch.Tensor, attention_mask: torch.Tensor, cache: Any, prefix_frames: int, suffix_frames: int
    ) -> torch.Tensor:
        apm = self.apm
        hidden = F.gelu(apm.conv1(mel.to(device=self.device, dtype=apm.conv1.weight.dtype)))
        hidden = F.gelu(apm.conv2(hidden))
        # conv2 halves the frames (rounding up): the context frames either side leave as (n + 1) // 2
        if prefix_frames > 0:
            hidden = hidden[:, :, (prefix_frames + 1) // 2 :]
        suffix = (suffix_frames + 1) // 2 if suffix_frames > 0 else 0
        if 0 < suffix < hidden.shape[2]:
            hidden = hidden[:, :, :-suffix]
        hidden = hidden.permute(0, 2, 1)
        past = cache.get_seq_length() if cache is not None else 0
        hidden = hidden + apm.embed_positions.weight[past : past + hidden.shape[1]]
        for layer in apm.layers:
            hidden = layer(hidden, attention_mask, past_key_values=cache)
        return apm.layer_norm(hidden)

    def _project(self, states: torch.Tensor, mel_frames: int) -> torch.Tensor:
        embeds = self.audio_projection(states).transpose(1, 2)
        embeds = self.audio_pool(embeds).transpose(1, 2)
        after_cnn = (mel_frames - 1) // 2 + 1
        tokens = (after_cnn - AUDIO_POOL_STEP) // AUDIO_POOL_STEP + 1
        return embeds[0, :tokens]

    def audio_embeddings_streaming(
        self, mel: torch.Tensor, cache: Any, prefix_frames: int, suffix_frames: int
    ) -> tuple[torch.Tensor, Any]:
        """One unit's audio embeddings [10, hidden] and the encoder's KV cache (``DynamicCache``)."""
        from transformers import DynamicCache

        mel_frames = mel.shape[-1]
        encoder_frames = (mel_frames - 1) // 2 + 1
        if cache is not None and cache.get_seq_length() + encoder_frames >= self.apm.embed_positions.weight.shape[0]:
            cache = None  # the 30 s of positions would run out: the encoder starts over
        if cache is None:
            cache = DynamicCache()
        new_frames = encoder_frames
        if prefix_frames > 0:
            new_frames -= (prefix_frames + 1) // 2
        if suffix_frames > 0:
            new_frames -= (suffix_frames + 1) // 2
        past = cache.get_seq_length()
        mask = torch.zeros(1, 1, new_frames, past + new_frames, dtype=self.apm.conv1.weight.dtype, device=self.device)
        states = self._encode(mel, mask, cache, prefix_frames, suffix_frames)
        return self._project(states, mel_frames), cache

    def audio_embeddings(self, mel: torch.Tensor, chunk_seconds: float = 1.0) -> torch.Tensor:
        """``get_audio_embedding`` of a whole recording with 1 s chunk masks (full left context)."""
        frames = (mel.shape[-1] - 1) // 2 + 1
        chunk = int(chunk_seconds * 50)
        index = torch.arange(frames, device=self.device)
        visible = index[None, :] < ((index[:, None] // chunk) + 1) * chunk
        mask = torch.zeros(frames, frames, dtype=self.apm.conv1.weight.dtype, device=self.device)
        mask.masked_fill_(~visible, float("-inf"))
        states = self._encode(mel, mask[None, None], None, 0, 0)
        return self._project(states, mel.shape[-1])


# ---------------------------------------------------------------------------------------------- the LLM


def rope_theta(config: Any) -> float:
    """The RoPE base of a ``transformers`` config (``rope_parameters`` in transformers 5, else ``rope_theta``)."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(head_dim: int, positions: torch.Tensor, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(dtype)
    return cos[None, None], sin[None, None]


def rotate_keys(keys: torch.Tensor, old_start: int, new_start: int, theta: float) -> torch.Tensor:
    """Keys [B, H, L, D] rotated at positions ``old_start + i`` re-rotated to ``new_start + i``."""
    length, head_dim = keys.shape[-2], keys.shape[-1]
    old = torch.arange(old_start, old_start + length, device=keys.device)
    new = torch.arange(new_start, new_start + length, device=keys.device)
    cos_old, sin_old = _rotary(head_dim, old, theta, keys.dtype)
    base = cos_old * keys - sin_old * _rotate_half(keys)
    cos_new, sin_new = _rotary(head_dim, new, theta, keys.dtype)
    return cos_new * base + sin_new * _rotate_half(base)


@attrs.frozen
class WindowSettings:
    """The duplex sliding window: ``off`` or ``basic`` (``MiniCPMODuplex`` defaults 4000 / 3500 tokens)."""

    mode: str = "basic"
    high: int = 4000
    low: int = 3500

    def __attrs_post_init__(self) -> None:
        if self.mode not in ("off", "basic"):
            raise ValueError(f"sliding window mode must be 'off' or 'basic', got {self.mode!r}")
        if not 0 <= self.low <= self.high:
            raise ValueError(f"the window needs 0 <= low <= high, got low {self.low}, high {self.high}")


@attrs.define
class UnitSpan:
    """One unit's tokens in the LLM cache (``_unit_history``)."""

    unit_id: int
    length: int
    is_listen: bool


class LlmStream:
    """``StreamDecoder`` over one conversation's KV cache (see the module docstring)."""

    def __init__(self, llm: Any, settings: DecodeSettings, window: WindowSettings) -> None:
        self.llm = llm
        """``Qwen3ForCausalLM``."""
        self.settings = settings
        self.window = window
        self.rope_theta = rope_theta(llm.config)
        self.forbidden = [TTS_PAD_TOKEN, CHUNK_EOS_TOKEN]
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None
        self.generated_tokens: list[int] = []
        self.units: list[UnitSpan] = []
        self.next_unit_id = 0
        self.unit_start_length: int | None = None
        self.system_length = 0
        self.dropped_units = 0
        self.dropped_tokens = 0

    @property
    def device(self) -> torch.device:
        return self.llm.lm_head.weight.device

    def cache_length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def embed(self, token: int) -> torch.Tensor:
        return self.llm.model.embed_tokens(torch.tensor([token], device=self.device))

    def embed_many(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.llm.model.embed_tokens(torch.tensor(list(tokens), device=self.device))

    def feed(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the LLM on ``embeds`` [L, hidden] after the cache -> (logits [1, vocab] and hidden state
        [1, 1, hidden] of the last position)."""
        past = self.cache_length()
        positions = torch.arange(past, past + embeds.shape[0], device=embeds.device)[None]
        out = self.llm(
            inputs_embeds=embeds[None],
            position_ids=positions,
            past_key_values=self.cache,
            return_dict=True,
            output_hidden_states=True,
        )
        self.cache = out.past_key_values
        last = out.hidden_states[-1]
        return self.llm.lm_head(last)[:, -1], last[:, -1:]

    def decode(self, logits: torch.Tensor, choice: int) -> int:
        """``StreamDecoder.decode`` in sampling mode, returning ``choice`` (see the module docstring)."""
        s = self.settings
        logits = logits.clone()
        sampled = int(torch.multinomial(F.softmax(logits[0], dim=-1), num_samples=1).item())
        if sampled == CHUNK_EOS_TOKEN or choice == CHUNK_EOS_TOKEN:
            return choice  # the model ends the chunk here, before any other processing
        logits[:, self.forbidden] = float("-inf")
        if s.text_repetition_penalty != 1.0 and self.generated_tokens:
            for token in set(self.generated_tokens[-s.text_repetition_window_size :]):
                if token < logits.shape[-1]:
                    if s.text_repetition_penalty > 1.0:
                        logits[0, token] /= s.text_repetition_penalty
                    else:
                        logits[0, token] *= 1.0 / s.text_repetition_penalty
        if s.length_penalty != 1.0:
            if logits[0, TURN_EOS_TOKEN] > 0:
                logits[0, TURN_EOS_TOKEN] = logits[0, TURN_EOS_TOKEN] / s.length_penalty
            else:
                logits[0, TURN_EOS_TOKEN] = logits[0, TURN_EOS_TOKEN] * s.length_penalty
        if s.listen_prob_scale != 1.0:
            logits[0, LISTEN_TOKEN] *= s.listen_prob_scale
        (logits[0] > logits[0, LISTEN_TOKEN]).sum().item()  # the listen rank (listen_top_k unset: unused)
        logits = _top_k_top_p(logits / s.temperature, s.top_k, s.top_p)
        torch.multinomial(F.softmax(logits, dim=-1), num_samples=1).squeeze(1).item()
        self.generated_tokens.append(choice)
        return choice

    # -- the per-unit window

    def register_unit_start(self) -> None:
        self.unit_start_length = self.cache_length()

    def register_unit_end(self, is_listen: bool) -> None:
        if self.unit_start_length is None:
            raise RuntimeError("register_unit_end without register_unit_start")
        length = self.cache_length() - self.unit_start_length
        if length > 0:
            self.units.append(UnitSpan(self.next_unit_id, length, is_listen))
        self.unit_start_length = None
        self.next_unit_id += 1

    def register_system_prompt(self) -> None:
        self.system_length = self.cache_length()

    def enforce_window(self) -> bool:
        """The ``basic`` window after a unit: drop whole units from the front while above ``low``, once above ``high``."""
        if self.window.mode != "basic" or self.cache_length() <= self.window.high:
            return False
        dropped = False
        while self.cache_length() > self.window.low and self.units:
            self.drop_unit(self.units.pop(0))
            dropped = True
        return dropped

    def drop_unit(self, unit: UnitSpan) -> None:
        """Remove ``unit``'s tokens (the first unit after the system prompt) from the cache, the keys after it
        re-rotated to their new positions."""
        keep, cut = self.system_length, unit.length
        for layer in self.cache.layers:
            keys, values = layer.keys, layer.values
            suffix_keys = rotate_keys(keys[:, :, keep + cut :], keep + cut, keep, self.rope_theta)
            layer.keys = torch.cat([keys[:, :, :keep], suffix_keys], dim=-2).contiguous()
            layer.values = torch.cat([values[:, :, :keep], values[:, :, keep + cut :]], dim=-2).contiguous()
        self.dropped_units += 1
        self.dropped_tokens += cut


def _top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    logits = logits.clone()
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits[logits < kth] = float("-inf")
    if top_p > 0.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1)
        remove = cumulative > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits[0, order[remove]] = float("-inf")
    return logits


# ---------------------------------------------------------------------------------------------- the TTS


def tts_condition(tts: SpeechTokenModel, tokens: Sequence[int], hidden: Sequence[torch.Tensor]) -> torch.Tensor:
    """``_convert_results_to_tts_input``: text embedding + normalised semantic projection of the LLM
    hidden state per token, then the audio BOS -> [1, len + 1, tts_hidden]."""
    device = tts.emb_text.weight.device
    bos = tts.emb_text(torch.tensor([TTS_AUDIO_BOS_TOKEN], device=device, dtype=torch.long))
    if not tokens:
        return bos[None]
    embeds = tts.emb_text(torch.tensor(list(tokens), device=device, dtype=torch.long))
    states = tts.projector_semantic(torch.cat([h.reshape(1, -1) for h in hidden], dim=0))
    embeds = embeds + F.normalize(states, p=2, dim=-1)
    return torch.cat([embeds, bos], dim=0)[None]


def _repetition_penalty(past: torch.Tensor, scores: torch.Tensor, penalty: float, window: int) -> torch.Tensor:
    """``CustomRepetitionPenaltyLogitsProcessorRepeat``: scores of tokens seen in the last ``window`` divided
    (positive) or multiplied (negative) by ``penalty`` per occurrence."""
    if past.size(1) > window:
        past = past.narrow(1, -window, window)
    counts = F.one_hot(past, scores.size(1)).sum(1)
    alpha = torch.pow(penalty, counts)
    scores = scores.contiguous()
    return torch.where(scores < 0, scores.multiply(alpha), scores.divide(alpha))


class SpeechBackbone(Protocol):
    """The TTS backbone and head behind :func:`generate_speech_tokens` when they keep their own KV cache."""

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run ``inputs_embeds`` [1, L, tts_hidden] at ``positions`` [L] after the cache -> float32 logits
        [1, TTS_AUDIO_TOKENS] of the last position."""
        ...


@torch.inference_mode()
def generate_speech_tokens(
    tts: SpeechTokenModel,
    condition: torch.Tensor,
    past: Any,
    text_start_pos: int,
    min_new_tokens: int,
    max_new_tokens: int,
    temperature: torch.Tensor,
    settings: DecodeSettings,
    backbone: SpeechBackbone | None = None,
) -> tuple[torch.Tensor, Any]:
    """``generate_chunk`` -> (speech tokens [1, n, 1] int64, the backbone's cache); ``n <= max_new_tokens - 1``.
    With ``backbone`` the steps run on it (its own cache; ``past`` is returned as given)."""
    device = condition.device
    eos = TTS_AUDIO_TOKENS - 1
    finished = torch.zeros(1, device=device, dtype=torch.bool)
    temperature = temperature.unsqueeze(0).expand(1, -1).contiguous().view(-1, 1).to(device)
    condition_length = condition.shape[1]
    new_tokens = torch.zeros(1, max_new_tokens, 1, device=device, dtype=torch.long)
    step = 0
    for step in range(max_new_tokens):
        if step == 0:
            inputs = condition
            positions = torch.tensor(list(range(text_start_pos, text_start_pos + condition_length)), device=device)
        else:
            inputs = tts.emb_code[0](new_tokens[:, step - 1 : step, 0])
            positions = torch.tensor([text_start_pos + condition_length + step - 1], device=device)
        if backbone is None:
            out = tts.model(position_ids=positions[None], past_key_values=past, inputs_embeds=inputs, use_cache=True)
            past = out.past_key_values
            hidden = out.last_hidden_state
            with parametrize.cached():
                logits = torch.empty(1, hidden.size(1), TTS_AUDIO_TOKENS, 1, dtype=torch.float, device=device)
                logits[..., 0] = tts.head_code[0](hidden)
            logits = logits[:, -1].float().permute(0, 2, 1).reshape(-1, TTS_AUDIO_TOKENS)
        else:
            logits = backbone.forward(inputs, positions)
        logits /= temperature
        if step > 0 and settings.tts_repetition_penalty != 1:
            seen = new_tokens[:, :step].permute(0, 2, 1).reshape(1, -1)
            logits = _repetition_penalty(seen, logits, settings.tts_repetition_penalty, settings.tts_repetition_window)
        if step < min_new_tokens:
            logits[:, eos] = float("-inf")
        token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1).view(-1, 1)
        finished.logical_or_(token.eq(eos).any(1))
        new_tokens[:, step] = token
        if step == 0 and finished.any():
            break
        if finished.all():
            break
    return new_tokens[:, :step, :], past
