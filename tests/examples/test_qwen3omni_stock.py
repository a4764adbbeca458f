"""Qwen3-Omni Code2Wav at its released size on the CPU: build, length arithmetic, the stock 1 s loop,
the corrected loop, and ``forward_for_capture``.

Everything runs the released architecture (216 M parameters, seeded random weights): one forward on
37-38 codes takes about 2.5 s on a 2-core CPU, so the tests share eagerly computed forwards through
module-scoped fixtures, stream at most 7 seconds, and check the stock loop against ``chunked_decode``
on the cheapest code windows that reproduce the steady 37- and 38-code forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import pytest

pytest.importorskip("transformers")

import torch
import transformers.masking_utils as masking_utils
import transformers.utils.import_utils as import_utils
from torch.utils._python_dispatch import TorchDispatchMode

from duplexcadence.examples.qwen3omni.model import (
    RELEASED_PARAMETER_COUNT,
    Qwen3OmniMoeCode2WavConfig,
    build_code2wav,
    forward_for_capture,
    forward_sample_deficit,
    output_length,
    samples_per_code,
    sliding_window_mask,
)
from duplexcadence.examples.qwen3omni.stock import StockSecondDecoder, second_bounds, split_into_seconds
from duplexcadence.examples.qwen3omni.streaming import StreamingCode2Wav

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

DTYPES = [torch.float32, torch.bfloat16]
PREFIX_LENGTHS = (12, 25, 37, 38)


@pytest.fixture(scope="module")
def codes() -> torch.Tensor:
    """Seven seconds of seeded random codes, [1, 16, 87] (the stock tests use the first five)."""
    return torch.randint(0, 2048, (1, 16, 87), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def models() -> dict[torch.dtype, torch.nn.Module]:
    return {dtype: build_code2wav(dtype) for dtype in DTYPES}


@pytest.fixture(scope="module")
def prefix_decodes(models, codes) -> dict[tuple[torch.dtype, int], torch.Tensor]:
    """Stock eager ``model(codes[..., :T])``: the whole-utterance decode of the first T codes."""
    with torch.no_grad():
        return {(dtype, length): models[dtype](codes[..., :length]) for dtype in DTYPES for length in PREFIX_LENGTHS}


def test_second_bounds_alternate_12_and_13_codes():
    bounds = [second_bounds(second) for second in range(6)]
    assert bounds == [(0, 12), (12, 25), (25, 37), (37, 50), (50, 62), (62, 75)]
    assert [chunk.shape[-1] for chunk in split_into_seconds(torch.zeros(1, 16, 80))] == [12, 13, 12, 13, 12, 13]


@pytest.mark.parametrize("dtype", DTYPES)
def test_released_size_and_real_signal(models, prefix_decodes, dtype):
    model = models[dtype]
    assert sum(parameter.numel() for parameter in model.parameters()) == RELEASED_PARAMETER_COUNT
    assert model.code_embedding.weight.dtype == dtype
    assert model.pre_transformer.rotary_emb.inv_freq.dtype == torch.float32
    wav = prefix_decodes[(dtype, 38)].float()
    assert wav.dtype == torch.float32 and prefix_decodes[(dtype, 38)].dtype == dtype
    # Stock init only: the equality tests below compare a real signal, not zeros or a saturated one.
    assert 0.2 < wav.pow(2).mean().sqrt().item() < 0.8
    assert (wav.abs() == 1).float().mean().item() < 0.1


def test_seeded_build_is_reproducible(models):
    again = build_code2wav(torch.float32)
    for (name, first), second in zip(models[torch.float32].state_dict().items(), again.state_dict().values()):
        assert torch.equal(first, second), name


def test_forward_returns_t_times_1920_minus_555(models, prefix_decodes):
    model = models[torch.float32]
    assert samples_per_code(model) == 1920
    assert forward_sample_deficit(model) == 555 == 8 * 60 + 5 * 12 + 4 * 3 + 3
    for length in (1, 12, 25, 37, 38, 300, 325):
        assert output_length(model, length) == length * 1920 - 555
    for (_, length), wav in prefix_decodes.items():
        assert wav.shape == (1, 1, length * 1920 - 555)


@pytest.fixture(scope="module")
def stock_stream(models, codes) -> tuple[StockSecondDecoder, list[torch.Tensor]]:
    """The stock fp32 loop over the five seconds, with what it emitted per second."""
    decoder = StockSecondDecoder(models[torch.float32])
    return decoder, [decoder.step(chunk) for chunk in split_into_seconds(codes[..., :62])]


def test_stock_loop_input_and_output_lengths(stock_stream, models, codes):
    decoder, chunks = stock_stream
    assert decoder.input_lengths == [12, 25, 37, 38, 37]
    # Chunk 0 has no context; every later chunk loses the 555-sample forward deficit.
    assert [chunk.shape[-1] for chunk in chunks] == [n * 1920 - 555 for n in (12, 13, 12, 13, 12)]
    fresh = StockSecondDecoder(models[torch.float32])
    fresh.step(codes[..., :12])
    fresh.reset()
    assert fresh.input_lengths == [] and fresh.codes_seen == 0 and fresh.history is None


def test_stock_loop_equals_chunked_decode(stock_stream, models, codes, prefix_decodes):
    """Each second equals the matching chunk of transformers' own ``chunked_decode``, run on the
    shortest code window whose chunking reproduces that second's forward."""
    model = models[torch.float32]
    _, chunks = stock_stream
    with torch.no_grad():
        # Second 2 (37 in): codes[:37] in chunks of 25 -> pieces [0,25) and [25,37) with context 25.
        reference_2 = model.chunked_decode(codes[..., :37], chunk_size=25, left_context_size=25)
        # Second 3 (38 in): codes[11:50] in chunks of 13 -> [0,13) [13,26) [26,39), the last with context 25.
        reference_3 = model.chunked_decode(codes[..., 11:50], chunk_size=13, left_context_size=25)
    assert torch.equal(chunks[2], reference_2[..., -chunks[2].shape[-1] :])
    assert torch.equal(chunks[3], reference_3[..., -chunks[3].shape[-1] :])
    # Seconds 0 and 1 are chunked_decode's first chunk and its arithmetic on the utterance so far.
    assert torch.equal(chunks[0], prefix_decodes[(torch.float32, 12)])
    assert torch.equal(chunks[1], prefix_decodes[(torch.float32, 25)][..., 12 * 1920 :])


