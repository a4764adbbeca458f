"""MiniCPM-o 4.5 token2wav tail at released sizes on a GPU (P = 150 prompt frames, n_timesteps 10 / 5).

Bit-identity needs ``torch.backends.cudnn.deterministic = True``: with torch's defaults HiFT's
waveform differs run to run by ~1e-5 (cuDNN algorithm choice). The flow caches are deterministic either way.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator

import pytest
import torch

REQUIRED_MODULES = ("stepaudio2", "einops", "onnxruntime", "scipy", "numpy")
MISSING = [name for name in REQUIRED_MODULES if name not in sys.modules and importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.models,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}"),
]

PROMPT_FRAMES = 150


@pytest.fixture(autouse=True)
def deterministic_cudnn() -> Iterator[None]:
    previous = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic = previous


@pytest.fixture(scope="module")
def tail():
    from duplexcadence.examples.minicpmo45 import model

    return model.build_tail(model.RELEASED, seed=1234, device="cuda")


@pytest.fixture(scope="module")
def prompt():
    from duplexcadence.examples.minicpmo45 import model

    return model.random_prompt(PROMPT_FRAMES, seed=4321, device="cuda")


def _tokens() -> list[int]:
    return torch.randint(0, 6561, (200,), generator=torch.Generator().manual_seed(2024)).tolist()


def _turn(session) -> list[torch.Tensor]:
    """First, second and two steady chunks, a 13-token flush and a 3-token last chunk."""
    tokens = _tokens()
    chunks = []
    for index in range(4):
        chunks += session.push_tokens(tokens[25 * index : 25 * index + 25])
    chunks += session.push_tokens(tokens[100:110], flush=True, end_of_turn=True)
    return chunks


@pytest.mark.parametrize("n_timesteps", [10, 5])
def test_released_two_sessions_bit_identical(tail, prompt, n_timesteps):
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    first = _turn(StockToken2wavSession(tail, prompt, n_timesteps=n_timesteps, session_seed=3))
    second = _turn(StockToken2wavSession(tail, prompt, n_timesteps=n_timesteps, session_seed=3))
    assert [chunk.shape[-1] for chunk in first] == [20_160, 24_000, 24_000, 24_000, 9_600, 6_720]
    for mine, theirs in zip(first, second, strict=True):
        assert torch.equal(mine, theirs)


def test_released_demand_sized_and_patched_bit_identical(tail, prompt):
    from duplexcadence.examples.minicpmo45 import patches
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    reference = _turn(StockToken2wavSession(tail, prompt, n_timesteps=10, session_seed=3))
    installed = patches.apply_constant_patches(tail)
    stock_buffers = patches.demand_size_buffers(tail.flow, 10, PROMPT_FRAMES)
    try:
        demand = _turn(StockToken2wavSession(tail, prompt, n_timesteps=10, session_seed=3))
    finally:
        stock_buffers.restore(tail.flow)
        patches.remove_constant_patches(tail, installed)
    for mine, theirs in zip(demand, reference, strict=True):
        assert torch.equal(mine, theirs)


def test_patched_steady_flow_chunk_never_syncs_the_host(tail, prompt):
    from duplexcadence.examples.minicpmo45 import patches
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    session = StockToken2wavSession(tail, prompt, n_timesteps=10, session_seed=3)
    tokens = _tokens()
    for index in range(3):
        session.push_tokens(tokens[25 * index : 25 * index + 25])
    window = torch.tensor([tokens[75:103]], dtype=torch.int32, device="cuda")
    installed = patches.apply_constant_patches(tail)
    try:
        with torch.no_grad():  # warm-up: the patched constants reach the device once, outside the probe
            tail.flow.inference_chunk(
                token=window, spk=prompt.speaker_embedding, cache=session.stream_cache, n_timesteps=10
            )
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.no_grad():
                tail.flow.inference_chunk(
                    token=window, spk=prompt.speaker_embedding, cache=session.stream_cache, n_timesteps=10
                )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    finally:
        patches.remove_constant_patches(tail, installed)


def test_float16_two_sessions_bit_identical(prompt):
    from duplexcadence.examples.minicpmo45 import model
    from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession

    half_tail = model.build_tail(model.RELEASED, seed=1234, device="cuda", float16=True)
    first = _turn(StockToken2wavSession(half_tail, prompt, n_timesteps=5, session_seed=3))
    second = _turn(StockToken2wavSession(half_tail, prompt, n_timesteps=5, session_seed=3))
    for mine, theirs in zip(first, second, strict=True):
        assert torch.equal(mine, theirs)
