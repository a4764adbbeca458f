"""Stock streaming of MiniCPM-o 4.5's Step-Audio2 token2wav tail (package ``stepaudio2-minicpmo`` 0.1.1).

CI time forces a reduced tail here (conftest.py: 1 + 1 conformer layers, a 1-layer DiT, HiFT with 32
base channels, a 20-frame prompt, 2 Euler steps; released 6 + 4, 16, 512, 150, 10 / 5). Every module
is still the package's own and the streaming code path is the stock one (``Token2wav.stream``
unmodified). At released sizes one CPU chunk takes seconds and ``setup_cache`` tens of seconds
(examples/minicpmo45/README.md).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.models,
    pytest.mark.slow,  # the tail streamed on the CPU
    pytest.mark.skipif(
        bool(MISSING), reason=f"needs {', '.join(MISSING)} (pip install --no-deps stepaudio2-minicpmo==0.1.1 ...)"
    ),
]


def _modules():
    from duplexcadence.examples.minicpmo45 import model, patches, stock

    return model, stock, patches


def _assert_caches_equal(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def _first_pushes(session, tokens: list[int], count: int) -> list[torch.Tensor]:
    chunks: list[torch.Tensor] = []
    for index in range(count):
        chunks += session.push_tokens(tokens[25 * index : 25 * index + 25])
    return chunks


def test_loader_skips_package_init_and_restores_dynamo_config():
    import torch._dynamo

    from duplexcadence.examples.minicpmo45.package import FrontEndStandIn, FrontEndUnavailableError, load_stepaudio2

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
        out = estimator.forward(
            x,
            torch.ones(2, 1, 6),
            mu,
            torch.rand(2, generator=generator),
            torch.randn(2, 80, generator=generator),
            cond,
        )
    assert torch.count_nonzero(out) > 0


def test_chunk_lengths_first_steady_flush_last(reference, spec):
    _, stock, _ = _modules()
    assert reference.windows == spec.windows
    assert reference.last_flags == spec.last
    samples = [chunk.shape[-1] for chunk in reference.chunks]
    assert samples == spec.samples
    assert samples == [
        stock.expected_chunk_samples(window, first, last)
        for window, first, last in zip(reference.windows, spec.first_in_turn, reference.last_flags)
    ]
    assert all(chunk.dtype == torch.float32 and chunk.shape[0] == 1 for chunk in reference.chunks)


def test_two_runs_are_bit_identical_and_leave_global_rng_alone(tail, prompt, reference, spec):
    _, stock, _ = _modules()
    cpu_state = torch.get_rng_state()
    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed)
    again = _first_pushes(session, spec.tokens(), 3)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    for mine, theirs in zip(again, reference.chunks[:3], strict=True):
        assert torch.equal(mine, theirs)


def test_session_seed_changes_only_the_hift_noise(tail, prompt, reference, spec):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(
        tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed + 1
    )
    (chunk,) = session.push_tokens(spec.tokens()[:25])
    assert chunk.shape == reference.chunks[0].shape
    assert not torch.equal(chunk, reference.chunks[0])
    # The flow has no random draw: its caches after chunk 0 do not depend on the seed.
    replay = stock.StockToken2wavSession(tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed)
    replay.push_tokens(spec.tokens()[:25])
    _assert_caches_equal(session.stream_cache, replay.stream_cache)


def test_reset_restores_the_base_caches_and_the_seeded_generator_state(tail, prompt, spec):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed)
    seeded = stock.seeded_generator_state(tail.device, spec.session_seed)
    assert torch.equal(session.rng_state, seeded)
    session.push_tokens(spec.tokens()[:25])
    assert not torch.equal(session.rng_state, seeded)  # carried: the next chunk draws new numbers
    session.reset()
    assert torch.equal(session.rng_state, seeded)
    assert session.token_buffer == [4218, 4218, 4218]
    assert session.turn_chunk_count == 0
    for carried, base in (
        (session.stream_cache, session.base_flow_cache),
        (session.hift_cache, session.base_hift_cache),
    ):
        _assert_caches_equal(carried, base)
        for key in carried:
            assert carried[key].data_ptr() != base[key].data_ptr() or carried[key].numel() == 0


def test_own_caches_detaches_from_module_buffers(tail, prompt, reference, spec):
    _, stock, _ = _modules()
    session = stock.StockToken2wavSession(
        tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed, own_caches=True
    )
    (chunk,) = session.push_tokens(spec.tokens()[:25])
    assert torch.equal(chunk, reference.chunks[0])
    decoder = tail.flow.decoder
    for key, buffer in (
        ("estimator_cnn_cache", decoder.cnn_cache_buffer),
        ("estimator_att_cache", decoder.att_cache_buffer),
    ):
        assert session.stream_cache[key].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()


def test_demand_sized_buffers_are_bit_identical(tail, prompt, reference, spec, script):
    """Turn 1 (every regular shape, a flush, a last chunk) and turn 2 (a 27-token last chunk: P + 154
    in flight) with demand-sized buffers; then P + 150 is too small for that last chunk."""
    _, stock, patches = _modules()
    decoder = tail.flow.decoder
    capacity = patches.estimator_cache_frames(spec.prompt_frames)
    assert capacity == spec.prompt_frames + 154
    stock_buffers = patches.demand_size_buffers(tail.flow, spec.n_timesteps, spec.prompt_frames)
    try:
        assert decoder.att_cache_buffer.shape == (spec.n_timesteps, 16, 2, 8, capacity, 128)
        assert decoder.cnn_cache_buffer.shape == (spec.n_timesteps, 16, 2, 1024, 2)
        assert decoder.estimator.att_cache_buffer.shape == (16, 2, 8, capacity, 128)
        assert decoder.rand_noise.shape == (1, 80, capacity)
        session = stock.StockToken2wavSession(
            tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed
        )
        after: dict = {}

        def keep(turn: int) -> None:
            if turn == 0:
                after["flow"] = stock.clone_recursive(session.stream_cache)
                after["hift"] = stock.clone_recursive(session.hift_cache)

        demand = script(session, after_turn=keep)
        for mine, theirs in zip(demand, reference.chunks, strict=True):
            assert torch.equal(mine, theirs)
        for key in ("conformer_cnn_cache", "conformer_att_cache"):
            assert torch.equal(after["flow"][key], reference.flow_cache_after_turn_1[key])
        # Only the ODE-step slots actually used exist; stock carries 16, slots >= n are never read.
        for key in ("estimator_cnn_cache", "estimator_att_cache"):
            theirs = reference.flow_cache_after_turn_1[key]
            assert after["flow"][key].shape[0] == spec.n_timesteps
            assert torch.equal(after["flow"][key], theirs[: spec.n_timesteps])
            assert torch.count_nonzero(theirs[spec.n_timesteps :]) == 0
        _assert_caches_equal(after["hift"], reference.hift_cache_after_turn_1)

        # P + 150 is enough for every regular and flush chunk but not for a 27-token last chunk
        # arriving on a carried cache of P + 100 frames.
        patches.resize_estimator_cache_buffers(
            tail.flow, ode_slots=spec.n_timesteps, capacity_frames=spec.prompt_frames + 150
        )
        short = stock.StockToken2wavSession(tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed)
        tokens = spec.tokens()
        short.push_tokens(tokens[200:225])
        short.push_tokens(tokens[225:250])
        with pytest.raises(RuntimeError):
            short.push_tokens(tokens[250:274], end_of_turn=True)
    finally:
        stock_buffers.restore(tail.flow)
    assert decoder.att_cache_buffer.shape == (16, 16, 2, 8, 1000, 128)
    assert decoder.rand_noise.shape == (1, 80, 30_000)


def test_constant_patches_are_value_identical(tail, prompt, reference, spec):
    _, stock, patches = _modules()
    t_embedder = tail.flow.decoder.estimator.t_embedder
    stock_embedding = type(t_embedder).timestep_embedding
    installed = patches.apply_constant_patches(tail)
    try:
        assert tail.hift.stft_window.device == tail.device
        for dtype in (torch.float32, torch.float16):
            t = (torch.rand(2) * 1000).to(dtype)
            assert torch.equal(t_embedder.timestep_embedding(t, 256), stock_embedding(t, 256))
        session = stock.StockToken2wavSession(
            tail, prompt, n_timesteps=spec.n_timesteps, session_seed=spec.session_seed
        )
        chunks = _first_pushes(session, spec.tokens(), 3)
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
