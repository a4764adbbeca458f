"""Qwen3-Omni Code2Wav's opt-in true-streaming mode under DuplexCadence.

The runtime of `stdlib/models/qwen3_omni_code2wav_streaming.clock` fires once per code and must be
`torch.equal` to the eager `StreamingCode2Wav` stepped one code at a time (the same `stream_step`
on the same shapes). It is NOT compared for equality with the stock chunked decode: that decode
throws context away, so its max abs difference is only measured and reported.

CPU (in CI): released size, fp32, 7 s = 87 codes (the 71-code KV window fills at code 71 and stays
full for 16 codes): about 2 x 87 small steps, one 87-code forward and the 7 stock seconds, roughly
3 min on a loaded 2-core machine. GPU (marked): graphs for every shape, fp32 and bf16, B = 1 and 8.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_sliding_window_causal_mask

from duplexcadence.examples.qwen3omni.model import Qwen3OmniMoeCode2WavConfig, build_code2wav
from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder, second_bounds, split_into_seconds
from duplexcadence.examples.qwen3omni.streaming import StreamingCode2Wav, streaming_window_mask
from duplexcadence.examples.qwen3omni.streaming_cadence import StreamingSecondDecoder, load_streaming_runtime
from duplexcadence.interpreter.runtime.errors import StepError

SECONDS = 7
DEFICIT = 555


class PerCodeEager:
    """The eager streaming class stepped one code per call: what the runtime's instants must equal."""

    def __init__(self, model):
        self.streaming = StreamingCode2Wav(model)

    def reset(self):
        self.streaming.reset()

    def step(self, codes):
        return self.streaming.step(codes)


def codes_for(seconds, device="cpu", batch=1):
    """`seconds` whole seconds of seeded codes: 87 for 7 s."""
    total = second_bounds(seconds - 1)[1]
    return torch.randint(0, 2048, (batch, 16, total), generator=torch.Generator().manual_seed(5)).to(device)


def stock_difference(stream_seconds, stock_seconds) -> float:
    """Max abs difference of the streamed seconds from the stock (uncorrected) loop's seconds on the
    samples both emit: the stream is 555 samples behind the stock loop from second 1 on."""
    worst = 0.0
    for second, (ours, theirs) in enumerate(zip(stream_seconds, stock_seconds, strict=True)):
        ours = ours if second == 0 else ours[..., DEFICIT:]
        worst = max(worst, (ours.float() - theirs.float()).abs().max().item())
    return worst


@pytest.mark.parametrize("cumulative", [0, 1, 12, 25, 70, 71, 72, 87, 300])
@pytest.mark.parametrize("new", [1, 12, 13])
def test_the_explicit_mask_is_what_transformers_builds_eagerly(cumulative, new):
    config = Qwen3OmniMoeCode2WavConfig()
    config._attn_implementation = "sdpa"
    cache = DynamicCache(config=config)
    if cumulative:
        for layer in cache.layers:
            layer.update(torch.zeros(2, 16, cumulative, 64), torch.zeros(2, 16, cumulative, 64))
    cached = min(cumulative, config.sliding_window - 1)
    expected = create_sliding_window_causal_mask(
        config=config,
        inputs_embeds=torch.zeros(2, new, config.hidden_size),
        attention_mask=None,
        past_key_values=cache,
        position_ids=torch.arange(cumulative, cumulative + new)[None],
    )
    mask = streaming_window_mask(2, new, cached, config.sliding_window, torch.device("cpu"))
    if expected is None:
        assert mask is None
    else:
        assert mask is not None and mask.dtype == expected.dtype and mask.shape == expected.shape
        assert mask.stride() == expected.stride() and torch.equal(mask, expected)


@pytest.mark.models
@pytest.mark.slow
def test_runtime_equals_eager_streaming_per_code_and_is_measured_against_stock(record_property):
    model = build_code2wav(torch.float32, device="cpu", seed=1234)
    codes = codes_for(SECONDS)
    runtime = load_streaming_runtime(model)
    decoder = StreamingSecondDecoder(runtime)
    eager = PerCodeEager(model)
    pointers = decoder.session.data_ptrs()
    stream_seconds = []
    with torch.no_grad():
        for chunk in split_into_seconds(codes):
            pieces = []
            for index in range(chunk.shape[-1]):
                ours = decoder.session.step(codes=chunk[..., index : index + 1])
                assert torch.equal(ours, eager.step(chunk[..., index : index + 1])), f"code {eager.streaming.position}"
                pieces.append(ours)
            stream_seconds.append(torch.cat(pieces, dim=-1))
            assert decoder.session.data_ptrs() == pointers
    total = codes.shape[-1]
    assert total == 87 and eager.streaming.position == total
    assert decoder.session.region("position").tolist() == [total]
    assert decoder.session.region("keys[7]").shape == (1, 16, 71, 64)
    assert torch.equal(decoder.session.region("keys[3]"), eager.streaming.cache.layers[3].keys)
    assert torch.equal(decoder.session.region("res_24khz[2]"), eager.streaming.conv_carries["decoder.4.block.4.conv1"])
    assert torch.equal(decoder.session.region("frame_50hz"), eager.streaming.frame_carries["decoder.1.block.1"])
    assert [piece.shape[-1] for piece in stream_seconds] == [12 * 1920 - DEFICIT] + [
        (second_bounds(k)[1] - second_bounds(k)[0]) * 1920 for k in range(1, SECONDS)
    ]
    assert runtime.report().eager_off_plan == 0  # every instant was on the plan

    with torch.no_grad():
        whole = model(codes)  # the whole-utterance forward: what streaming computes, up to rounding
        stock = StockSecondDecoder(model)
        stock_seconds = [stock.step(chunk) for chunk in split_into_seconds(codes)]
    stream = torch.cat(stream_seconds, dim=-1)
    assert stream.shape == whole.shape
    versus_whole = (stream - whole).abs().max().item()
    versus_stock = stock_difference(stream_seconds, stock_seconds)
    versus_stock_early = stock_difference(stream_seconds[:3], stock_seconds[:3])
    record_property("max_abs_vs_whole_forward", versus_whole)
    record_property("max_abs_vs_stock_chunked", versus_stock)
    print(
        f"streaming runtime, fp32, {SECONDS} s: max abs vs whole forward {versus_whole:.3g}, "
        f"vs stock chunked decode {versus_stock:.3g} (seconds 0-2: {versus_stock_early:.3g})"
    )
    assert versus_whole < 1e-4  # rounding: a wrong carry or window gives errors of order 1
    # reported, not asserted equal: from second 3 the chunked decode has lost context (README.md: 1.1-1.4)
    assert versus_stock_early < 1e-4 and versus_stock > 0.1