@pytest.mark.parametrize("dtype", DTYPES)
def test_corrected_stream_equals_whole_utterance_decode(models, codes, prefix_decodes, dtype):
    """The corrected stream is the whole-utterance decode, sample for sample, where the arithmetic
    allows it: seconds 0-2, whose forwards start at code 0 (context = all earlier codes).

    Second k's forward is ``model(codes[..., :end_k])``, the whole decode of the utterance so far;
    its emitted samples must sit at absolute positions ``[start_k*1920 - 555, end_k*1920 - 555)``,
    continuing the stream without gap or overlap. Across different forward lengths the values are
    equal only up to rounding (CPU SDPA and GEMM kernels are not prefix-stable: about 8e-6 in fp32,
    0.07 in bf16), so each second is compared with the whole decode of the same length. From second
    3 on the forward starts at code ``start - 25`` and the stream departs from a whole decode by
    design (attention window 38 instead of 72, see examples/qwen3omni/README.md).
    """
    corrected = StockSecondDecoder(models[dtype], corrected=True)
    stream: list[torch.Tensor] = []
    for second, chunk in zip(range(3), split_into_seconds(codes)):
        start, end = second_bounds(second)
        piece = corrected.step(chunk)
        stream.append(piece)
        whole = prefix_decodes[(dtype, end)]
        assert torch.cat(stream, dim=-1).shape[-1] == whole.shape[-1] == end * 1920 - 555
        assert torch.equal(piece, whole[..., max(start * 1920 - 555, 0) :])
    assert corrected.input_lengths == [12, 25, 37]
    assert [piece.shape[-1] for piece in stream] == [12 * 1920 - 555, 13 * 1920, 12 * 1920]


