"""Opt-in true streaming for Code2Wav: carry the state, compute only the new frames.

Not the stock behaviour and never the default. The stock loop (``stock.StockSecondDecoder``)
re-decodes 25 codes of context every second and carries nothing; this decoder carries what the
architecture needs so that each second runs the network on its 12-13 new codes only:

- the transformer's sliding-window KV: transformers' own ``DynamicCache(config=...)``, whose
  sliding layers keep the last ``sliding_window - 1 = 71`` post-rope keys and values per layer,
  with absolute positions continuing across seconds;
- each causal conv's left carry: the last ``(kernel - 1) * dilation`` samples of its input
  (zeros at the start, exactly the zero left padding of one whole forward);
- each decoder transposed conv's overlap: its last input frame (kernel ``2s``, stride ``s``: an
  output frame needs the input frame after it), so its outputs are emitted one frame late, when
  the next frame has arrived. The upsampler's transposed convs (kernel == stride) need none.

What it computes is the whole-utterance forward (one ``model(codes)`` on everything so far),
delivered in pieces: the first second gives ``n * 1920 - 555`` samples and every later one
``n * 1920``, aligned exactly like ``StockSecondDecoder(corrected=True)``. It differs from the
whole forward only by floating-point rounding (different kernel shapes), and from chunked decoding
by the context that chunked decoding throws away (README.md, which also lists the state).

The arithmetic of one step is the module-level ``stream_step``, shared with the DuplexCadence
runtime of this mode (``streaming_cadence.py``, ``stdlib/models/qwen3_omni_code2wav_streaming.clock``),
which hands it the same state as views of its arena. Two choices make that sharing exact:

- the transformer gets its sliding-window mask from ``streaming_window_mask`` (the value, shape and
  ``None``-ness transformers' own builder gives eagerly for the cache's fill; a test pins that),
  because under CUDA-stream capture the builder takes another path with other kernels, and builds
  an unused full-causal mask besides;
- the positions come in as a tensor (``position_ids``), so a captured graph can take them from a
  device counter instead of baking a host integer in.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import cast

import torch
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
)

from duplexcadence.examples.qwen3omni.model import Qwen3OmniMoeCode2Wav

__all__ = [
    "CONV_CARRY_REGIONS",
    "FRAME_CARRY_REGIONS",
    "StreamingCode2Wav",
    "check_streamable",
    "prefilled_cache",
    "sliding_layers",
    "stream_step",
    "streaming_window_mask",
]

_RATES = ("400hz", "2khz", "8khz", "24khz")  # output rate of decoder.1 .. decoder.4
_INPUT_RATES = ("50hz", "400hz", "2khz", "8khz")  # their input rate

CONV_CARRY_REGIONS: dict[str, str] = {
    "upsample.0.1.dwconv": "dwconv_25hz",
    "upsample.1.1.dwconv": "dwconv_50hz",
    "decoder.0": "conv_in",
    **{
        f"decoder.{i + 1}.block.{unit + 2}.conv1": f"res_{rate}[{unit}]"
        for i, rate in enumerate(_RATES)
        for unit in range(3)
    },
    "decoder.6": "conv_out",
}
"""Module path of every causal conv with a left carry -> its region in the streaming ``.clock``."""

FRAME_CARRY_REGIONS: dict[str, str] = {
    f"decoder.{i + 1}.block.1": f"frame_{rate}" for i, rate in enumerate(_INPUT_RATES)
}
"""Module path of every decoder transposed conv -> the region of its carried input frame."""


def check_streamable(model: Qwen3OmniMoeCode2Wav) -> None:
    """Refuse a module whose convs or layers this streaming arithmetic does not cover."""
    if any(layer_type != "sliding_attention" for layer_type in model.config.layer_types):
        raise ValueError(f"streaming handles sliding-attention layers only, got {model.config.layer_types}")
    for name, module in model.named_modules():
        if isinstance(module, Qwen3OmniMoeCausalConvNet) and module.stride != 1:
            raise ValueError(f"{name}: streaming assumes stride-1 causal convs")
        if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
            (kernel,), (stride,) = module.conv.kernel_size, module.conv.stride
            if (kernel - stride) % stride or not module.left_pad == module.right_pad == kernel - stride:
                raise ValueError(f"{name}: streaming assumes kernel = (c + 1) * stride trimmed by c frames")


def streaming_window_mask(batch: int, new: int, cached: int, window: int, device: torch.device) -> torch.Tensor | None:
    """The sliding-window mask transformers builds eagerly for ``new`` queries on ``cached`` + ``new`` keys.

    ``create_sliding_window_causal_mask`` with a ``DynamicCache`` holding ``cached`` (at most
    ``window - 1``) keys: ``None`` (SDPA's own ``is_causal`` handling) when fewer than ``window`` keys
    are attended and the step is a single query or has no cache; otherwise the band
    ``kv <= q and kv > q - window`` over positions ``cached .. cached + new - 1`` (queries) and
    ``0 .. cached + new - 1`` (keys), as [1, 1, new, cached + new] expanded to the batch. The band is
    translation invariant, so relative positions give the absolute mask's values. Device ``arange``
    only: no host sync, and the same kernels eagerly and under capture.
    """
    keys = cached + new
    if keys < window and (new == 1 or cached == 0):
        return None
    query = (torch.arange(new, device=device) + cached)[None, None, :, None]
    key = torch.arange(keys, device=device)[None, None, None, :]
    allowed = (key > query - window) & (key <= query)
    return allowed.expand(batch, -1, new, keys)


def sliding_layers(cache: DynamicCache) -> list[DynamicSlidingWindowLayer]:
    """The cache's layers: transformers' sliding-window layers (``check_streamable`` admits no other kind)."""
    layers = [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
    if len(layers) != len(cache.layers):
        kinds = sorted({type(layer).__name__ for layer in cache.layers})
        raise TypeError(f"streaming handles sliding-window cache layers only, got {', '.join(kinds)}")
    return layers


def prefilled_cache(model: Qwen3OmniMoeCode2Wav, keys: list[torch.Tensor], values: list[torch.Tensor]) -> DynamicCache:
    """transformers' ``DynamicCache`` whose sliding layers hold the given keys and values (the last
    ``window - 1`` at most, [B, kv_heads, cached, head_dim]; ``cached`` may be 0).

    Its layers' ``update`` is what runs (``torch.cat`` of the held and the new keys, the last
    ``window - 1`` kept). ``cumulative_length`` is set to the held length: only the mask builder and
    ``get_seq_length`` read it, and ``stream_step`` passes both the mask and the positions.
    """
    cache = DynamicCache(config=model.config)
    for layer, key, value in zip(sliding_layers(cache), keys, values, strict=True):
        layer.dtype, layer.device = key.dtype, key.device
        layer.keys, layer.values = key, value
        layer.is_initialized = True
        layer.cumulative_length = key.shape[-2]
    return cache


def stream_step(
    model: Qwen3OmniMoeCode2Wav,
    new_codes: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache,
    conv_carries: MutableMapping[str, torch.Tensor],
    frame_carries: MutableMapping[str, torch.Tensor],
) -> torch.Tensor:
    """One streaming step on ``new_codes`` [B, 16, n] at positions ``position_ids`` [1, n].

    Updates ``cache`` (its layers' keys and values are reassigned to the last ``window - 1``),
    ``conv_carries`` and ``frame_carries`` (entries reassigned; a missing carry is the
    start of an utterance: zeros for a conv, nothing for a transposed conv's frame; an empty frame
    counts as nothing too) and returns the new samples [B, 1, samples].
    """
    hidden = model.code_embedding(new_codes + model.code_offset).mean(1)
    batch, count = hidden.shape[:2]
    first = sliding_layers(cache)[0]
    cached = first.keys.shape[-2] if first.is_initialized and first.keys is not None else 0
    mask = streaming_window_mask(batch, count, cached, model.config.sliding_window, hidden.device)
    hidden = model.pre_transformer(
        inputs_embeds=hidden,
        attention_mask={"sliding_attention": mask},
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    hidden = hidden.permute(0, 2, 1)
    streamer = _Streamer(conv_carries, frame_carries)
    for stage_index, stage in enumerate(model.upsample):
        # each upsampling stage is a ModuleList of blocks
        for block_index, block in enumerate(cast(torch.nn.ModuleList, stage)):
            hidden = streamer.stream(f"upsample.{stage_index}.{block_index}", block, hidden)
    for block_index, block in enumerate(model.decoder):
        hidden = streamer.stream(f"decoder.{block_index}", block, hidden)
    return hidden.clamp(min=-1, max=1)


class StreamingCode2Wav:
    """Stateful Code2Wav decoder: ``step(new_codes [B, 16, n]) -> wav [B, 1, samples]``.

    State (reassigned every step, not in place): ``cache`` (KV per transformer layer),
    ``conv_carries`` and ``frame_carries`` keyed by the module path inside the model, and
    ``position``, the number of codes decoded so far. Any ``n`` works: one second (12 or 13
    codes) per step, or one code per step as the DuplexCadence runtime of this mode fires.
    """

    def __init__(self, model: Qwen3OmniMoeCode2Wav) -> None:
        check_streamable(model)
        self.model = model
        self.reset()

    def reset(self) -> None:
        """Start a new utterance: empty KV cache, zero conv carries, no transposed-conv overlap."""
        self.position = 0
        self.cache = DynamicCache(config=self.model.config)
        self.conv_carries: dict[str, torch.Tensor] = {}
        self.frame_carries: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, new_codes: torch.Tensor) -> torch.Tensor:
        count = new_codes.shape[-1]
        positions = torch.arange(self.position, self.position + count, device=new_codes.device)[None]
        wav = stream_step(self.model, new_codes, positions, self.cache, self.conv_carries, self.frame_carries)
        self.position += count
        return wav


class _Streamer:
    """The decoder's modules run on [carry, new samples]; the carries live in the two dicts."""

    def __init__(
        self, conv_carries: MutableMapping[str, torch.Tensor], frame_carries: MutableMapping[str, torch.Tensor]
    ) -> None:
        self.conv_carries = conv_carries
        self.frame_carries = frame_carries

    def stream(self, name: str, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if isinstance(module, Qwen3OmniMoeCausalConvNet):
            return self._causal_conv(name, module, hidden)
        if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
            return self._transposed_conv(name, module, hidden)
        if isinstance(module, Qwen3OmniMoeSnakeBeta):
            return module(hidden)
        if isinstance(module, Qwen3OmniMoeConvNeXtBlock):
            return self._convnext(name, module, hidden)
        if isinstance(module, Qwen3OmniMoeCode2WavDecoderResidualUnit):
            residual = hidden
            hidden = self._causal_conv(f"{name}.conv1", module.conv1, module.act1(hidden))
            hidden = self._causal_conv(f"{name}.conv2", module.conv2, module.act2(hidden))
            return hidden + residual
        if isinstance(module, Qwen3OmniMoeCode2WavDecoderBlock):
            for index, block in enumerate(module.block):
                hidden = self.stream(f"{name}.block.{index}", block, hidden)
            return hidden
        raise TypeError(f"{name}: no streaming rule for {type(module).__name__}")

    def _causal_conv(self, name: str, conv: Qwen3OmniMoeCausalConvNet, hidden: torch.Tensor) -> torch.Tensor:
        """The conv on [carry, new samples] without padding; carry the last ``padding`` input samples."""
        if conv.padding == 0:
            return conv.conv(hidden)
        carry = self.conv_carries.get(name)
        if carry is None:
            carry = hidden.new_zeros(hidden.shape[0], hidden.shape[1], conv.padding)
        extended = torch.cat([carry, hidden], dim=-1)
        self.conv_carries[name] = extended[..., -conv.padding :].clone()
        return conv.conv(extended)

    def _transposed_conv(self, name: str, trans: Qwen3OmniMoeCausalTransConvNet, hidden: torch.Tensor) -> torch.Tensor:
        """The stock module on [overlap frames, new frames]; its two-sided trim then returns exactly the
        samples whose every contributing input frame has arrived."""
        (kernel,), (stride,) = trans.conv.kernel_size, trans.conv.stride
        overlap = (kernel - stride) // stride
        if overlap == 0:
            return trans(hidden)
        carry = self.frame_carries.get(name)
        extended = hidden if carry is None or carry.shape[-1] == 0 else torch.cat([carry, hidden], dim=-1)
        self.frame_carries[name] = extended[..., -overlap:].clone()
        return trans(extended)

    def _convnext(self, name: str, block: Qwen3OmniMoeConvNeXtBlock, hidden: torch.Tensor) -> torch.Tensor:
        """``Qwen3OmniMoeConvNeXtBlock.forward`` with its depthwise causal conv streamed."""
        residual = hidden
        hidden = self._causal_conv(f"{name}.dwconv", block.dwconv, hidden).permute(0, 2, 1)
        hidden = block.pwconv2(block.act(block.pwconv1(block.norm(hidden))))
        return residual + (block.gamma * hidden).permute(0, 2, 1)
