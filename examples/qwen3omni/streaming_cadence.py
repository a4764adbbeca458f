"""Qwen3-Omni Code2Wav's OPT-IN true-streaming mode under DuplexCadence (never the default).

`stdlib/models/qwen3_omni_code2wav_streaming.clock` declares the state ``streaming.StreamingCode2Wav``
carries (8 x 2 sliding-window KV regions of 71 codes, 16 causal-conv carries, 4 transposed-conv
frames, the position counter) and one stage that fires once per code. The stage's hook hands the
arena's views to ``streaming.stream_step``, the same function the eager class runs, and returns
the new versions; the runtime keeps their retained part at the regions' fixed addresses.

What it equals: ``StreamingCode2Wav`` stepped one code at a time, ``torch.equal`` (same function,
same shapes, same kernels; on CUDA the graphs replay the eager kernels). Not the stock chunked
decode (it keeps the whole context the chunked decode throws away), and not bit-for-bit the eager
class stepped per second: 12 or 13 codes per call run other kernel shapes, so those two agree up to
rounding only (both are the whole-utterance forward up to rounding).

``StreamingSecondDecoder`` steps a session through a duplex second's 12 or 13 codes and returns the
second's samples, aligned like ``StockSecondDecoder(corrected=True)``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import attrs
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Program
from duplexcadence.examples.qwen3omni.model import Qwen3OmniMoeCode2Wav
from duplexcadence.examples.qwen3omni.streaming import (
    CONV_CARRY_REGIONS,
    FRAME_CARRY_REGIONS,
    check_streamable,
    prefilled_cache,
    sliding_layers,
    stream_step,
)
from duplexcadence.interpreter.runtime.runtime import Runtime

STAGE = "stream"
_DTYPE_NAMES = {torch.float32: ("f32", 4), torch.bfloat16: ("bf16", 2), torch.float16: ("f16", 2)}


def clock_path() -> Path:
    return Path(
        str(resources.files("duplexcadence").joinpath("stdlib", "models", "qwen3_omni_code2wav_streaming.clock"))
    )


def program_for(dtype: torch.dtype, batch_size: int = 1) -> Program:
    """The checked program with every f32 region retyped to the model's dtype (`.clock` dtypes are literal)."""
    program = load_program(clock_path(), {"B": str(batch_size)})
    name, itemsize = _DTYPE_NAMES[dtype]
    if name == "f32":
        return program
    regions = {
        key: attrs.evolve(region, dtype=name, itemsize=itemsize) if region.dtype == "f32" else region
        for key, region in program.regions.items()
    }
    return attrs.evolve(program, regions=regions)


def make_hook(program: Program, layers: int):
    """The stage's hook: named views in, new versions out, in the stage's declared order."""
    accesses = program.stages[STAGE].accesses
    takes = [access.region for access in accesses if access.kind in ("read", "update")]
    gives = [access.region for access in accesses if access.kind in ("update", "write")]

    def code2wav_stream(model: Qwen3OmniMoeCode2Wav, *views: torch.Tensor) -> tuple[torch.Tensor, ...]:
        held = dict(zip(takes, views, strict=True))
        codes, position = held["codes"], held["position"]
        count = codes.shape[-1]
        position_ids = (position + torch.arange(count, device=codes.device))[None]  # [1, n], like eager's arange
        cache = prefilled_cache(
            model, [held[f"keys[{i}]"] for i in range(layers)], [held[f"values[{i}]"] for i in range(layers)]
        )
        conv_carries = {path: held[region] for path, region in CONV_CARRY_REGIONS.items()}
        frame_carries = {path: held[region] for path, region in FRAME_CARRY_REGIONS.items()}
        wav = stream_step(model, codes, position_ids, cache, conv_carries, frame_carries)
        new = {"wav": wav, "position": position + count}
        for i, layer in enumerate(sliding_layers(cache)):
            assert layer.keys is not None and layer.values is not None  # prefilled_cache filled every layer
            new[f"keys[{i}]"], new[f"values[{i}]"] = layer.keys, layer.values
        new.update({region: conv_carries[path] for path, region in CONV_CARRY_REGIONS.items()})
        new.update({region: frame_carries[path] for path, region in FRAME_CARRY_REGIONS.items()})
        return tuple(new[name] for name in gives)

    return code2wav_stream


def load_streaming_runtime(
    model: Qwen3OmniMoeCode2Wav,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    sessions: int = 1,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
) -> Runtime:
    """The runtime of the opt-in streaming mode on `model` (one instant per code; see module doc)."""
    check_streamable(model)
    device = device or next(model.parameters()).device
    program = program_for(next(model.parameters()).dtype, batch_size)
    hook = make_hook(program, model.config.num_hidden_layers)
    return Runtime.load(
        program,
        model,
        device=device,
        hooks={"code2wav_stream": hook},
        sessions=sessions,
        graphs=graphs,
        max_graphs=max_graphs,
    )


class StreamingSecondDecoder:
    """A session of the streaming runtime stepped one duplex second at a time.

    ``step(new_codes [B, 16, n])`` runs the n instants (one per code) and returns the concatenated
    samples: ``n * 1920`` (``- 555`` in the first second), the alignment of
    ``StockSecondDecoder(corrected=True)`` and of ``StreamingCode2Wav``.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.session = runtime.session()

    def reset(self) -> None:
        self.session.reset()

    def step(self, new_codes: torch.Tensor) -> torch.Tensor:
        pieces = [self.session.step(codes=new_codes[..., index : index + 1]) for index in range(new_codes.shape[-1])]
        return torch.cat(pieces, dim=-1)

    def close(self) -> None:
        self.session.close()
