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
by the context that chunked decoding throws away (see NOTES.md). State layout: STATE.md.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
)

from .model import Qwen3OmniMoeCode2Wav

__all__ = ["StreamingCode2Wav"]


class StreamingCode2Wav:
    """Stateful Code2Wav decoder: ``step(new_codes [B, 16, n]) -> wav [B, 1, samples]``.

    State (reassigned every step, not in place): ``cache`` (KV per transformer layer),
    ``conv_carries`` and ``frame_carries`` keyed by the module path inside the model, and
    ``position``, the number of codes decoded so far.
    """

    def __init__(self, model: Qwen3OmniMoeCode2Wav) -> None:
        self.model = model
        for name, module in model.named_modules():
            if isinstance(module, Qwen3OmniMoeCausalConvNet) and module.stride != 1:
                raise ValueError(f"{name}: streaming assumes stride-1 causal convs")
            if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                (kernel,), (stride,) = module.conv.kernel_size, module.conv.stride
                if (kernel - stride) % stride or not module.left_pad == module.right_pad == kernel - stride:
                    raise ValueError(f"{name}: streaming assumes kernel = (c + 1) * stride trimmed by c frames")
        self.reset()

    def reset(self) -> None:
        """Start a new utterance: empty KV cache, zero conv carries, no transposed-conv overlap."""
        self.position = 0
        self.cache = DynamicCache(config=self.model.config)
        self.conv_carries: dict[str, torch.Tensor] = {}
        self.frame_carries: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, new_codes: torch.Tensor) -> torch.Tensor:
        model = self.model
        hidden = model.code_embedding(new_codes + model.code_offset).mean(1)
        count = hidden.shape[1]
        positions = torch.arange(self.position, self.position + count, device=hidden.device)[None]
        hidden = model.pre_transformer(
            inputs_embeds=hidden, position_ids=positions, past_key_values=self.cache, use_cache=True
        ).last_hidden_state
        self.position += count
        hidden = hidden.permute(0, 2, 1)
        for stage_index, stage in enumerate(model.upsample):
            for block_index, block in enumerate(stage):
                hidden = self._stream(f"upsample.{stage_index}.{block_index}", block, hidden)
        for block_index, block in enumerate(model.decoder):
            hidden = self._stream(f"decoder.{block_index}", block, hidden)
        return hidden.clamp(min=-1, max=1)

    def _stream(self, name: str, module: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
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
                hidden = self._stream(f"{name}.block.{index}", block, hidden)
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

    def _transposed_conv(
        self, name: str, trans: Qwen3OmniMoeCausalTransConvNet, hidden: torch.Tensor
    ) -> torch.Tensor:
        """The stock module on [overlap frames, new frames]; its two-sided trim then returns exactly the
        samples whose every contributing input frame has arrived."""
        (kernel,), (stride,) = trans.conv.kernel_size, trans.conv.stride
        overlap = (kernel - stride) // stride
        if overlap == 0:
            return trans(hidden)
        carry = self.frame_carries.get(name)
        extended = hidden if carry is None else torch.cat([carry, hidden], dim=-1)
        self.frame_carries[name] = extended[..., -overlap:].clone()
        return trans(extended)

    def _convnext(self, name: str, block: Qwen3OmniMoeConvNeXtBlock, hidden: torch.Tensor) -> torch.Tensor:
        """``Qwen3OmniMoeConvNeXtBlock.forward`` with its depthwise causal conv streamed."""
        residual = hidden
        hidden = self._causal_conv(f"{name}.dwconv", block.dwconv, hidden).permute(0, 2, 1)
        hidden = block.pwconv2(block.act(block.pwconv1(block.norm(hidden))))
        return residual + (block.gamma * hidden).permute(0, 2, 1)
