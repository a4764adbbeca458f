"""Audio on the wire: PCM16 (signed 16-bit little-endian mono) in base64, and streaming sample-rate conversion.

A client sends and receives PCM16 at any rate it declares; the engine takes float32 at its input rate and gives
float32 at its output rate. `Resampler` converts a stream chunk by chunk with soxr's streaming resampler (its
output does not depend on how the stream was cut into chunks); `UnitBuffer` cuts the engine-rate stream into
units.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

PCM16_SCALE = 32768.0
"""float32 = int16 / 32768 on the way in; int16 = round(clip(float32, -1, 1) * 32767) on the way out."""
RATES = (8000, 96000)
"""The sample rates a client may declare (inclusive)."""


class AudioError(ValueError):
    """Audio a client sent that cannot be read: what is wrong with it."""


def decode_pcm16(text: object) -> np.ndarray:
    """The float32 samples of base64 PCM16 `text`; AudioError saying what is wrong (nothing else happens)."""
    if not isinstance(text, str):
        raise AudioError(f"audio must be a base64 string, not {type(text).__name__}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AudioError("audio is not valid base64") from None
    if len(data) % 2:
        raise AudioError(f"PCM16 audio has an even number of bytes (2 a sample), not {len(data)}")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / PCM16_SCALE


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float32 samples as int16 (clipped to [-1, 1], scaled by 32767, rounded to nearest)."""
    return np.rint(np.clip(samples, -1.0, 1.0) * (PCM16_SCALE - 1)).astype("<i2")


def encode_pcm16(samples: np.ndarray) -> str:
    """float32 samples as base64 PCM16 (`to_pcm16`)."""
    return base64.b64encode(to_pcm16(samples).tobytes()).decode("ascii")


def pcm16_samples(text: str) -> np.ndarray:
    """The int16 samples of base64 PCM16 `text` (what a client plays)."""
    return np.frombuffer(base64.b64decode(text), dtype="<i2")


def rate_problem(rate: object) -> str | None:
    """Why `rate` cannot be a stream's sample rate (None: it can)."""
    if isinstance(rate, bool) or not isinstance(rate, int):
        return f"a rate is a whole number of samples per second, not {rate!r}"
    if not RATES[0] <= rate <= RATES[1]:
        return f"a rate is from {RATES[0]} to {RATES[1]} samples per second, not {rate}"
    return None


class Resampler:
    """One stream from `source` to `target` samples per second (the identity when they are equal)."""

    def __init__(self, source: int, target: int):
        self.source = source
        self.target = target
        self._stream = None if source == target else soxr.ResampleStream(source, target, 1, dtype="float32")
        self.taken = 0
        """Samples the stream was given."""
        self.given = 0
        """Samples it gave back."""

    def __call__(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """The next converted samples of the stream; `last` flushes what the filter holds back."""
        self.taken += len(samples)
        if self._stream is not None:
            samples = self._stream.resample_chunk(np.ascontiguousarray(samples, dtype=np.float32), last=last)
        self.given += len(samples)
        return samples

    def most(self, count: int) -> int:
        """At most how many samples the stream gives after `count` more samples, flushed or not (the identity:
        exactly `count`)."""
        if self._stream is None:
            return count
        # soxr's whole output is at most ceil(input x ratio); 2 more allow for its rounding.
        ceiling = -(-(self.taken + count) * self.target // self.source)
        return max(0, ceiling + 2 - self.given)


class UnitBuffer:
    """Samples at the engine's input rate, cut into units of `unit_samples`."""

    def __init__(self, unit_samples: int):
        self.unit_samples = unit_samples
        self._chunks: list[np.ndarray] = []
        self.samples = 0

    def add(self, samples: np.ndarray) -> list[np.ndarray]:
        """Append `samples`; the units they complete, in order."""
        if len(samples):
            self._chunks.append(samples)
            self.samples += len(samples)
        units = []
        while self.samples >= self.unit_samples:
            whole = np.concatenate(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
            units.append(np.ascontiguousarray(whole[: self.unit_samples], dtype=np.float32))
            rest = whole[self.unit_samples :]
            self._chunks = [rest] if len(rest) else []
            self.samples = len(rest)
        return units

    def pad(self) -> np.ndarray | None:
        """The partial unit completed with silence (None when nothing is buffered); the buffer is then empty."""
        if not self.samples:
            return None
        (unit,) = self.add(np.zeros(self.unit_samples - self.samples, dtype=np.float32))
        return unit

    def clear(self) -> int:
        """Drop the partial unit; the samples dropped."""
        dropped = self.samples
        self._chunks, self.samples = [], 0
        return dropped
