"""PersonaPlex's stock Mimi decode loop, reproduced on the modules of moshi 0.2.13.

PersonaPlex (NVIDIA/personaplex @ 3428dfd) ships a vendored old moshi (``moshi/moshi``, version
0.1.0) whose streaming state handling differs from moshi 0.2.13. This module is
an independent reimplementation of that handling: it reads the parameters of a moshi 0.2.13
``MimiModel`` (same architecture, same parameter names) but runs its own streaming forward
functions with its own state objects, so the moshi 0.2.13 modules are never put in streaming
mode by it. README.md maps every piece to the upstream file and function it follows.

What the old handling does, per decode tick:

- causal convs (``StreamingConv1d`` + ``RawStreamingConv1d``): on the first call after start or
  reset, left-pad ``k_eff - stride`` zeros once (``padding_to_add``); afterwards the carry
  ``previous`` (``None`` at start) is ``torch.cat``-ed in front of the input and replaced by the
  view ``input[..., consumed:]`` of that new tensor: a new address every tick. Kernel-1 convs
  keep a zero-length view, and the ``cat`` still copies their input.
- transposed convs (``RawStreamingConvTranspose1d``): ``partial`` is ``None`` at start, then the
  view ``out[..., OT - (k - s):]`` of this tick's output (which keeps the whole output alive);
  the next tick adds ``partial - bias`` into its first ``k - s`` samples.
- residual blocks add through ``StreamingAdd``, whose ``previous_x/previous_y`` carries are
  zero-length views in steady state (the two branches always have equal length here).
- decoder transformer: ``RingKVCache`` with one ``end_offset`` of shape ``[1]`` shared by the
  batch, written with ``index_copy_``; ``offset`` ``[1]`` advanced with ``add_``; no exec mask.
  Positions are derived from ``end_offset`` *after* the write, which labels the oldest slot of a
  full ring with a future position, so that slot is always masked (see :class:`RingKVCache`).
- graphs / compile: only the decoder transformer is wrapped in moshi's ``CUDAGraphed`` (CUDA
  only; eager first call, capture on the second); the SEANet decoder runs eagerly under
  ``no_compile()``; rope is ``torch_compile_lazy``-wrapped exactly like moshi's (so
  ``NO_TORCH_COMPILE`` controls it identically) and, as upstream, compile is off on CPU.
- the server (``moshi/moshi/server.py``) keeps two Mimi instances, ``mimi`` and ``other_mimi``,
  loaded from the same checkpoint; every tick both decode ``tokens[:, 1:9]``
  (:class:`PersonaPlexTail`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math

import torch
import torch.nn.functional as F
from einops import rearrange
from moshi.modules.conv import StreamingConv1d, StreamingConvTranspose1d
from moshi.modules.seanet import SEANetResnetBlock
from moshi.modules.transformer import StreamingMultiheadAttention, StreamingTransformerLayer
from moshi.utils.compile import CUDAGraphed, no_compile, torch_compile_lazy


@dataclasses.dataclass
class ConvCarry:
    """State of one old-moshi causal conv: pending left padding and the input carry."""

    initial_padding: int
    padding_to_add: int
    previous: torch.Tensor | None = None

    def reset(self) -> None:
        self.padding_to_add = self.initial_padding
        self.previous = None


@dataclasses.dataclass
class ConvTransposeCarry:
    """State of one old-moshi transposed conv: the overlap tail of the last output (bias included)."""

    partial: torch.Tensor | None = None

    def reset(self) -> None:
        self.partial = None


@dataclasses.dataclass
class AddCarry:
    """State of one old-moshi ``StreamingAdd``: the unmatched tails of both branches."""

    previous_x: torch.Tensor | None = None
    previous_y: torch.Tensor | None = None

    def reset(self) -> None:
        self.previous_x = None
        self.previous_y = None


class RingKVCache:
    """Old-moshi ring KV cache: ``[2, B, H, capacity, D]`` plus one ``end_offset`` ``[1]`` for the batch.

    After writing ``T`` steps at ``(end_offset + t) % capacity`` and advancing ``end_offset``, slot
    ``i`` is given position ``end_offset + (i - end_offset % capacity)``, minus ``capacity`` when
    ``i`` lies after ``end_offset % capacity``. Slot ``end_offset % capacity`` itself therefore gets
    position ``end_offset``, one step in the future of every query, and is masked. Once the ring is
    full that slot holds the oldest step (``end_offset - capacity``): the attention then sees at
    most ``capacity - 1`` past steps, one fewer than moshi 0.2.13, which labels that slot correctly.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        dim_per_head: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.capacity = capacity
        self.cache = torch.zeros((2, batch_size, num_heads, capacity, dim_per_head), device=device, dtype=dtype)
        self.end_offset = torch.zeros(1, device=device, dtype=torch.long)

    def reset(self) -> None:
        self.end_offset.zero_()

    def complete(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write ``k, v`` ``[B, H, T, D]``; return all keys, all values and their positions ``[capacity]``."""
        steps = k.shape[2]
        write_at = (
            torch.arange(steps, device=self.end_offset.device, dtype=self.end_offset.dtype) + self.end_offset
        ) % self.capacity
        self.cache[0].index_copy_(2, write_at, k)
        self.cache[1].index_copy_(2, write_at, v)
        self.end_offset.add_(steps)

        slots = torch.arange(self.capacity, device=self.end_offset.device, dtype=torch.long)
        never_written = slots >= self.end_offset
        delta = slots - self.end_offset % self.capacity
        positions = torch.where(delta <= 0, self.end_offset + delta, self.end_offset + delta - self.capacity)
        positions = torch.where(never_written, torch.full_like(positions, -1), positions)
        return self.cache[0], self.cache[1], positions


@dataclasses.dataclass
class AttentionCarry:
    """State of one old-moshi self-attention: its KV ring and rope offset (``[1]``, shared by the batch)."""

    kv_cache: RingKVCache
    offset: torch.Tensor
    offset_cpu: int = 0

    def reset(self) -> None:
        self.kv_cache.reset()
        self.offset.zero_()
        self.offset_cpu = 0


@dataclasses.dataclass
class LayerCarry:
    """State of one old-moshi transformer layer: a host step counter."""

    offset_cpu: int = 0

    def reset(self) -> None:
        self.offset_cpu = 0


@dataclasses.dataclass
class TransformerCarry:
    """State of the old-moshi ``StreamingTransformer``: its offset ``[1]``."""

    offset: torch.Tensor

    def reset(self) -> None:
        self.offset.zero_()


Carry = ConvCarry | ConvTransposeCarry | AddCarry | AttentionCarry | LayerCarry | TransformerCarry
"""Any of the decoder's state objects (each resets itself as old moshi's ``reset_streaming``)."""


@torch_compile_lazy
def apply_rope_interleaved(
    q: torch.Tensor, k: torch.Tensor, offset: torch.Tensor, max_period: float = 10_000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Old-moshi rope on ``[B, H, T, D]`` with interleaved (real, imaginary) pairs.

    Angles are ``(offset + t) * max_period ** (-2j / D)`` in float32, one row per time step
    broadcast over batch and heads (the old code's ``ts.view(1, -1, 1)``).
    """
    *_, steps, dim = q.shape
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=q.device, dtype=torch.float32) * (-math.log(max_period) * 2 / dim))
    times = (offset.float() + torch.arange(steps, device=q.device, dtype=torch.float32)).view(1, -1, 1)
    cos = torch.cos(freqs * times)
    sin = torch.sin(freqs * times)
    leading = q.shape[:-1]
    q_pairs = q.view(*leading, half, 2)
    k_pairs = k.view(*leading, half, 2)
    q_re, q_im = q_pairs[..., 0].float(), q_pairs[..., 1].float()
    k_re, k_im = k_pairs[..., 0].float(), k_pairs[..., 1].float()
    q_out_re = q_re * cos - q_im * sin
    q_out_im = q_re * sin + q_im * cos
    k_out_re = k_re * cos - k_im * sin
    k_out_im = k_re * sin + k_im * cos
    q_out = torch.stack([q_out_re.to(q.dtype), q_out_im.to(q.dtype)], dim=-1)
    k_out = torch.stack([k_out_re.to(q.dtype), k_out_im.to(q.dtype)], dim=-1)
    return q_out.view(*leading, dim), k_out.view(*leading, dim)


