"""The autoregressive stages of the live duplex loop on static KV caches, their one-token steps replayed from
CUDA graphs (the ``graphed`` variant of :mod:`.live`; the ``eager`` variant is :mod:`.live_model` as is).

* :class:`StaticKV`: a KV cache of fixed capacity, keys and values [1, kv_heads, capacity, head_dim] per
  layer allocated once. A forward writes its keys and values at the slots of a device tensor of indices
  and attends over the whole buffer, the slots at or past each query's own masked out (:meth:`StaticKV.mask`),
  so nothing in it depends on a host value.
* :func:`static_forward`: the decoder layers of a ``transformers`` model (``Qwen3Model``, ``LlamaModel``)
  called directly on a :class:`StaticKV`, with that mask and the model's own rotary embedding; the model's
  mask builders, which size their masks from the cache's length on the host, are not used.
* :class:`StepGraph`: a step function with static inputs and outputs. On CUDA the first call warms it up
  on a side stream and captures it into a ``torch.cuda.CUDAGraph``, every call then replays it; elsewhere
  (or with ``capture=False``) every call runs it directly, the same code on the same buffers.
* :class:`StaticLlmStream`: :class:`.live_model.LlmStream` on a :class:`StaticKV`: a one-token feed is a
  :class:`StepGraph` step (input embedding, position and write slot copied into its static inputs; logits and
  last hidden state out of its static outputs), a feed of several tokens runs eagerly on the same cache. The
  sliding window drops a unit by moving the kept entries to the front of the buffers (the keys re-rotated,
  :func:`.live_model.rotate_keys`), outside any graph; the graph reads the position from its device input,
  so it stays valid.
* :class:`StaticSpeechBackbone`: the TTS ``LlamaModel`` and its head on a :class:`StaticKV`, as
  :class:`.live_model.SpeechBackbone` for :func:`.live_model.generate_speech_tokens`: the condition
  (several tokens) eagerly, each later token a :class:`StepGraph` step; the sampling stays eager around it.

The results are close to the eager modules' but not bitwise equal: attention runs over the static length
with a mask, so its reductions have other shapes than over a ``DynamicCache``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils.parametrize as parametrize

from duplexcadence.examples.minicpmo45.live_config import TTS_AUDIO_TOKENS, DecodeSettings
from duplexcadence.examples.minicpmo45.live_model import (
    LlmStream,
    SpeechTokenModel,
    UnitSpan,
    WindowSettings,
    rotate_keys,
)

WARMUP_CALLS = 2
"""Calls on a side stream before a capture (PyTorch's recipe: lazy initialisation stays out of the graph)."""


class CacheFull(RuntimeError):
    """A feed that would pass a static cache's capacity."""


class StaticKV:
    """Keys and values of fixed capacity per layer (see the module docstring). ``length`` (host) is how many
    slots hold entries; ``write_index`` (device, int64 [L]) the slots the running forward writes; ``step_index``
    the one-slot input of a graphed step."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        additive_mask: bool,
    ) -> None:
        shape = (1, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.capacity = capacity
        self.dtype = dtype
        self.additive_mask = additive_mask
        """True: a float mask added to the scores (eager attention); False: a boolean mask (sdpa)."""
        self.slots = torch.arange(capacity, device=device)
        self.step_index = torch.zeros(1, dtype=torch.long, device=device)
        self.write_index = self.step_index
        self.length = 0

    def clear(self) -> None:
        for tensor in (*self.keys, *self.values):
            tensor.zero_()
        self.length = 0

    def reserve(self, tokens: int) -> None:
        """Check that ``tokens`` more fit."""
        if self.length + tokens > self.capacity:
            raise CacheFull(
                f"the static KV cache holds {self.capacity} tokens: {self.length} cached + {tokens} new do not fit"
            )

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args: Any) -> tuple[torch.Tensor, ...]:
        """The attention layers' cache call: write at ``write_index``, return the whole buffers."""
        self.keys[layer_idx].index_copy_(2, self.write_index, keys)
        self.values[layer_idx].index_copy_(2, self.write_index, values)
        return self.keys[layer_idx], self.values[layer_idx]

    def mask(self, write_index: torch.Tensor) -> torch.Tensor:
        """[1, 1, L, capacity]: query i sees the slots up to its own, ``write_index[i]``."""
        hidden = self.slots[None, :] > write_index[:, None]
        if not self.additive_mask:
            return (~hidden)[None, None]
        bias = torch.zeros(hidden.shape, dtype=self.dtype, device=hidden.device)
        return bias.masked_fill_(hidden, torch.finfo(self.dtype).min)[None, None]

    def drop(self, start: int, count: int, rotate: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Remove slots ``start .. start + count`` and move the later entries down (their keys through ``rotate``);
        the freed slots at the end are zeroed."""
        end, length = start + count, self.length
        for keys, values in zip(self.keys, self.values):
            moved_keys = rotate(keys[:, :, end:length])
            moved_values = values[:, :, end:length].clone()
            keys[:, :, start : length - count].copy_(moved_keys)
            values[:, :, start : length - count].copy_(moved_values)
            keys[:, :, length - count : length].zero_()
            values[:, :, length - count : length].zero_()
        self.length = length - count


def static_forward(
    model: Any, embeds: torch.Tensor, positions: torch.Tensor, kv: StaticKV, index: torch.Tensor
) -> torch.Tensor:
    """``model``'s decoder layers and final norm on ``embeds`` [1, L, hidden] at RoPE ``positions`` [1, L],
    writing into ``kv`` at the slots ``index`` [L] -> the last hidden states [1, L, hidden]."""
    kv.write_index = index
    mask = kv.mask(index)
    position_embeddings = model.rotary_emb(embeds, positions)
    hidden = embeds
    for layer in model.layers:
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            use_cache=True,
            position_embeddings=position_embeddings,
        )
    return model.norm(hidden)


class StepGraph:
    """``step`` (no arguments, static inputs and outputs) replayed from a CUDA graph captured at the first call
    on CUDA; run directly elsewhere or with ``capture=False``."""

    def __init__(self, step: Callable[[], None], device: torch.device, capture: bool = True) -> None:
        self.step = step
        self.device = device
        self.capture = capture and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        self.captures = 0

    def __call__(self) -> None:
        self.calls += 1
        if not self.capture:
            self.step()
            return
        if self.graph is None:
            self.graph = self._capture()
        self.graph.replay()

    def _capture(self) -> torch.cuda.CUDAGraph:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.step()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()
        self.captures += 1
        return graph

    @property
    def replays(self) -> int:
        return self.calls if self.capture else 0


class StaticLlmStream(LlmStream):
    """:class:`.live_model.LlmStream` on a :class:`StaticKV` of ``capacity`` tokens (see the module docstring)."""

    def __init__(
        self, llm: Any, settings: DecodeSettings, window: WindowSettings, capacity: int, capture: bool = True
    ) -> None:
        config = llm.config
        device = llm.lm_head.weight.device
        dtype = llm.lm_head.weight.dtype
        self.kv = StaticKV(
            config.num_hidden_layers,
            config.num_key_value_heads,
            config.head_dim,
            capacity,
            dtype,
            device,
            additive_mask=False,
        )
        self.step_embeds = torch.zeros(1, 1, config.hidden_size, dtype=dtype, device=device)
        self.step_logits = torch.zeros(1, config.vocab_size, dtype=dtype, device=device)
        self.step_hidden = torch.zeros(1, 1, config.hidden_size, dtype=dtype, device=device)
        super().__init__(llm, settings, window)
        self.graph = StepGraph(self._step, device, capture)

    def reset(self) -> None:
        super().reset()
        self.kv.clear()

    def cache_length(self) -> int:
        return self.kv.length

    def _step(self) -> None:
        index = self.kv.step_index
        hidden = static_forward(self.llm.model, self.step_embeds, index[None], self.kv, index)
        self.step_hidden.copy_(hidden)
        self.step_logits.copy_(self.llm.lm_head(hidden)[:, -1])

    def feed(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`.live_model.LlmStream.feed`; one token: a graph step, several: eagerly on the cache."""
        count = embeds.shape[0]
        self.kv.reserve(count)
        past = self.kv.length
        if count == 1:
            self.step_embeds.copy_(embeds[None])
            self.kv.step_index.fill_(past)
            self.graph()
            self.kv.length = past + 1
            return self.step_logits.clone(), self.step_hidden.clone()
        index = torch.arange(past, past + count, device=embeds.device)
        hidden = static_forward(self.llm.model, embeds[None], index[None], self.kv, index)
        self.kv.length = past + count
        last = hidden[:, -1:]
        return self.llm.lm_head(last)[:, -1], last

    def drop_unit(self, unit: UnitSpan) -> None:
        keep, cut = self.system_length, unit.length
        self.kv.drop(keep, cut, lambda keys: rotate_keys(keys, keep + cut, keep, self.rope_theta))
        self.dropped_units += 1
        self.dropped_tokens += cut


class StaticSpeechBackbone:
    """The TTS backbone and head on a :class:`StaticKV` of ``capacity`` tokens, a
    :class:`.live_model.SpeechBackbone` (see the module docstring); :meth:`clear` starts a turn afresh."""

    def __init__(self, tts: SpeechTokenModel, capacity: int, capture: bool = True) -> None:
        config = tts.model.config
        weight = tts.emb_text.weight
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.tts = tts
        self.kv = StaticKV(
            config.num_hidden_layers,
            config.num_key_value_heads,
            head_dim,
            capacity,
            weight.dtype,
            weight.device,
            additive_mask=True,
        )
        self.step_embeds = torch.zeros(1, 1, config.hidden_size, dtype=weight.dtype, device=weight.device)
        self.step_position = torch.zeros(1, dtype=torch.long, device=weight.device)
        self.step_logits = torch.zeros(1, TTS_AUDIO_TOKENS, dtype=torch.float32, device=weight.device)
        self.graph = StepGraph(self._step, weight.device, capture)

    def clear(self) -> None:
        self.kv.clear()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with parametrize.cached():
            return self.tts.head_code[0](hidden[:, -1:])[:, -1].float()

    def _step(self) -> None:
        index = self.kv.step_index
        hidden = static_forward(self.tts.model, self.step_embeds, self.step_position[None], self.kv, index)
        self.step_logits.copy_(self._logits(hidden))

    def forward(self, inputs_embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        count = inputs_embeds.shape[1]
        self.kv.reserve(count)
        past = self.kv.length
        if count == 1:
            self.step_embeds.copy_(inputs_embeds)
            self.step_position.copy_(positions)
            self.kv.step_index.fill_(past)
            self.graph()
            self.kv.length = past + 1
            return self.step_logits.clone()
        index = torch.arange(past, past + count, device=inputs_embeds.device)
        hidden = static_forward(self.tts.model, inputs_embeds, positions[None], self.kv, index)
        self.kv.length = past + count
        return self._logits(hidden)
