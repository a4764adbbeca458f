"""Qwen3-Omni Code2Wav under DuplexCadence: bit-identical to the stock 1 s loop, exact shapes.

CPU (in CI): released size, fp32, 5 seconds (inputs of 12, 25, 37, 38, 37 codes: the start-up
shapes and both steady shapes). GPU (marked): graphs for every shape, fp32 and bf16.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from duplexcadence.examples.qwen3omni.bench import _Stock
from duplexcadence.examples.qwen3omni.cadence import load_runtime
from duplexcadence.examples.qwen3omni.model import build_code2wav
from duplexcadence.examples.qwen3omni.stock import second_bounds

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU


def feed(codes):
    return lambda second: {"codes": codes[..., second_bounds(second)[0] : second_bounds(second)[1]]}


def codes_for(seconds, device="cpu", batch=1):
    total = second_bounds(seconds)[1]
    return torch.randint(0, 2048, (batch, 16, total), generator=torch.Generator().manual_seed(2)).to(device)


def test_runtime_equals_the_stock_second_loop_and_keeps_its_addresses():
    runtime = load_runtime(build_code2wav(dtype=torch.float32, device="cpu", seed=1234))
    stock = _Stock(torch.float32, "cpu", 1234)
    stock.reset()
    session = runtime.session()
    pointer = session.data_ptrs()["codes"]
    inputs = feed(codes_for(5))
    history, samples = [], []
    with torch.no_grad():
        for second in range(5):
            wav = session.step(**inputs(second))
            assert torch.equal(wav, stock.step(**inputs(second))), f"second {second}"
            history.append(session.region("codes").shape[-1])
            samples.append(wav.shape[-1])
            assert session.data_ptrs()["codes"] == pointer
    assert history == [12, 25, 25, 25, 25]  # the code history kept between seconds: up to 25 codes
    # each second delivers new * 1920 - 555 samples: the stock loop's boundary gap, kept as it is
    assert samples == [12 * 1920 - 555, 13 * 1920 - 555, 12 * 1920 - 555, 13 * 1920 - 555, 12 * 1920 - 555]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_graphs_for_every_shape_bit_identical(dtype):
    runtime = load_runtime(build_code2wav(dtype=dtype, device="cuda", seed=1234), device="cuda")
    report = runtime.verify(_Stock(dtype, "cuda", 1234), feed(codes_for(12, "cuda")), ticks=12, deterministic=True)
    assert report.equal, str(report)
    assert report.runtime_counters.eager_planned == 0 and report.runtime_counters.eager_off_plan == 0
    assert runtime.report().stage_graphs_covered == 4