def _check_supported(mimi) -> None:
    """Reject configurations the reproduction does not cover (the released Mimi is covered)."""
    if not getattr(mimi.upsample, "learnt", False):
        raise ValueError("only the learnt ConvTrUpsample1d of the released Mimi is reproduced")
    transformer = mimi.decoder_transformer.transformer
    if transformer.positional_embedding != "rope" or not transformer.rope.interleave:
        raise ValueError("only interleaved rope positions (the released Mimi) are reproduced")
    for layer in transformer.layers:
        attn = layer.self_attn
        if layer.gating is not None or layer.cross_attention is not None or layer.skip_self_attn:
            raise ValueError("only plain FFN self-attention layers (the released Mimi) are reproduced")
        if attn.kv_repeat != 1 or attn.weights_per_step or not attn.causal or attn.context is None:
            raise ValueError("only causal, single-projection attention with a context is reproduced")
    for module in mimi.decoder.modules():
        if isinstance(module, StreamingConv1d) and module.pad_mode != "constant":
            raise ValueError("only constant-padded SEANet decoder convs are reproduced")


class PersonaPlexMimiDecoder:
    """One Mimi instance decoding under PersonaPlex's (old-moshi) streaming state handling.

    ``mimi`` is a moshi 0.2.13 ``MimiModel``; only its parameters and leaf modules are used, and
    all streaming state lives in this object (created here, as old moshi's ``streaming_forever``).
    ``graph_transformer`` wraps the decoder transformer in moshi's ``CUDAGraphed`` (default: on
    CUDA devices, like upstream; the ``NO_CUDA_GRAPH`` environment variable is honoured by it).
    """

    def __init__(self, mimi, batch_size: int = 1, graph_transformer: bool | None = None) -> None:
        _check_supported(mimi)
        self.mimi = mimi
        self.batch_size = batch_size
        parameter = next(mimi.parameters())
        self.device = parameter.device
        self.convs: dict[str, ConvCarry] = {}
        self.conv_transposes: dict[str, ConvTransposeCarry] = {}
        self.adds: dict[str, AddCarry] = {}
        for root in ("upsample", "decoder"):
            for name, module in mimi.get_submodule(root).named_modules(prefix=root):
                if isinstance(module, StreamingConv1d):
                    padding = module._effective_kernel_size - module._stride
                    self.convs[name] = ConvCarry(padding, padding)
                elif isinstance(module, StreamingConvTranspose1d):
                    self.conv_transposes[name] = ConvTransposeCarry()
                elif isinstance(module, SEANetResnetBlock):
                    self.adds[name] = AddCarry()
        transformer = mimi.decoder_transformer.transformer
        self.transformer_carry = TransformerCarry(torch.zeros(1, device=self.device, dtype=torch.long))
        self.layer_carries = [LayerCarry() for _ in transformer.layers]
        self.attention_carries: list[AttentionCarry] = []
        for layer in transformer.layers:
            attn = layer.self_attn
            weight = attn.in_projs[0].weight
            kv_cache = RingKVCache(
                batch_size,
                attn.num_heads,
                attn.embed_dim // attn.num_heads,
                attn.context,
                device=weight.device,
                dtype=weight.dtype,
            )
            self.attention_carries.append(
                AttentionCarry(kv_cache, torch.zeros(1, device=weight.device, dtype=torch.long))
            )
        if graph_transformer is None:
            graph_transformer = self.device.type == "cuda"
        self.graphed_transformer = CUDAGraphed(self._run_decoder_transformer, disable=not graph_transformer)

    # --- SEANet side (eager) -------------------------------------------------------------------

    def _conv(self, name: str, module: StreamingConv1d, x: torch.Tensor) -> torch.Tensor:
        carry = self.convs[name]
        conv = module.conv.conv
        if carry.padding_to_add > 0 and x.shape[-1] > 0:
            x = F.pad(x, (carry.padding_to_add, 0), mode="constant", value=0.0)
            carry.padding_to_add = 0
        if carry.previous is not None:
            x = torch.cat([carry.previous, x], dim=-1)
        batch, _, length = x.shape
        kernel = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1
        stride = conv.stride[0]
        frames = max(0, int(math.floor((length - kernel) / stride) + 1))
        carry.previous = x[..., frames * stride :]
        if frames == 0:
            return torch.empty(batch, conv.out_channels, 0, device=x.device, dtype=x.dtype)
        return conv(x[..., : (frames - 1) * stride + kernel])

    def _conv_transpose(self, name: str, module: StreamingConvTranspose1d, x: torch.Tensor) -> torch.Tensor:
        carry = self.conv_transposes[name]
        convtr = module.convtr.convtr
        if x.shape[-1] == 0:
            return torch.empty(x.shape[0], convtr.out_channels, 0, device=x.device, dtype=x.dtype)
        out = convtr(x)
        out_length = out.shape[-1]
        if carry.partial is not None:
            overlap = carry.partial.shape[-1]
            if convtr.bias is not None:
                out[..., :overlap] += carry.partial - convtr.bias[:, None]
            else:
                out[..., :overlap] += carry.partial
        pending = convtr.kernel_size[0] - convtr.stride[0]
        carry.partial = out[..., out_length - pending :]
        return out[..., : out_length - pending]

    def _add(self, name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        carry = self.adds[name]
        if carry.previous_x is not None:
            x = torch.cat([carry.previous_x, x], dim=-1)
        if carry.previous_y is not None:
            y = torch.cat([carry.previous_y, y], dim=-1)
        matched = min(x.shape[-1], y.shape[-1])
        carry.previous_x = x[..., matched:]
        carry.previous_y = y[..., matched:]
        return x[..., :matched] + y[..., :matched]

    def _module(self, name: str, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if isinstance(module, StreamingConv1d):
            return self._conv(name, module, x)
        if isinstance(module, StreamingConvTranspose1d):
            return self._conv_transpose(name, module, x)
        if isinstance(module, SEANetResnetBlock):
            skip = self._module(f"{name}.shortcut", module.shortcut, x)
            branch = x
            for index, child in enumerate(module.block):
                branch = self._module(f"{name}.block.{index}", child, branch)
            return self._add(name, skip, branch)
        return module(x)

    def _run_seanet_decoder(self, latent: torch.Tensor) -> torch.Tensor:
        x = latent
        for index, child in enumerate(self.mimi.decoder.model):
            x = self._module(f"decoder.model.{index}", child, x)
        return x

    # --- transformer side (the only CUDA-graphed part upstream) --------------------------------

    def _attention(self, attn: StreamingMultiheadAttention, carry: AttentionCarry, x: torch.Tensor) -> torch.Tensor:
        # _check_supported rejected attention without rope positions or a context
        assert attn.rope is not None and attn.context is not None
        steps = x.shape[1]
        weight = attn.in_projs[0].weight
        assert isinstance(weight, torch.Tensor)  # the nn.Linear's Parameter
        projected = F.linear(x, weight)
        q, k, v = rearrange(projected, "b t (p h d) -> p b h t d", p=3, h=attn.num_heads)
        q, k = apply_rope_interleaved(q, k, carry.offset, attn.rope.max_period)
        keys, values, key_positions = carry.kv_cache.complete(k, v)
        key_positions = key_positions.view(1, -1)
        query_positions = carry.offset + torch.arange(steps, device=q.device, dtype=torch.long).view(-1, 1)
        delta = query_positions - key_positions
        allowed = (key_positions >= 0) & (delta >= 0) & (delta < attn.context)
        out = F.scaled_dot_product_attention(q, keys, values, allowed, dropout_p=0.0)
        out = rearrange(out, "b h t d -> b t (h d)")
        out = attn.out_projs[0](out)
        carry.offset.add_(steps)
        carry.offset_cpu += steps
        return out

    def _layer(self, layer: StreamingTransformerLayer, index: int, x: torch.Tensor) -> torch.Tensor:
        with contextlib.ExitStack() as stack:
            if x.device.type != "cuda":
                stack.enter_context(no_compile())
            update = self._attention(layer.self_attn, self.attention_carries[index], layer.norm1(x))
            x = x + layer.layer_scale_1(update)
            assert layer.linear1 is not None and layer.linear2 is not None  # no gating: _check_supported
            update = layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
            x = x + layer.layer_scale_2(update)
            self.layer_carries[index].offset_cpu += x.shape[1]
            return x

    def _run_decoder_transformer(self, latent: torch.Tensor) -> list[torch.Tensor]:
        projected = self.mimi.decoder_transformer
        x = latent.transpose(1, 2) if projected.conv_layout else latent
        if projected.input_proj is not None:
            x = projected.input_proj(x)
        for index, layer in enumerate(projected.transformer.layers):
            x = self._layer(layer, index, x)
        self.transformer_carry.offset.add_(x.shape[1])
        outputs = []
        for output_proj in projected.output_projs:
            y = output_proj(x)
            outputs.append(y.transpose(1, 2) if projected.conv_layout else y)
        return outputs

    # --- one tick --------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode one frame: codes int64 ``[B, 8, 1]`` -> PCM ``[B, 1, 1920]`` (not cloned, as upstream)."""
        latent = self.mimi.decode_latent(codes)
        latent = self._conv_transpose("upsample.convtr", self.mimi.upsample.convtr, latent)
        (latent,) = self.graphed_transformer(latent)
        with no_compile():
            return self._run_seanet_decoder(latent)

    def reset(self) -> None:
        """Old moshi's ``reset_streaming``: carries back to ``None``/zero, graphs kept."""
        carries: list[Carry] = [
            *self.convs.values(),
            *self.conv_transposes.values(),
            *self.adds.values(),
            *self.attention_carries,
            *self.layer_carries,
            self.transformer_carry,
        ]
        for carry in carries:
            carry.reset()

    def state_tensors(self) -> dict[str, torch.Tensor | None]:
        """Every state tensor by name (``None`` where upstream holds ``None``), for address checks."""
        tensors: dict[str, torch.Tensor | None] = {}
        for name, conv in self.convs.items():
            tensors[f"{name}.previous"] = conv.previous
        for name, conv_transpose in self.conv_transposes.items():
            tensors[f"{name}.partial"] = conv_transpose.partial
        for name, add in self.adds.items():
            tensors[f"{name}.add.previous_x"] = add.previous_x
            tensors[f"{name}.add.previous_y"] = add.previous_y
        for index, attention in enumerate(self.attention_carries):
            prefix = f"decoder_transformer.transformer.layers.{index}.self_attn"
            tensors[f"{prefix}.kv_cache.cache"] = attention.kv_cache.cache
            tensors[f"{prefix}.kv_cache.end_offset"] = attention.kv_cache.end_offset
            tensors[f"{prefix}.offset"] = attention.offset
        tensors["decoder_transformer.transformer.offset"] = self.transformer_carry.offset
        return tensors


class PersonaPlexTail:
    """PersonaPlex's decode tail: two Mimi instances (``mimi``, ``other_mimi``) decode every tick.

    As in ``moshi/moshi/server.py`` ``ServerState``, both instances hold the same weights (loaded
    from one checkpoint upstream; here ``other_mimi`` defaults to a deep copy of ``mimi``, so the
    weights are held twice, as upstream) and both decode the same codes; the server sends
    ``mimi``'s PCM and discards ``other_mimi``'s.
    """

    def __init__(self, mimi, other_mimi=None, batch_size: int = 1, graph_transformers: bool | None = None) -> None:
        if other_mimi is None:
            if mimi._streaming_state is not None:
                raise ValueError("deep-copying a streaming moshi Mimi would copy its CUDA graphs; pass other_mimi")
            other_mimi = copy.deepcopy(mimi)
        self.mimi = PersonaPlexMimiDecoder(mimi, batch_size, graph_transformers)
        self.other_mimi = PersonaPlexMimiDecoder(other_mimi, batch_size, graph_transformers)

    @torch.no_grad()
    def step(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One tick: both instances decode ``codes`` ``[B, 8, 1]``; returns (main PCM, other PCM)."""
        main_pcm = self.mimi.decode(codes)
        other_pcm = self.other_mimi.decode(codes)
        return main_pcm, other_pcm

    def reset(self) -> None:
        """New conversation: ``reset_streaming`` on both instances (as the server does per client)."""
        self.mimi.reset()
        self.other_mimi.reset()
