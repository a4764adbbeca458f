"""Qwen3-Omni's Code2Wav tail as a benchmark subject (`dsl bench qwen3omni`).

Per duplex second: the 12 or 13 new codes of each session. Variants: stock eager (transformers'
forward per second, `chunked_decode`'s arithmetic; the reference) and DuplexCadence (exact-shape
graphs for the 12, 25, 37 and 38-code inputs). `--dtype bf16` for the released checkpoint's dtype.

With `--compile`: the stock decoder's Code2Wav forward under `torch.compile(mode="reduce-overhead",
dynamic=False)`: one specialised graph per input length (12, 25, 37, 38: four compilations, under
dynamo's recompile limit of 8). transformers' mask builder syncs with the host; how dynamo treats
that (graph break or not) is what the variant reports.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ...interpreter.bench import Subject, Variant, compiled_variant
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


def _compile_forward(runner: _Stock, compile_fn):
    decoder = runner.decoder
    model = decoder.model
    decoder.model = compile_fn(model)
    return lambda: setattr(decoder, "model", model)


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
                              "capture_seconds": r.runtime.report().capture_seconds,
                              "arena_bytes": r.runtime.report().arena_bytes}
    return Subject("qwen3omni", Fraction(1), inputs,
                   [Variant("stock eager", lambda: _Stock(torch_dtype, device, seed), reference=True),
                    Variant("duplexcadence", lambda: _Cadence(torch_dtype, device, seed, batch), info=cadence_info)],
                   device, description=f"Code2Wav (transformers), {dtype}, B={batch}, 1 s cadence, 25-code context",
                   warmup_ticks=2, extra={"batch": batch, "dtype": dtype},
                   compile_variants=[compiled_variant(
                       "stock step, torch.compile reduce-overhead", lambda: _Stock(torch_dtype, device, seed),
                       install=_compile_forward, compile_options={"dynamic": False},
                       note="Code2Wav forward compiled, one graph per input length")])
