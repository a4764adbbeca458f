"""Moshi's Mimi decoder tail under DuplexCadence: the stdlib clock bound to a streaming Mimi.

`load_runtime(mimi, batch_size)` enters moshi's streaming mode (so the state objects exist), then
binds `stdlib/models/mimi_decoder.clock` to it: every decode-path state tensor moshi keeps (8 ring
KV caches and their offsets, the upsample and SEANet carries) becomes a view in DuplexCadence's
arena, and the three stages call moshi's own modules (`stages.py`), so the arithmetic is moshi's.
moshi's `CUDAGraphed` wrappers are bypassed: the runtime captures its own per-stage graphs.

The latents between the stages are stored time-major (`[B, time, 512]`), the layout moshi itself hands
over: the hooks transpose at the boundary, so the transformer and SEANet see views with moshi's
strides. Bits do not depend on it (`stages.py`); speed does (see the clock file).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from duplexcadence.examples.moshi.stages import decode_codes_to_latent, run_decoder_transformer
from duplexcadence.interpreter.runtime.runtime import Runtime


def codes_to_time_major_latent(mimi, codes: torch.Tensor) -> torch.Tensor:
    """Stage `upsample`: codes [B, 8, 1] -> latent [B, 2, 512] (a view; the runtime copies it into `embedded`)."""
    return decode_codes_to_latent(mimi, codes).transpose(1, 2)


def time_major_decoder_transformer(mimi, latent: torch.Tensor) -> torch.Tensor:
    """Stage `transformer`: latent [B, 2, 512] -> latent [B, 2, 512], moshi's transformer on the [B, 512, 2] view."""
    return run_decoder_transformer(mimi, latent.transpose(1, 2)).transpose(1, 2)


def time_major_seanet_decoder(mimi, latent: torch.Tensor) -> torch.Tensor:
    """Stage `seanet`: latent [B, 2, 512] -> PCM [B, 1, 1920] (moshi's SEANet decoder on the [B, 512, 2] view;
    no clone: the runtime copies the PCM into its `pcm` region)."""
    return mimi.decoder(latent.transpose(1, 2))


HOOKS = {
    "mimi_codes_to_latent": codes_to_time_major_latent,
    "mimi_decoder_transformer": time_major_decoder_transformer,
    "mimi_seanet_decoder": time_major_seanet_decoder,
}


def clock_path() -> Path:
    return Path(str(resources.files("duplexcadence").joinpath("stdlib", "models", "mimi_decoder.clock")))


def load_runtime(
    mimi,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    sessions: int = 1,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
    lanes: int = 1,
) -> Runtime:
    """A runtime for `mimi`'s decode tail; `mimi` is left in moshi's streaming mode (it owns the state
    objects whose tensors the runtime replaces with arena views). `lanes`: see `Runtime.load`."""
    device = device or next(mimi.parameters()).device
    mimi.streaming_forever(batch_size)
    return Runtime.load(
        clock_path(),
        mimi,
        params={"B": batch_size},
        device=device,
        hooks=HOOKS,
        sessions=sessions,
        graphs=graphs,
        max_graphs=max_graphs,
        lanes=lanes,
    )