def test_stock_gap_is_the_corrected_streams_first_555_samples(stock_stream, prefix_decodes):
    """Seconds 1 and 2 of the stock fp32 stream are the corrected pieces without their first 555
    samples: those fall into the stock loop's boundary gap and are never emitted."""
    _, chunks = stock_stream
    for second, end in ((1, 25), (2, 37)):
        start = second_bounds(second)[0]
        corrected_piece = prefix_decodes[(torch.float32, end)][..., start * 1920 - 555 :]
        assert torch.equal(chunks[second], corrected_piece[..., 555:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_for_capture_equals_stock_forward(models, codes, prefix_decodes, dtype):
    with torch.no_grad():
        for length in PREFIX_LENGTHS:
            assert torch.equal(forward_for_capture(models[dtype], codes[..., :length]), prefix_decodes[(dtype, length)])


def test_sliding_window_mask_matches_transformers_mask(models):
    """Above the window the eager forward builds a real mask; ours equals it in value and layout."""
    config = models[torch.float32].config
    assert config.sliding_window == 72 and config._attn_implementation == "sdpa"
    for batch, length in ((1, 71), (1, 72), (2, 80)):
        embeds = torch.zeros(batch, length, 8)
        positions = torch.arange(length)[None]
        theirs = masking_utils.create_sliding_window_causal_mask(config, embeds, None, None, positions)
        ours = sliding_window_mask(batch, length, 72, embeds.device)
        if theirs is None:
            assert ours is None
        else:
            assert torch.equal(ours, theirs) and ours.stride() == theirs.stride()


def test_forward_for_capture_on_long_input_uses_the_eager_mask():
    """88 codes: from 72 codes on the eager forward masks attention; values still equal.

    Reduced config for CI time: the released embedding and 8-layer transformer (where the mask
    lives), with a 48-channel decoder of rates (2, 2, 2, 2) instead of 1536 channels and x1920.
    """
    model = build_code2wav(
        torch.float32, config=Qwen3OmniMoeCode2WavConfig(decoder_dim=48, upsample_rates=(2, 2, 2, 2))
    )
    codes = torch.randint(0, 2048, (1, 16, 88), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(forward_for_capture(model, codes), model(codes))


def test_true_streaming_computes_the_whole_utterance_forward(models, codes, prefix_decodes, stock_stream):
    """The opt-in streaming mode over 7 s (87 codes: the KV window of 71 fills during second 5).

    Its first second is the 12-code forward itself (``torch.equal``). Later seconds run other
    kernel shapes than one whole forward, so they can only agree with it up to rounding: this is a
    numerical check of the carried state (a wrong carry or window gives errors of order 1, as the
    chunked decode's lost context does), not a bit-identity claim, which this mode does not make.
    """
    model = models[torch.float32]
    streaming = StreamingCode2Wav(model)
    pieces = [streaming.step(chunk) for chunk in split_into_seconds(codes)]
    assert torch.equal(pieces[0], prefix_decodes[(torch.float32, 12)])
    assert [piece.shape[-1] for piece in pieces] == [12 * 1920 - 555] + [
        (second_bounds(k)[1] - second_bounds(k)[0]) * 1920 for k in range(1, 7)
    ]
    with torch.no_grad():
        whole = model(codes)
    stream = torch.cat(pieces, dim=-1)
    assert stream.shape == whole.shape
    assert (stream - whole).abs().max().item() < 1e-4
    # The stock loop's second 4 covers the same samples as the stream's, minus the 555-sample gap;
    # with 25 codes of context instead of the full window it is a different signal.
    _, stock_chunks = stock_stream
    assert (pieces[4][..., 555:] - stock_chunks[4]).abs().max().item() > 0.1
    assert streaming.position == 87
    assert all(layer.keys.shape == layer.values.shape == (1, 16, 71, 64) for layer in streaming.cache.layers)
    assert streaming.conv_carries["decoder.4.block.4.conv1"].shape == (1, 96, 54)
    assert streaming.frame_carries["decoder.1.block.1"].shape == (1, 1536, 1)
    assert len(streaming.conv_carries) == 16 and len(streaming.frame_carries) == 4
    streaming.reset()
    assert streaming.position == 0 and not streaming.conv_carries and not streaming.frame_carries


class _OpRecorder(TorchDispatchMode):
    """Records the aten overloads a piece of code dispatches, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _record(function: Callable[[], torch.Tensor]) -> tuple[list[str], torch.Tensor]:
    with torch.no_grad(), _OpRecorder() as recorder:
        result = function()
    return recorder.ops, result


def _remove_block(ops: list[str], block: list[str]) -> tuple[list[str], int]:
    kept, removed, index = [], 0, 0
    while index < len(ops):
        if ops[index : index + len(block)] == block:
            index += len(block)
            removed += 1
        else:
            kept.append(ops[index])
            index += 1
    return kept, removed


def test_forward_for_capture_under_capture_records_the_eager_ops(models, codes):
    """With ``is_cuda_stream_capturing`` forced true (what a CUDA-graph capture sees), the stock forward
    takes another path (mask tensors, masked SDPA), while ``forward_for_capture`` dispatches exactly
    the eager forward's aten ops minus the two packed-sequence checks, which end in the host sync
    ``_local_scalar_dense``."""
    model = models[torch.float32]
    chunk = codes[..., :12]
    positions = torch.arange(12)[None]
    eager_ops, eager_wav = _record(lambda: model(chunk))
    packed_check, _ = _record(lambda: masking_utils.find_packed_sequence_indices(positions))
    assert packed_check[-1] == "aten._local_scalar_dense.default"
    with mock.patch.object(import_utils, "is_cuda_stream_capturing", lambda: True):
        assert masking_utils.find_packed_sequence_indices(positions) is not None
        capture_ops, capture_wav = _record(lambda: forward_for_capture(model, chunk))
        stock_capture_ops, stock_capture_wav = _record(lambda: model(chunk))
    eager_without_checks, checks = _remove_block(eager_ops, packed_check)
    assert checks == 2
    assert capture_ops == eager_without_checks
    assert "aten._local_scalar_dense.default" not in capture_ops
    assert torch.equal(capture_wav, eager_wav)
    # The stock forward under capture is a different op sequence (the masked path), same values here.
    assert stock_capture_ops != eager_ops and torch.equal(stock_capture_wav, eager_wav)


def _captured(model: torch.nn.Module, static_codes: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            forward_for_capture(model, static_codes)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_wav = forward_for_capture(model, static_codes)
    return graph, static_wav


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_for_capture_graph_replay_equals_eager_on_cuda(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = build_code2wav(dtype, device="cuda")
    codes = torch.randint(0, 2048, (1, 16, 200), generator=torch.Generator().manual_seed(11)).cuda()
    for length in (37, 38):
        static_codes = codes[..., :length].clone()
        graph, static_wav = _captured(model, static_codes)
        for offset in (0, 50, 150):
            window = codes[..., offset : offset + length]
            static_codes.copy_(window)
            graph.replay()
            with torch.no_grad():
                assert torch.equal(static_wav, model(window))


@pytest.mark.gpu
def test_forward_for_capture_makes_no_host_sync_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = build_code2wav(torch.bfloat16, device="cuda")
    codes = torch.randint(0, 2048, (1, 16, 38), device="cuda")
    with torch.no_grad():
        forward_for_capture(model, codes)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            forward_for_capture(model, codes)
            with pytest.raises(RuntimeError):
                model(codes)
        finally:
            torch.cuda.set_sync_debug_mode("default")
