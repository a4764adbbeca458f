"""Qwen3-Omni's Code2Wav tail at its released size, with seeded random weights.

The module is transformers' ``Qwen3OmniMoeCode2Wav`` (transformers 5.17.0,
``transformers/models/qwen3_omni_moe/modeling_qwen3_omni_moe.py``), built from the default
``Qwen3OmniMoeCode2WavConfig``: 16 codebooks of 2048 codes at 12.5 Hz, an 8-layer sliding-window
(72) transformer, two x2 upsampling stages and a causal conv decoder (x8, x5, x4, x3), 1920 samples
per code at 24 kHz, 216 016 577 parameters. No checkpoint can be downloaded here, so the weights are
the class's own ``_init_weights`` after a fixed seed.

Besides the builder this module holds the length arithmetic of one forward (``output_length``,
``forward_sample_deficit``) and ``forward_for_capture``, the stock forward's computation written so
that a CUDA-graph capture records the same kernels as eager.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2Wav,
)

__all__ = [
    "CODE_RATE_HZ",
    "SAMPLE_RATE_HZ",
    "Qwen3OmniMoeCode2Wav",
    "Qwen3OmniMoeCode2WavConfig",
    "build_code2wav",
    "forward_for_capture",
    "forward_sample_deficit",
    "output_length",
    "samples_per_code",
    "sliding_window_mask",
]

CODE_RATE_HZ = 12.5
SAMPLE_RATE_HZ = 24_000
RELEASED_PARAMETER_COUNT = 216_016_577


def build_code2wav(
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 1234,
    config: Qwen3OmniMoeCode2WavConfig | None = None,
) -> Qwen3OmniMoeCode2Wav:
    """Build Code2Wav (released size unless ``config`` is given) with seeded weights, in eval mode.

    The weights are drawn on the CPU by the class's stock ``_init_weights`` right after
    ``torch.manual_seed(seed)``, so every machine gets the same weights; the module is then moved
    to ``device`` without a dtype change. ``_from_config(dtype=...)`` is the mechanism the stock
    ``from_pretrained(dtype=...)`` path uses: in bf16 the rope ``inv_freq`` buffer stays float32 and
    ``code_offset`` stays int64, as in the released checkpoint's path. Nothing is refilled: the
    stock init (N(0, 0.02) weights, zero biases, SnakeBeta log-parameters 0, LayerScale 0.01,
    ConvNeXt gamma 1e-6) already gives a waveform of RMS about 0.45.
    """
    torch.manual_seed(seed)
    model = Qwen3OmniMoeCode2Wav._from_config(config or Qwen3OmniMoeCode2WavConfig(), dtype=dtype)
    return model.to(device=device).eval()


def samples_per_code(model: Qwen3OmniMoeCode2Wav) -> int:
    """Output samples per code at full length: the product of all upsampling factors (1920)."""
    return int(model.total_upsample)


def _causal_conv_length(conv: Qwen3OmniMoeCausalConvNet, length: int) -> int:
    """Output length of ``Qwen3OmniMoeCausalConvNet``: left pad ``padding``, right pad its 'extra'."""
    frames = (length - conv.kernel_size + conv.padding) / conv.stride + 1
    extra = (math.ceil(frames) - 1) * conv.stride + (conv.kernel_size - conv.padding) - length
    return (length + conv.padding + extra - conv.kernel_size) // conv.stride + 1


def _trans_conv_length(trans: Qwen3OmniMoeCausalTransConvNet, length: int) -> int:
    """Output length of ``Qwen3OmniMoeCausalTransConvNet``: full transposed conv, trimmed on both sides."""
    (kernel,), (stride,) = trans.conv.kernel_size, trans.conv.stride
    return (length - 1) * stride + kernel - trans.left_pad - trans.right_pad


def _length_stages(
    model: Qwen3OmniMoeCode2Wav,
) -> list[Qwen3OmniMoeCausalConvNet | Qwen3OmniMoeCausalTransConvNet]:
    """The length-changing or padding convs of one forward, in execution order."""
    return [
        module
        for module in (*model.upsample.modules(), *model.decoder.modules())
        if isinstance(module, (Qwen3OmniMoeCausalConvNet, Qwen3OmniMoeCausalTransConvNet))
    ]


def output_length(model: Qwen3OmniMoeCode2Wav, num_codes: int) -> int:
    """Samples returned by one forward on ``num_codes`` codes, from the convs' own length arithmetic.

    Every causal conv here has stride 1 and keeps the length. Each transposed conv of kernel k and
    stride s returns ``(L - 1) * s + k`` samples and trims ``k - s`` on each side, i.e. it returns
    ``L * s - (k - s)``: the upsampler's (k == s == 2) lose nothing, the decoder's (k == 2s) lose
    ``s`` samples, i.e. one input frame, because their last output frame would need the next frame.
    """
    length = num_codes
    for stage in _length_stages(model):
        if isinstance(stage, Qwen3OmniMoeCausalTransConvNet):
            length = _trans_conv_length(stage, length)
        else:
            length = _causal_conv_length(stage, length)
    return length


def forward_sample_deficit(model: Qwen3OmniMoeCode2Wav) -> int:
    """How many samples one forward returns fewer than ``num_codes * samples_per_code``.

    Independent of the number of codes: at the released size 8*60 + 5*12 + 4*3 + 3 = 555 samples
    (23.1 ms at 24 kHz), one frame at each decoder rate scaled by the later upsampling factors.
    """
    return samples_per_code(model) - output_length(model, 1)


def sliding_window_mask(batch: int, length: int, window: int, device: torch.device) -> torch.Tensor | None:
    """The sliding-window attention mask that the eager forward uses for ``length`` tokens.

    Equal in value, dtype (bool), shape and strides ([1, 1, T, T] expanded to [B, 1, T, T]) to what
    transformers' ``create_sliding_window_causal_mask`` returns outside tracing for one
    unpadded sequence with positions 0..T-1: ``None`` below the window (SDPA then runs with
    ``is_causal=True``), otherwise ``kv <= q and kv > q - window``. Built from device-side
    ``arange`` only: no host sync.
    """
    if length < window:
        return None
    query = torch.arange(length, device=device)[None, None, :, None]
    key = torch.arange(length, device=device)[None, None, None, :]
    allowed = (key > query - window) & (key <= query)
    return allowed.expand(batch, -1, length, length)


def forward_for_capture(model: Qwen3OmniMoeCode2Wav, codes: torch.Tensor) -> torch.Tensor:
    """``model(codes)`` computed with the same kernels and values, without host syncs.

    The stock forward (``Qwen3OmniMoeCode2Wav.forward``) lets its transformer build the attention
    masks on every call. That mask builder (``masking_utils._preprocess_mask_arguments`` ->
    ``find_packed_sequence_indices``) checks the position ids for packed sequences with a
    data-dependent ``.all()``: 2 host syncs per call. Under CUDA-stream capture transformers'
    ``is_tracing()`` is true, so the builder skips that check but also declines the ``is_causal``
    shortcut, and the capture records a [B, 1, T, T] masked-attention path (+75-90 kernels) that
    eager never runs.

    Here the transformer gets the masks it would compute eagerly, prepared up front as the
    ``{layer_type: mask}`` mapping that ``Qwen3OmniMoeCode2WavTransformerModel.forward`` accepts
    instead of building its own. Everything else is the stock forward's own sequence of submodule
    calls: code embedding of ``codes + code_offset`` averaged over the 16 codebooks, the
    transformer (positions 0..T-1 from a device ``arange``, rotary, 8 layers, final norm), the
    upsampler, the decoder, the clamp. No python branch depends on tensor values or on whether a
    capture is running.
    """
    config = model.config
    if codes.shape[1] != config.num_quantizers:
        raise ValueError(f"Expected {config.num_quantizers} codebooks, got {codes.shape[1]}")
    if any(layer_type != "sliding_attention" for layer_type in config.layer_types):
        raise ValueError(f"forward_for_capture handles sliding-attention layers only, got {config.layer_types}")
    hidden = model.code_embedding(codes + model.code_offset).mean(1)
    batch, length = hidden.shape[:2]
    masks = {"sliding_attention": sliding_window_mask(batch, length, config.sliding_window, hidden.device)}
    hidden = model.pre_transformer(inputs_embeds=hidden, attention_mask=masks).last_hidden_state
    hidden = hidden.permute(0, 2, 1)
    for stage in model.upsample:
        for block in cast(torch.nn.ModuleList, stage):  # each upsampling stage is a ModuleList of blocks
            hidden = block(hidden)
    for block in model.decoder:
        hidden = block(hidden)
    return hidden.clamp(min=-1, max=1)
