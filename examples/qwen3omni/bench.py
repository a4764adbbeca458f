"""Qwen3-Omni's Code2Wav tail as a benchmark subject (`dsl bench qwen3omni`).

Per duplex second: the 12 or 13 new codes of each session. Variants: stock eager (transformers'
forward per second, `chunked_decode`'s arithmetic; the reference) and DuplexCadence (exact-shape
graphs for the 12, 25, 37 and 38-code inputs). `--dtype bf16` for the released checkpoint's dtype.

With `--compile`: the stock decoder's Code2Wav forward under `torch.compile(mode="reduce-overhead",
dynamic=False)`: one specialised graph per input length (12, 25, 37, 38: four compilations, under
dynamo's recompile limit of 8). transformers' mask builder syncs with the host; how dynamo treats
that (graph break or not) is what the variant reports.

`--option streaming=1` adds the OPT-IN true-streaming mode, never part of the
default run: "streaming (eager, opt-in)" (`StreamingCode2Wav`, one call per second) and "streaming
under DuplexCadence (opt-in)" (`qwen3_omni_code2wav_streaming.clock`, one graph replay per code).
They carry the whole context that the chunked stock decode throws away, so they are not compared
for bit-identity (`compare=False`); each reports `max_abs_diff_vs_reference`, its largest
difference from stock eager on the samples both emit (the streams run 555 samples behind it).
"""

from __future__ import annotations

from fractions import Fraction

import torch

from duplexcadence.examples.qwen3omni.model import build_code2wav
from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder, second_bounds
from duplexcadence.examples.qwen3omni.streaming import StreamingCode2Wav
from duplexcadence.interpreter.bench import Subject, Variant, compiled_variant, option_flag

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
        from duplexcadence.examples.qwen3omni.cadence import load_runtime

        self.runtime = load_runtime(build_code2wav(dtype=dtype, device=device, seed=seed), batch, device=device)
        self.session = self.runtime.session()

    def reset(self):
        self.session.reset()

    def step(self, codes):
        return self.session.step(codes=codes)


class _StreamingEager:
    def __init__(self, dtype, device, seed):
        self.decoder = StreamingCode2Wav(build_code2wav(dtype=dtype, device=device, seed=seed))

    def reset(self):
        self.decoder.reset()

    def step(self, codes):
        return self.decoder.step(codes)


class _StreamingCadence:
    def __init__(self, dtype, device, seed, batch):
        from duplexcadence.examples.qwen3omni.streaming_cadence import StreamingSecondDecoder, load_streaming_runtime

        model = build_code2wav(dtype=dtype, device=device, seed=seed)
        self.runtime = load_streaming_runtime(model, batch, device=device)
        self.decoder = StreamingSecondDecoder(self.runtime)

    def reset(self):
        self.decoder.reset()

    def step(self, codes):
        return self.decoder.step(codes)


def stream_difference(tick: int, expected, found) -> float:
    """Max abs difference of a streamed second from stock eager's on the samples both emit: from
    second 1 on the stream is 555 samples behind (stock drops them at every boundary)."""
    ours, theirs = found["output"], expected["output"]
    ours = ours[..., ours.shape[-1] - theirs.shape[-1] :]
    return (ours.float() - theirs.float()).abs().max().item()


def subject(
    device: str | torch.device = "cpu",
    seconds: int = 10,
    batch: int = 1,
    dtype: str = "fp32",
    seed: int = 1234,
    streaming: str | bool = False,
    **_,
) -> Subject:
    device = torch.device(device)
    torch_dtype = DTYPES[dtype]
    total = second_bounds(seconds + 8)[1]
    codes = torch.randint(0, 2048, (batch, 16, total), generator=torch.Generator().manual_seed(seed + 1)).to(device)

    def inputs(second: int):
        start, end = second_bounds(second)
        return {"codes": codes[..., start:end]}

    def cadence_info(runner) -> dict:
        report = runner.runtime.report()
        return {
            "graphs": report.graphs_captured,
            "stage_graphs": report.stage_graphs_covered,
            "capture_seconds": report.capture_seconds,
            "arena_bytes": report.arena_bytes,
        }

    variants = [
        Variant("stock eager", lambda: _Stock(torch_dtype, device, seed), reference=True),
        Variant("duplexcadence", lambda: _Cadence(torch_dtype, device, seed, batch), info=cadence_info),
    ]
    description = f"Code2Wav (transformers), {dtype}, B={batch}, 1 s cadence, 25-code context"
    if option_flag(streaming):
        variants += [
            Variant(
                "streaming (eager, opt-in)",
                lambda: _StreamingEager(torch_dtype, device, seed),
                compare=False,
                difference=stream_difference,
            ),
            Variant(
                "streaming under DuplexCadence (opt-in)",
                lambda: _StreamingCadence(torch_dtype, device, seed, batch),
                info=cadence_info,
                compare=False,
                difference=stream_difference,
            ),
        ]
        description += "; opt-in streaming: KV window 72 + conv carries, not bit-identical to chunked decode"
    return Subject(
        "qwen3omni",
        Fraction(1),
        inputs,
        variants,
        device,
        description=description,
        warmup_ticks=2,
        tick_name="chunk",
        extra={"batch": batch, "dtype": dtype, "streaming": option_flag(streaming)},
        compile_variants=[
            compiled_variant(
                "stock step, torch.compile reduce-overhead",
                lambda: _Stock(torch_dtype, device, seed),
                install=_compile_forward,
                compile_options={"dynamic": False},
                note="Code2Wav forward compiled, one graph per input length",
            )
        ],
    )
