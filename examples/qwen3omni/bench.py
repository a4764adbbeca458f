"""Qwen3-Omni's Code2Wav tail as a benchmark subject (`dsl bench qwen3omni`).

Per duplex second: the 12 or 13 new codes of each session. Variants: stock eager (transformers'
forward per second, `chunked_decode`'s arithmetic; the reference) and DuplexCadence (exact-shape
graphs for the 12, 25, 37 and 38-code inputs). `--dtype bf16` for the released checkpoint's dtype.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ...interpreter.bench import Subject, Variant
from .model import build_code2wav
from .stock import StockSecondDecoder, second_bounds

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Stock:
    def __init__(self, dtype, device, seed):
        self.decoder = StockSecondDecoder(build_code2wav(dtype=dtype, device=device, seed=seed))

    def reset(self):
        self.decoder.reset()

    def step(self, codes):
        return self.decoder.step(codes)


class _Cadence:
    def __init__(self, dtype, device, seed, batch):
        from .cadence import load_runtime

        self.runtime = load_runtime(build_code2wav(dtype=dtype, device=device, seed=seed), batch, device=device)
        self.session = self.runtime.session()

    def reset(self):
        self.session.reset()

    def step(self, codes):
        return self.session.step(codes=codes)


def subject(device: str = "cpu", seconds: int = 10, batch: int = 1, dtype: str = "fp32", seed: int = 1234,
            **_) -> Subject:
    device = torch.device(device)
    torch_dtype = DTYPES[dtype]
    total = second_bounds(seconds + 8)[1]
    codes = torch.randint(0, 2048, (batch, 16, total), generator=torch.Generator().manual_seed(seed + 1)).to(device)

    def inputs(second: int):
        start, end = second_bounds(second)
        return {"codes": codes[..., start:end]}

    cadence_info = lambda r: {"graphs": r.runtime.report().graphs_captured,  # noqa: E731
                              "stage_graphs": r.runtime.report().stage_graphs_covered,
                              "capture_seconds": r.runtime.report().capture_seconds}
    return Subject("qwen3omni", Fraction(1), inputs,
                   [Variant("stock eager", lambda: _Stock(torch_dtype, device, seed), reference=True),
                    Variant("duplexcadence", lambda: _Cadence(torch_dtype, device, seed, batch), info=cadence_info)],
                   device, description=f"Code2Wav (transformers), {dtype}, B={batch}, 1 s cadence, 25-code context",
                   warmup_ticks=2, extra={"batch": batch, "dtype": dtype})
