"""One Mimi decode frame as three stages with exactly the arithmetic of ``MimiModel.decode``.

moshi 0.2.13 ``models/compression.py`` ``MimiModel.decode(codes)`` in streaming mode does:

1. ``emb = self.decode_latent(codes)``: ``SplitResidualVectorQuantizer.decode``: codebook 0 through
   ``rvq_first`` (``F.embedding`` on the cached ``_embedding`` table, rearrange to ``[B, 256, T]``,
   1x1 ``output_proj`` conv to 512), the other K-1 through ``rvq_rest`` (a zero scalar plus one
   lookup per codebook, then its own ``output_proj``), summed in place (``quantized += ...``).
2. ``emb = self._to_encoder_framerate(emb)``: with the released config (``resample_method="conv"``,
   12.5 Hz -> 25 Hz) this is ``self.upsample`` = ``ConvTrUpsample1d`` (learnt, so no rearrange or
   normalisation): a depthwise ``StreamingConvTranspose1d(512, 512, k=4, s=2, groups=512,
   bias=False)``. Output ``[B, 512, 2]`` is a slice view of a ``[B, 512, 4]`` tensor.
3. ``(emb,) = state.graphed_tr_dec(emb)``: moshi's ``CUDAGraphed`` over ``decoder_transformer``
   (a ``ProjectedTransformer`` with ``conv_layout``: ``transpose(1, 2)``, no input projection,
   8 layers, identity output projection, ``transpose(1, 2)`` back). On CPU the wrapper just calls
   the module. Output ``[B, 512, 2]`` is a transposed (non-contiguous) view.
4. ``out = state.graphed_decoder(emb).clone()``: ``CUDAGraphed`` over the SEANet decoder, then a
   ``clone`` (the graph's output buffer is reused by the next replay). ``[B, 1, 1920]``.

The stage functions call the same modules in the same order, so their streaming state (held by the
modules, created by ``mimi.streaming(B)``) advances exactly as in ``decode``. They must run inside
``mimi.streaming(B)`` (or with equivalent states installed); outside streaming the modules would
take their non-streaming (whole-sequence) branches. Neither stage boundary depends on memory layout:
the transformer's first op on its input is a LayerNorm (which reads a contiguous copy) plus an
elementwise residual, and SEANet's first conv concatenates its carry in front of the input, so a
runtime may copy stage outputs into contiguous buffers without changing a bit (tested).

The CUDA graphs of stock moshi (``graphed_tr_dec``, ``graphed_decoder``) are bypassed here: these
functions are what a runtime captures itself. With ``NO_TORCH_COMPILE`` unset, the transformer's
``apply_rope`` is torch-compiled on CUDA both here and in stock; see :mod:`.model`.
"""

from __future__ import annotations

import torch


def decode_codes_to_latent(mimi, codes: torch.Tensor) -> torch.Tensor:
    """Stage (a): codes int64 ``[B, K, 1]`` -> upsampled latent ``[B, 512, 2]`` (steps 1-2 above).

    Advances ``upsample.convtr``'s ``partial`` carry.
    """
    latent = mimi.decode_latent(codes)
    return mimi._to_encoder_framerate(latent)


def run_decoder_transformer(mimi, latent: torch.Tensor) -> torch.Tensor:
    """Stage (b): latent ``[B, 512, 2]`` -> latent ``[B, 512, 2]`` through the decoder transformer.

    Advances the 8 ring KV caches and the offsets. Returns the module's transposed view.
    """
    (latent,) = mimi.decoder_transformer(latent)
    return latent


def run_seanet_decoder(mimi, latent: torch.Tensor) -> torch.Tensor:
    """Stage (c): latent ``[B, 512, 2]`` -> PCM ``[B, 1, 1920]`` through the SEANet decoder, cloned
    as ``MimiModel.decode`` does. Advances every conv ``previous`` / convtr ``partial`` carry."""
    return mimi.decoder(latent).clone()


def decode_frame_by_stages(mimi, codes: torch.Tensor, contiguous_boundaries: bool = False) -> torch.Tensor:
    """Stages (a), (b), (c) chained: the same PCM as ``mimi.decode(codes)`` inside ``mimi.streaming``.

    With ``contiguous_boundaries`` each stage output is first copied to a fresh contiguous tensor,
    as a runtime handing stage outputs through its own buffers would.
    """
    latent = decode_codes_to_latent(mimi, codes)
    if contiguous_boundaries:
        latent = latent.contiguous().clone()
    latent = run_decoder_transformer(mimi, latent)
    if contiguous_boundaries:
        latent = latent.contiguous().clone()
    return run_seanet_decoder(mimi, latent)
