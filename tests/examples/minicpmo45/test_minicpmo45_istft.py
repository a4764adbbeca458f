"""The sync-free inverse STFT of ``hift_back``: ``torch.equal`` to ``torch.istft``, the window checked once.

HiFT's call is n_fft 16, hop 4, a periodic Hann window (scipy's, float32), center, onesided; the spectra are
built the way ``HiFTGenerator._istft`` builds them (clipped magnitude, cos / sin of the phase).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.signal import get_window

from duplexcadence.examples.minicpmo45.istft import NOLA_THRESHOLD, InverseStft

HIFT_N_FFT, HIFT_HOP = 16, 4


def hift_window(n_fft: int = HIFT_N_FFT) -> torch.Tensor:
    return torch.from_numpy(get_window("hann", n_fft, fftbins=True).astype(np.float32))


def hift_spectrum(shape: tuple[int, ...], seed: int, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    magnitude = torch.clip(torch.exp(3 * torch.randn(shape, generator=generator)), max=1e2)
    phase = torch.sin(5 * torch.randn(shape, generator=generator))
    magnitude, phase = magnitude.to(device), phase.to(device)
    return torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))


def stock(spectrum: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    return torch.istft(spectrum, n_fft, hop, n_fft, window=window)


@settings(max_examples=150, deadline=None)
@given(
    frames=st.integers(2, 400), layout=st.sampled_from(["batch1", "unbatched", "batch3"]), seed=st.integers(0, 2**31)
)
def test_hift_call_is_bit_identical_to_torch_istft(frames, layout, seed):
    bins = HIFT_N_FFT // 2 + 1
    shape = {"batch1": (1, bins, frames), "unbatched": (bins, frames), "batch3": (3, bins, frames)}[layout]
    spectrum = hift_spectrum(shape, seed)
    window = hift_window()
    mine = InverseStft(HIFT_N_FFT, HIFT_HOP, window)(spectrum)
    assert torch.equal(mine, stock(spectrum, HIFT_N_FFT, HIFT_HOP, window))


@pytest.mark.parametrize("n_fft,hop", [(8, 2), (15, 5), (32, 8), (400, 100), (512, 128), (16, 16)])
def test_other_sizes_and_windows_are_bit_identical(n_fft, hop):
    window = torch.hann_window(n_fft) + 0.01  # nowhere zero: every hop up to n_fft passes the NOLA check
    inverse = InverseStft(n_fft, hop, window)
    for seed, frames in enumerate((2, 3, 7, 64)):
        spectrum = torch.randn(
            1, n_fft // 2 + 1, frames, dtype=torch.complex64, generator=torch.Generator().manual_seed(seed)
        )
        assert torch.equal(inverse(spectrum), stock(spectrum, n_fft, hop, window)), f"{frames} frames"


def test_a_transposed_spectrum_is_bit_identical():
    spectrum = hift_spectrum((1, 120, HIFT_N_FFT // 2 + 1), 5).transpose(1, 2)  # not contiguous
    window = hift_window()
    assert torch.equal(
        InverseStft(HIFT_N_FFT, HIFT_HOP, window)(spectrum), stock(spectrum, HIFT_N_FFT, HIFT_HOP, window)
    )


def test_output_length_is_the_centred_trim():
    inverse = InverseStft(HIFT_N_FFT, HIFT_HOP, hift_window())
    assert inverse.output_samples(58) == 4 * 57 == inverse(hift_spectrum((1, 9, 58), 1)).shape[-1]


def test_hift_window_passes_once_at_construction():
    inverse = InverseStft(HIFT_N_FFT, HIFT_HOP, hift_window())
    assert inverse.lowest_envelope >= NOLA_THRESHOLD


def test_a_window_that_torch_istft_refuses_is_refused_at_construction():
    window = hift_window()  # zero at sample 0: with hop = n_fft nothing overlaps it
    spectrum = hift_spectrum((1, 9, 10), 2)
    with pytest.raises(RuntimeError, match="window overlap add min"):
        stock(spectrum, HIFT_N_FFT, HIFT_N_FFT, window)
    with pytest.raises(ValueError, match=re.escape("falls to 0 with a hop of 16 (torch.istft needs at least 1e-11")):
        InverseStft(HIFT_N_FFT, HIFT_N_FFT, window)


def test_bad_arguments_are_refused_with_what_is_wrong():
    window = hift_window()
    with pytest.raises(ValueError, match=re.escape("the window must be 1-D of n_fft = 32 samples, not of shape [16]")):
        InverseStft(32, 8, window)
    with pytest.raises(ValueError, match="the hop must be from 1 to n_fft = 16, not 0"):
        InverseStft(16, 0, window)
    inverse = InverseStft(HIFT_N_FFT, HIFT_HOP, window)
    with pytest.raises(ValueError, match="expected 9 frequency bins"):
        inverse(torch.zeros(1, 16, 10, dtype=torch.complex64))
    with pytest.raises(ValueError, match="1 frame"):
        inverse(torch.zeros(1, 9, 1, dtype=torch.complex64))


def test_torch_istft_runs_the_operations_this_one_repeats():
    """The ATen operations of torch.istft (this torch), in order: the ones InverseStft repeats, then the
    NOLA read-back that it leaves out."""
    from torch.profiler import ProfilerActivity, profile

    spectrum = hift_spectrum((1, 9, 50), 3)
    window = hift_window()
    watched = {"aten::_fft_c2r", "aten::mul", "aten::unfold_backward", "aten::pow", "aten::div", "aten::lt"}
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        stock(spectrum, HIFT_N_FFT, HIFT_HOP, window)
    ops = [event.name for event in recorded.events() if event.name in watched]
    assert ops == [
        "aten::_fft_c2r",
        "aten::mul",
        "aten::unfold_backward",
        "aten::pow",
        "aten::unfold_backward",
        "aten::lt",
        "aten::div",
    ]
    inverse = InverseStft(HIFT_N_FFT, HIFT_HOP, window)
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        inverse(spectrum)
    mine = [event.name for event in recorded.events() if event.name in watched]
    assert mine == [op for op in ops if op != "aten::lt"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_bit_identical_and_free_of_host_syncs():
    window = hift_window().to("cuda")
    inverse = InverseStft(HIFT_N_FFT, HIFT_HOP, window)
    for seed, frames in enumerate((2, 50, 58, 64, 333)):
        spectrum = hift_spectrum((1, 9, frames), seed, "cuda")
        expected = stock(spectrum, HIFT_N_FFT, HIFT_HOP, window)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            mine = inverse(spectrum)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(mine, expected), f"{frames} frames"
    spectrum = hift_spectrum((1, 9, 58), 9, "cuda")
    static = spectrum.clone()
    inverse(static)  # warm-up: cuFFT's plan is made outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = inverse(static)
    static.copy_(spectrum)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, stock(spectrum, HIFT_N_FFT, HIFT_HOP, window))
