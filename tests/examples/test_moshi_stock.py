"""Moshi's Mimi decoder (PyPI moshi 0.2.13) at its released size: stock loop, stages, state, rebinding.

CPU tests run 130 frames at B=1 (about 75 ms a frame on a 2-core CPU): past frame 125 the 250-step
ring KV caches are full and wrap, so the steady state that a runtime must reproduce is covered.
No reduced config is used. GPU tests (marked ``gpu``) repeat the bit-identity checks with moshi's
CUDA graphs.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("moshi")

from duplexcadence.examples.moshi import model as mimi_model  # noqa: E402
from duplexcadence.examples.moshi import stages, state  # noqa: E402
from duplexcadence.examples.moshi.stock import MoshiStockDecoder  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]  # a released tail streamed on the CPU

FRAMES = 130
"""Frames per session: the KV rings (250 steps, 2 per frame) wrap at frame 125."""
RESET_FRAMES = 6


@dataclasses.dataclass
class StockRun:
    outputs: list[torch.Tensor]
    reset_outputs: list[torch.Tensor]
    addresses_at_entry: dict
    addresses_after_session: dict
    addresses_after_reset: dict
    counters_after_session: list[state.StateCounter]
    counters_after_reset: list[state.StateCounter]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def stock_run(mimi, codes) -> StockRun:
    """Stock decode of FRAMES frames, then ``reset`` and the first RESET_FRAMES frames again."""
    with MoshiStockDecoder(mimi, batch_size=1, mode="stock") as decoder:
        at_entry = state.snapshot_addresses(mimi)
        outputs = [decoder.step(codes[:, :, t : t + 1]) for t in range(FRAMES)]
        after_session = state.snapshot_addresses(mimi)
        counters_after_session = state.decode_state_counters(mimi)
        decoder.reset()
        after_reset = state.snapshot_addresses(mimi)
        counters_after_reset = state.decode_state_counters(mimi)
        reset_outputs = [decoder.step(codes[:, :, t : t + 1]) for t in range(RESET_FRAMES)]
    return StockRun(
        outputs, reset_outputs, at_entry, after_session, after_reset, counters_after_session, counters_after_reset
    )


def _all_equal(expected: list[torch.Tensor], actual: list[torch.Tensor]) -> list[int]:
    """Indices of frames whose outputs are not ``torch.equal``."""
    assert len(expected) == len(actual)
    return [index for index, (a, b) in enumerate(zip(expected, actual)) if not torch.equal(a, b)]


def test_random_codebooks_decode_to_audio_not_silence(mimi, stock_run: StockRun) -> None:
    """Filled codebooks give non-zero, finite PCM of the released frame size."""
    for pcm in stock_run.outputs:
        assert pcm.shape == (1, 1, mimi_model.FRAME_SIZE)
        assert pcm.dtype == torch.float32
        assert torch.isfinite(pcm).all()
    assert torch.cat(stock_run.outputs, dim=-1).std() > 1e-3
    codebook = mimi.quantizer.rvq_rest.vq.layers[0]._codebook
    assert codebook.embedding_sum.abs().sum() > 0


def test_released_size_state_table(mimi) -> None:
    """The decode-path state of the released Mimi at B=1, as `state.decode_state_tensors` lists it (examples/moshi/README.md)."""
    with mimi.streaming(1):
        entries = {entry.path: entry.tensor for entry in state.decode_state_tensors(mimi)}
        counters = state.decode_state_counters(mimi)
        total = state.state_bytes(mimi)
    attn = "decoder_transformer.transformer.layers.{}.self_attn._streaming_state"
    for layer in range(8):
        assert entries[f"{attn.format(layer)}.kv_cache.cache"].shape == (2, 1, 8, mimi_model.KV_CONTEXT, 64)
        assert entries[f"{attn.format(layer)}.kv_cache.end_offset"].dtype == torch.int64
    expected_carries = {
        "upsample.convtr._streaming_state.partial": (1, 512, 2),
        "decoder.model.0._streaming_state.previous": (1, 512, 6),
        "decoder.model.2._streaming_state.partial": (1, 512, 8),
        "decoder.model.3.block.1._streaming_state.previous": (1, 512, 2),
        "decoder.model.3.block.3._streaming_state.previous": (1, 256, 0),
        "decoder.model.5._streaming_state.partial": (1, 256, 6),
        "decoder.model.6.block.1._streaming_state.previous": (1, 256, 2),
        "decoder.model.8._streaming_state.partial": (1, 128, 5),
        "decoder.model.9.block.1._streaming_state.previous": (1, 128, 2),
        "decoder.model.11._streaming_state.partial": (1, 64, 4),
        "decoder.model.12.block.1._streaming_state.previous": (1, 64, 2),
        "decoder.model.14._streaming_state.previous": (1, 64, 2),
    }
    for path, shape in expected_carries.items():
        assert entries[path].shape == shape
        assert entries[path].dtype == torch.float32
    assert len(entries) == 88
    assert sum(1 for path in entries if path.endswith("exec_mask")) == 38
    assert len(counters) == 16
    assert total == 8_242_872


def test_stock_state_never_moves_or_changes_shape(stock_run: StockRun) -> None:
    """Over a session past the KV wrap and across ``reset_streaming``, no state tensor moves."""
    assert stock_run.addresses_after_session == stock_run.addresses_at_entry
    assert stock_run.addresses_after_reset == stock_run.addresses_at_entry
    assert {counter.value for counter in stock_run.counters_after_session} == {2 * FRAMES}
    assert {counter.value for counter in stock_run.counters_after_reset} == {0}


def test_reset_replays_a_fresh_session(stock_run: StockRun) -> None:
    assert _all_equal(stock_run.outputs[:RESET_FRAMES], stock_run.reset_outputs) == []


@pytest.mark.parametrize("contiguous_boundaries", [False, True], ids=["views", "contiguous"])
def test_stages_chain_equals_decode(mimi, codes, stock_run: StockRun, contiguous_boundaries: bool) -> None:
    """(a) codebooks + upsample, (b) decoder transformer, (c) SEANet chained == ``mimi.decode``."""
    with mimi.streaming(1):
        outputs = [
            stages.decode_frame_by_stages(mimi, codes[:, :, t : t + 1], contiguous_boundaries) for t in range(FRAMES)
        ]
    assert _all_equal(stock_run.outputs, outputs) == []


def test_stage_shapes(mimi, codes) -> None:
    with mimi.streaming(1):
        latent = stages.decode_codes_to_latent(mimi, codes[:, :, :1])
        assert latent.shape == (1, mimi_model.LATENT_DIM, mimi_model.LATENT_STEPS_PER_FRAME)
        transformed = stages.run_decoder_transformer(mimi, latent)
        assert transformed.shape == latent.shape
        assert not transformed.is_contiguous()
        pcm = stages.run_seanet_decoder(mimi, transformed)
        assert pcm.shape == (1, 1, mimi_model.FRAME_SIZE)


def test_state_rebound_into_flat_buffers_matches_stock(mimi, codes, stock_run: StockRun) -> None:
    """State moved into one flat buffer per dtype before the first decode, and again after a reset."""
    with MoshiStockDecoder(mimi, batch_size=1, mode="stock") as decoder:
        buffers = state.rebind_decode_state_to_flat_buffers(mimi)
        bounds = {
            dtype: (buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()) for dtype, buf in buffers.items()
        }
        rebound = state.snapshot_addresses(mimi)
        for pointer, shape, _, dtype in rebound.values():
            if 0 not in shape:
                assert bounds[dtype][0] <= pointer < bounds[dtype][1]
        outputs = [decoder.step(codes[:, :, t : t + 1]) for t in range(FRAMES)]
        assert _all_equal(stock_run.outputs, outputs) == []
        assert state.snapshot_addresses(mimi) == rebound

        decoder.reset()
        assert state.snapshot_addresses(mimi) == rebound
        after_reset = [decoder.step(codes[:, :, t : t + 1]) for t in range(RESET_FRAMES)]
        assert _all_equal(stock_run.reset_outputs, after_reset) == []

        decoder.reset()
        state.rebind_decode_state_to_flat_buffers(mimi)
        after_second_rebind = [decoder.step(codes[:, :, t : t + 1]) for t in range(RESET_FRAMES)]
        assert _all_equal(stock_run.reset_outputs, after_second_rebind) == []


def test_install_state_tensor_rejects_wrong_shape(mimi) -> None:
    path = "decoder.model.0._streaming_state.previous"
    with mimi.streaming(1), pytest.raises(ValueError, match="expected"):
        state.install_state_tensor(mimi, path, torch.zeros(1, 512, 7))


def test_eager_mode_equals_stock_on_cpu(mimi, codes, stock_run: StockRun) -> None:
    """On CPU moshi neither graphs nor compiles, so its stock path is its eager path."""
    with MoshiStockDecoder(mimi, batch_size=1, mode="eager") as decoder:
        outputs = [decoder.step(codes[:, :, t : t + 1]) for t in range(RESET_FRAMES)]
    assert _all_equal(stock_run.outputs[:RESET_FRAMES], outputs) == []


def test_graphed_modes_need_cuda(mimi) -> None:
    if next(mimi.parameters()).is_cuda:
        pytest.skip("model is on CUDA")
    for mode in ("graphed", "graphed_compiled_rope"):
        with pytest.raises(ValueError, match="CUDA"):
            MoshiStockDecoder(mimi, mode=mode)
    with pytest.raises(ValueError, match="mode"):
        MoshiStockDecoder(mimi, mode="fast")


def test_torch_compile_switch_is_fixed_once_moshi_is_imported() -> None:
    actual = mimi_model.moshi_torch_compile_enabled()
    mimi_model.configure_torch_compile(actual)
    with pytest.raises(RuntimeError, match="NO_TORCH_COMPILE"):
        mimi_model.configure_torch_compile(not actual)


def test_materialize_codebook_tables_matches_lazy_tables() -> None:
    lazy = mimi_model.build_mimi(seed=5)
    eager = mimi_model.build_mimi(seed=5)
    assert mimi_model.materialize_codebook_tables(eager) == mimi_model.NUM_CODEBOOKS
    assert eager.quantizer.rvq_rest.vq.layers[6]._codebook._embedding is not None
    assert eager.quantizer.rvq_rest.vq.layers[7]._codebook._embedding is None
    sample = mimi_model.random_codes(1, 1, seed=3)
    assert torch.equal(lazy.decode_latent(sample), eager.decode_latent(sample))


# --- GPU: moshi's own CUDA graphs ---------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture()
def deterministic_cudnn():
    previous = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = previous


def _gpu_session(mimi, codes, mode: str, rebind: bool = False) -> list[torch.Tensor]:
    with MoshiStockDecoder(mimi, batch_size=codes.shape[0], mode=mode) as decoder:
        if rebind:
            state.rebind_decode_state_to_flat_buffers(mimi)
        return [decoder.step(codes[:, :, t : t + 1]).cpu() for t in range(codes.shape[-1])]


@pytest.mark.gpu
@cuda
def test_gpu_whole_step_graph_equals_eager(codes, deterministic_cudnn) -> None:
    mimi = mimi_model.build_mimi(seed=1234, device="cuda")
    gpu_codes = codes.cuda()
    eager = _gpu_session(mimi, gpu_codes, "eager")
    graphed = _gpu_session(mimi, gpu_codes, "graphed")
    assert _all_equal(eager, graphed) == []


@pytest.mark.gpu
@cuda
def test_gpu_stages_equal_eager_decode(codes, deterministic_cudnn) -> None:
    mimi = mimi_model.build_mimi(seed=1234, device="cuda")
    gpu_codes = codes.cuda()
    eager = _gpu_session(mimi, gpu_codes, "eager")
    from moshi.utils.compile import no_compile

    with mimi.streaming(1), no_compile():
        chained = [stages.decode_frame_by_stages(mimi, gpu_codes[:, :, t : t + 1], True).cpu() for t in range(FRAMES)]
    assert _all_equal(eager, chained) == []


@pytest.mark.gpu
@cuda
def test_gpu_moshi_graphs_capture_rebound_state(codes, deterministic_cudnn) -> None:
    """Stock moshi captures its graphs on the second call: state rebound before that is used."""
    mimi = mimi_model.build_mimi(seed=1234, device="cuda")
    gpu_codes = codes.cuda()
    stock = _gpu_session(mimi, gpu_codes, "stock")
    rebound = _gpu_session(mimi, gpu_codes, "stock", rebind=True)
    assert _all_equal(stock, rebound) == []
