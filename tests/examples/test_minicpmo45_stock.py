"""Stock streaming of MiniCPM-o 4.5's Step-Audio2 token2wav tail (package ``stepaudio2-minicpmo`` 0.1.1).

CI time forces a reduced tail here: 1 + 1 conformer layers (released 6 + 4), a 1-layer DiT
(released 16), HiFT with 32 base channels (released 512), a 20-frame prompt (released use: 150)
and 2 Euler steps (released 10 / 5). Every module is still the package's own and the streaming
code path is the stock one (``Token2wav.stream`` unmodified); the shapes of the carried state do not
depend on the layer counts except ``conformer_att_cache``'s first dimension. At released sizes one
CPU chunk takes seconds and ``setup_cache`` tens of seconds (STATE.md).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.models,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (pip install --no-deps stepaudio2-minicpmo==0.1.1 ...)"),
]

PROMPT_FRAMES = 20
N_TIMESTEPS = 2
SESSION_SEED = 7


def _modules():
    from duplexcadence.examples.minicpmo45 import model, patches, stock

    return model, stock, patches


@dataclass
class Run:
    chunks: list[torch.Tensor]
    windows: list[int]
    last_flags: list[bool]
    flow_cache_after_turn_1: dict[str, torch.Tensor]
    hift_cache_after_turn_1: dict[str, torch.Tensor]
    flow_cache_end: dict[str, torch.Tensor]


def _token_script() -> list[int]:
    generator = torch.Generator().manual_seed(2024)
    return torch.randint(0, 6561, (200,), generator=generator).tolist()


def _run_script(session) -> Run:
    """Two turns: first / second / steady chunks, a forced flush (13-token window), a 3-token last chunk;
    after ``reset``: first and second chunks and a 27-token last chunk (the largest chunk shape, on a
    carried DiT cache of P + 100 frames: P + 154 in flight)."""
    _, stock, _ = _modules()
    tokens = _token_script()
    chunks: list[torch.Tensor] = []
    for index in range(3):
        chunks += session.push_tokens(tokens[25 * index : 25 * index + 25])
    chunks += session.push_tokens(tokens[75:85], flush=True)
    chunks += session.push_tokens([], end_of_turn=True)
    flow_after_turn_1 = stock.clone_recursive(session.stream_cache)
    hift_after_turn_1 = stock.clone_recursive(session.hift_cache)
    session.reset()
    chunks += session.push_tokens(tokens[100:125])
    chunks += session.push_tokens(tokens[125:150])
    chunks += session.push_tokens(tokens[150:174], end_of_turn=True)
    history = session.history[-len(chunks) :]
    return Run(
        chunks=chunks,
        windows=[len(record.tokens) for record in history],
        last_flags=[record.last_chunk for record in history],
        flow_cache_after_turn_1=flow_after_turn_1,
        hift_cache_after_turn_1=hift_after_turn_1,
        flow_cache_end=stock.clone_recursive(session.stream_cache),
    )


@pytest.fixture(scope="module")
def tail():
    model, _, _ = _modules()
    config = model.TailConfig(encoder_blocks=1, encoder_up_blocks=1, dit_depth=1, hift_base_channels=32)
    return model.build_tail(config, seed=1234)


@pytest.fixture(scope="module")
def prompt():
    model, _, _ = _modules()
    return model.random_prompt(PROMPT_FRAMES, seed=4321)


@pytest.fixture(scope="module")
def reference(tail, prompt) -> Run:
    _, stock, _ = _modules()
    return _run_script(stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED))


def _assert_caches_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def test_loader_skips_package_init_and_restores_dynamo_config():
    from duplexcadence.examples.minicpmo45.package import FrontEndStandIn, FrontEndUnavailableError, load_stepaudio2

    import torch._dynamo

    before = (torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit)
    modules = load_stepaudio2()
    assert (torch._dynamo.config.suppress_errors, torch._dynamo.config.cache_size_limit) == before
    assert not any(isinstance(module, FrontEndStandIn) for module in list(sys.modules.values()))
    if modules.bare_package:
        assert not hasattr(sys.modules["stepaudio2"], "StepAudio2")  # the package __init__ never ran
    if isinstance(modules.token2wav.s3tokenizer, FrontEndStandIn):
        with pytest.raises(FrontEndUnavailableError):
            modules.token2wav.s3tokenizer.load_audio("prompt.wav", sr=16000)


def test_zero_parameters_filled_so_the_dit_output_is_not_zero(tail):
    model, _, _ = _modules()
    assert model.zero_parameter_count(model.RELEASED) == 206
    assert len(tail.filled_zero_parameters) == model.zero_parameter_count(tail.config)
    assert all(torch.count_nonzero(parameter) > 0 for parameter in tail.flow.parameters())
    estimator = tail.flow.decoder.estimator
    generator = torch.Generator().manual_seed(3)
    x, mu, cond = (torch.randn(2, 80, 6, generator=generator) for _ in range(3))
    with torch.no_grad():
        out = estimator.forward(x, torch.ones(2, 1, 6), mu, torch.rand(2, generator=generator), torch.randn(2, 80, generator=generator), cond)
    assert torch.count_nonzero(out) > 0


def test_chunk_lengths_first_steady_flush_last(reference: Run):
    _, stock, _ = _modules()
    assert reference.windows == [28, 28, 28, 13, 3, 28, 28, 27]
    assert reference.last_flags == [False, False, False, False, True, False, False, True]
    samples = [chunk.shape[-1] for chunk in reference.chunks]
    assert samples == [20_160, 24_000, 24_000, 9_600, 6_720, 20_160, 24_000, 29_760]
    first_in_turn = [True, False, False, False, False, True, False, False]
    assert samples == [
        stock.expected_chunk_samples(window, first, last)
        for window, first, last in zip(reference.windows, first_in_turn, reference.last_flags)
    ]
    assert all(chunk.dtype == torch.float32 and chunk.shape[0] == 1 for chunk in reference.chunks)


def test_two_runs_are_bit_identical_and_leave_global_rng_alone(tail, prompt, reference: Run):
    _, stock, _ = _modules()
    cpu_state = torch.get_rng_state()
    again = _run_script(stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED))
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert len(again.chunks) == len(reference.chunks)
    for mine, theirs in zip(again.chunks, reference.chunks):
        assert torch.equal(mine, theirs)
    _assert_caches_equal(again.flow_cache_after_turn_1, reference.flow_cache_after_turn_1)
    _assert_caches_equal(again.hift_cache_after_turn_1, reference.hift_cache_after_turn_1)
    _assert_caches_equal(again.flow_cache_end, reference.flow_cache_end)


def test_session_seed_changes_only_the_hift_noise(tail, prompt, reference: Run):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED + 1)
    tokens = _token_script()
    (chunk,) = session.push_tokens(tokens[:25])
    assert chunk.shape == reference.chunks[0].shape
    assert not torch.equal(chunk, reference.chunks[0])
    # The flow has no random draw: its caches after chunk 0 do not depend on the seed.
    replay = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED)
    replay.push_tokens(tokens[:25])
    _assert_caches_equal(session.stream_cache, replay.stream_cache)


def test_reset_restores_clones_of_the_base_caches(tail, prompt):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED)
    session.push_tokens(_token_script()[:25])
    session.reset()
    assert session.token_buffer == [4218, 4218, 4218]
    assert session.turn_chunk_count == 0
    for carried, base in ((session.stream_cache, session.base_flow_cache), (session.hift_cache, session.base_hift_cache)):
        _assert_caches_equal(carried, base)
        for key in carried:
            assert carried[key].data_ptr() != base[key].data_ptr() or carried[key].numel() == 0


def test_own_caches_detaches_from_module_buffers(tail, prompt, reference: Run):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED, own_caches=True)
    (chunk,) = session.push_tokens(_token_script()[:25])
    assert torch.equal(chunk, reference.chunks[0])
    decoder = tail.flow.decoder
    for key, buffer in (("estimator_cnn_cache", decoder.cnn_cache_buffer), ("estimator_att_cache", decoder.att_cache_buffer)):
        assert session.stream_cache[key].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()


def test_demand_sized_buffers_are_bit_identical(tail, prompt, reference: Run):
    _, stock, patches = _modules()
    decoder = tail.flow.decoder
    capacity = patches.estimator_cache_frames(PROMPT_FRAMES)
    assert capacity == PROMPT_FRAMES + 154
    stock_buffers = patches.demand_size_buffers(tail.flow, N_TIMESTEPS, PROMPT_FRAMES)
    try:
        assert decoder.att_cache_buffer.shape == (N_TIMESTEPS, 16, 2, 8, capacity, 128)
        assert decoder.cnn_cache_buffer.shape == (N_TIMESTEPS, 16, 2, 1024, 2)
        assert decoder.estimator.att_cache_buffer.shape == (16, 2, 8, capacity, 128)
        assert decoder.rand_noise.shape == (1, 80, capacity)
        demand = _run_script(stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED))
        for mine, theirs in zip(demand.chunks, reference.chunks, strict=True):
            assert torch.equal(mine, theirs)
        for mine, theirs in ((demand.flow_cache_after_turn_1, reference.flow_cache_after_turn_1), (demand.flow_cache_end, reference.flow_cache_end)):
            for key in ("conformer_cnn_cache", "conformer_att_cache"):
                assert torch.equal(mine[key], theirs[key])
            # Only the ODE-step slots actually used exist; stock carries 16, slots >= n are never read.
            for key in ("estimator_cnn_cache", "estimator_att_cache"):
                assert mine[key].shape[0] == N_TIMESTEPS
                assert torch.equal(mine[key], theirs[key][:N_TIMESTEPS])
                assert torch.count_nonzero(theirs[key][N_TIMESTEPS:]) == 0
        _assert_caches_equal(demand.hift_cache_after_turn_1, reference.hift_cache_after_turn_1)

        # P + 150 is enough for every regular and flush chunk but not for a 27-token last chunk
        # arriving on a carried cache of P + 100 frames.
        patches.resize_estimator_cache_buffers(tail.flow, ode_slots=N_TIMESTEPS, capacity_frames=PROMPT_FRAMES + 150)
        short = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED)
        tokens = _token_script()
        short.push_tokens(tokens[100:125])
        short.push_tokens(tokens[125:150])
        with pytest.raises(RuntimeError):
            short.push_tokens(tokens[150:174], end_of_turn=True)
    finally:
        stock_buffers.restore(tail.flow)
    assert decoder.att_cache_buffer.shape == (16, 16, 2, 8, 1000, 128)
    assert decoder.rand_noise.shape == (1, 80, 30_000)


def test_constant_patches_are_value_identical(tail, prompt, reference: Run):
    _, stock, patches = _modules()
    t_embedder = tail.flow.decoder.estimator.t_embedder
    stock_embedding = type(t_embedder).timestep_embedding
    installed = patches.apply_constant_patches(tail)
    try:
        assert tail.hift.stft_window.device == tail.device
        for dtype in (torch.float32, torch.float16):
            t = (torch.rand(2) * 1000).to(dtype)
            assert torch.equal(t_embedder.timestep_embedding(t, 256), stock_embedding(t, 256))
        session = stock.StockToken2wavSession(tail, prompt, n_timesteps=N_TIMESTEPS, session_seed=SESSION_SEED)
        tokens = _token_script()
        chunks = []
        for index in range(3):
            chunks += session.push_tokens(tokens[25 * index : 25 * index + 25])
        for mine, theirs in zip(chunks, reference.chunks[:3], strict=True):
            assert torch.equal(mine, theirs)
    finally:
        patches.remove_constant_patches(tail, installed)
    assert "timestep_embedding" not in vars(t_embedder)
    assert "forward" not in vars(tail.hift.m_source.l_sin_gen)
    assert tail.hift.stft_window is installed.original_stft_window


def test_patched_sine_generator_draws_like_stock(tail):
    _, stock, patches = _modules()
    sine_gen = tail.hift.m_source.l_sin_gen
    f0 = torch.rand(1, 4800, 1) * 300
    with stock.seeded_device_generator(tail.device, 11):
        expected = sine_gen(f0)
    installed = patches.apply_constant_patches(tail)
    try:
        with stock.seeded_device_generator(tail.device, 11):
            got = sine_gen(f0)
    finally:
        patches.remove_constant_patches(tail, installed)
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine, theirs)