@pytest.mark.models
@pytest.mark.slow
def test_session_reset_restarts_the_utterance_at_the_same_addresses():
    model = build_code2wav(torch.float32, device="cpu", seed=1234)
    codes = codes_for(1)[..., :3]
    decoder = StreamingSecondDecoder(load_streaming_runtime(model))
    pointers = decoder.session.data_ptrs()
    with torch.no_grad():
        first = decoder.step(codes)
        decoder.reset()
        assert decoder.session.region("keys[0]").shape[-2] == 0 and decoder.session.region("position").item() == 0
        again = decoder.step(codes)
    assert torch.equal(first, again) and first.shape[-1] == 3 * 1920 - DEFICIT
    assert decoder.session.data_ptrs() == pointers


@pytest.mark.models
@pytest.mark.slow
def test_finish_ends_the_utterance_with_a_whole_code_and_releases_nothing():
    """`write wav +1920 latency 555 dropped`: the last code gives 1920 samples like any other, equal to
    the eager class's, and the utterance is as long as the whole-utterance forward (T * 1920 - 555)."""
    model = build_code2wav(torch.float32, device="cpu", seed=1234)
    codes = codes_for(1)[..., :4]
    session = load_streaming_runtime(model).session()
    eager = PerCodeEager(model)
    with torch.no_grad():
        pieces = [session.step(codes=codes[..., index : index + 1]) for index in range(3)]
        pieces.append(session.finish(codes=codes[..., 3:4]))
        expected = [eager.step(codes[..., index : index + 1]) for index in range(4)]
        whole = model(codes)
    assert [piece.shape[-1] for piece in pieces] == [1920 - DEFICIT, 1920, 1920, 1920]
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(pieces, expected, strict=True))
    assert torch.cat(pieces, dim=-1).shape == whole.shape
    with pytest.raises(StepError, match="finished its stream"):
        session.step(codes=codes[..., :1])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_graphs_equal_eager_streaming_per_code(dtype, batch):
    model = build_code2wav(dtype=dtype, device="cuda", seed=1234)
    runtime = load_streaming_runtime(model, batch, device="cuda")
    codes = codes_for(SECONDS, "cuda", batch)
    report = runtime.verify(
        PerCodeEager(model),
        lambda tick: {"codes": codes[..., tick : tick + 1]},
        ticks=codes.shape[-1],
        deterministic=True,  # cuDNN's default algorithm choice may round two eager runs differently
    )
    assert report.equal, str(report)
    assert report.runtime_counters.eager_planned == 0 and report.runtime_counters.eager_off_plan == 0
    assert runtime.report().stage_graphs_covered == 72  # KV fill 0..71 (71 warm-up shapes), then one steady


@pytest.fixture
def no_tf32():
    """Full fp32 on CUDA: cuDNN convolutions use TF32 by default, which alone moves the two decodes apart by
    ~3e-3 (measured on the H200), hiding what this test compares (the order of the same fp32 sums)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
def test_gpu_streaming_difference_from_stock_is_reported_not_zero(no_tf32):
    model = build_code2wav(dtype=torch.float32, device="cuda", seed=1234)
    codes = codes_for(SECONDS, "cuda")
    decoder = StreamingSecondDecoder(load_streaming_runtime(model, device="cuda"))
    stock = StockSecondDecoder(model)
    with torch.no_grad():
        ours = [decoder.step(chunk) for chunk in split_into_seconds(codes)]
        theirs = [stock.step(chunk) for chunk in split_into_seconds(codes)]
        whole = model(codes)
    assert (torch.cat(ours, dim=-1) - whole).abs().max().item() < 1e-3
    print(f"max abs vs stock chunked, fp32 GPU: {stock_difference(ours, theirs):.3g}")
