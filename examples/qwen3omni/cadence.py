"""Qwen3-Omni's Code2Wav tail under DuplexCadence, at the stock 1 s cadence, bit-identically.

The stock loop (`stock.StockSecondDecoder`) re-decodes each second's 12 or 13 new codes with up to
25 codes of left context and drops the context's samples. Under DuplexCadence the code history is
a region (`read codes new + left_context`: the exact 12, 25, 37, 38 ... codes at a stable address),
and the stage calls `model.forward_for_capture` (the stock forward's kernels and values without its
two host syncs), so every distinct input length replays its own exact-shape CUDA graph.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from duplexcadence.examples.qwen3omni.model import forward_for_capture, forward_sample_deficit, samples_per_code
from duplexcadence.interpreter.runtime.runtime import Runtime


def clock_path() -> Path:
    return Path(str(resources.files("duplexcadence").joinpath("stdlib", "models", "qwen3_omni_code2wav.clock")))


def make_hooks(corrected: bool = False) -> dict:
    """The stage hook; `corrected` keeps the 555 samples the stock loop loses at each boundary."""

    def code2wav_chunk(model, codes: torch.Tensor, firing) -> torch.Tensor:
        arrived = next(v.length for v in firing.views if v.kind == "feed" and v.region == "codes")
        context = codes.shape[-1] - arrived
        wav = forward_for_capture(model, codes)
        if context == 0:
            return wav
        dropped = context * samples_per_code(model) - (forward_sample_deficit(model) if corrected else 0)
        return wav[..., dropped:]

    return {"code2wav_chunk": code2wav_chunk}


def load_runtime(
    model,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    sessions: int = 1,
    corrected: bool = False,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
) -> Runtime:
    device = device or next(model.parameters()).device
    return Runtime.load(
        clock_path(),
        model,
        params={"B": batch_size},
        device=device,
        hooks=make_hooks(corrected),
        sessions=sessions,
        graphs=graphs,
        max_graphs=max_graphs,
    )
