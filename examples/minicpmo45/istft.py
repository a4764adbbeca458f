"""An inverse STFT equal to ``torch.istft`` bit for bit that never reads a value back to the host.

``torch.istft`` (ATen ``aten/src/ATen/native/SpectralOps.cpp``, ``istft``; the same code in torch 2.11
and 2.13) computes, for a complex spectrum without ``length`` and with ``return_complex=False``::

    frames = as_complex(view_as_real(spectrum).transpose(-3, -2))          # [..., n_frames, bins]
    y = _fft_c2r(frames, last dim, norm "backward" (1 / n), n_fft)         # irfft of each frame
    y = y * window.view(1, 1, n_fft)                                       # windowed frames
    y = unfold_backward(y, [channels, n_fft + hop x (n_frames - 1)], 1, n_fft, hop)   # overlap-add
    envelope = unfold_backward(window.pow(2).expand(1, n_frames, n_fft), [1, ...], 1, n_fft, hop)
    y, envelope = y[:, n_fft // 2 : -(n_fft // 2)], envelope[same]        # center=True: trim
    if envelope.abs().min() < 1e-11: raise                                 # NOLA: the read-back
    y = y / envelope

The NOLA check turns a device tensor into a host bool: one synchronisation per call, which also keeps the
call out of a CUDA graph. :class:`InverseStft` runs the same ATen operations in the same order on the same
shapes and strides (``torch.fft.irfft(..., n=n_fft)`` is ``_fft_c2r`` with the same arguments) and checks the
window's envelope once, on the host, when it is built: the window is fixed, and the envelope depends only on
the window, the hop and the number of frames, so a window that passes for every frame count passes at
every call. HiFT calls it with n_fft 16, hop 4, a periodic Hann window of 16, center, not normalized,
onesided, no length.
"""

from __future__ import annotations

import math

import torch

NOLA_THRESHOLD = 1e-11
"""ATen's ``istft`` refuses a window whose overlap-added square is below this anywhere in the output."""


class InverseStft:
    """``torch.istft(spectrum, n_fft, hop_length, n_fft, window, center=True, normalized=False,
    onesided=True, length=None, return_complex=False)`` without the host read-back.

    The window's envelope is checked at construction for every frame count (ValueError where
    ``torch.istft`` would refuse it). A call takes a complex spectrum [bins, frames] or
    [channels, bins, frames] with bins = n_fft // 2 + 1 and at least 2 frames (with one, the centred
    output is empty), on the window's device.
    """

    def __init__(self, n_fft: int, hop_length: int, window: torch.Tensor):
        if window.dim() != 1 or window.shape[0] != n_fft:
            raise ValueError(f"the window must be 1-D of n_fft = {n_fft} samples, not of shape {list(window.shape)}")
        if window.is_complex():
            raise ValueError("a complex window cannot give a real signal")
        if not 0 < hop_length <= n_fft:
            raise ValueError(f"the hop must be from 1 to n_fft = {n_fft}, not {hop_length}")
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.window = window
        self.lowest_envelope = lowest_envelope(window.detach().to("cpu"), n_fft, hop_length)
        if not self.lowest_envelope >= NOLA_THRESHOLD:
            raise ValueError(
                f"the window's overlap-added square falls to {self.lowest_envelope:.3g} with a hop of "
                f"{hop_length} (torch.istft needs at least {NOLA_THRESHOLD:g} everywhere: the NOLA condition)"
            )

    def output_samples(self, frames: int) -> int:
        """Samples of the output for `frames` frames (the centred trim of n_fft // 2 at each end)."""
        return self.hop_length * (frames - 1) + self.n_fft - 2 * (self.n_fft // 2)

    def __call__(self, spectrum: torch.Tensor) -> torch.Tensor:
        n_fft, hop = self.n_fft, self.hop_length
        if not spectrum.is_complex() or spectrum.dim() not in (2, 3):
            raise ValueError(f"expected a complex spectrum [bins, frames] or [channels, bins, frames], not {spectrum}")
        if spectrum.shape[-2] != n_fft // 2 + 1:
            raise ValueError(
                f"expected {n_fft // 2 + 1} frequency bins (onesided, n_fft {n_fft}), not {spectrum.shape[-2]}"
            )
        frames = spectrum.shape[-1]
        if self.output_samples(frames) <= 0:
            raise ValueError(f"{frames} frame(s) give no centred output with n_fft {n_fft} and hop {hop}")
        batched = spectrum if spectrum.dim() == 3 else spectrum.unsqueeze(0)
        signal_length = n_fft + hop * (frames - 1)
        frames_first = torch.view_as_complex(torch.view_as_real(batched.resolve_conj()).transpose(1, 2))
        windowed = torch.fft.irfft(frames_first, n=n_fft, dim=-1) * self.window.view(1, 1, n_fft)
        signal = torch.ops.aten.unfold_backward(windowed, [windowed.shape[0], signal_length], 1, n_fft, hop)
        squares = self.window.pow(2).expand(1, frames, n_fft)
        envelope = torch.ops.aten.unfold_backward(squares, [1, signal_length], 1, n_fft, hop)
        start, end = n_fft // 2, -(n_fft // 2)
        speech = signal[:, start:end] / envelope[:, start:end]
        return speech if spectrum.dim() == 3 else speech.squeeze(0)


def lowest_envelope(window: torch.Tensor, n_fft: int, hop_length: int) -> float:
    """The smallest |overlap-added window²| over the centred output, over every frame count from 2 on.

    With at least ceil(n_fft / hop) + 1 frames, every output sample is the sum of either the same partial
    overlap as at a shorter signal's ends or the full periodic overlap of the interior, so the frame counts
    up to twice that cover every count."""
    lowest = math.inf
    for frames in range(2, 2 * (math.ceil(n_fft / hop_length) + 1) + 1):
        length = n_fft + hop_length * (frames - 1)
        squares = window.pow(2).expand(1, frames, n_fft)
        envelope = torch.ops.aten.unfold_backward(squares, [1, length], 1, n_fft, hop_length)
        trimmed = envelope[:, n_fft // 2 : length - n_fft // 2]
        if trimmed.numel():
            lowest = min(lowest, float(trimmed.abs().min()))
    return lowest
