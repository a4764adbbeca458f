"""Verify against offline: a streaming run's outputs, end of stream included, against one offline call.

A streaming tail decodes chunk by chunk; its stock model can also decode a whole utterance in one call.
`verify_offline` runs the stream (a DuplexCadence runtime, a session, or any stock loop with `step`),
concatenates what every step returned and what the end of the stream releases (`end`: the last input
through `finish`, or after every step a `finish` with no new input, as the plan's sample accounting
counts a session that holds units back), and compares that with one offline call over the whole input:

* the lengths: a stream that loses units at its boundaries is shorter (Qwen3-Omni's stock 1 s loop:
  555 samples per boundary);
* `torch.equal` where the lengths agree; else, or as well, the largest absolute difference over the
  samples both have and where it is, and the same split at the boundaries between steps: the largest
  difference in a window around each boundary against the largest away from every boundary. A
  stream whose boundaries click differs most near them; one that only rounds differently differs
  alike everywhere.

The plan's sample accounting (`dsl plan`, Samples) says the lengths from the declared rates; this
measures them, and the values, on the model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.runtime.verify import deterministic_cudnn

StepInput = torch.Tensor | Mapping[str, torch.Tensor]


@attrs.frozen
class BoundaryDifference:
    """The largest absolute difference within `window` units of one boundary between two steps."""

    boundary: int
    """1 for the boundary between the first and the second step."""
    position: int
    """The stream's units before it."""
    max_abs_diff: float


@attrs.frozen
class OfflineReport:
    """A stream's concatenated outputs against one offline call over the same input.

    Differences are over the first `compared` units (those both have), as float64; `max_at` is the
    first position of the largest. `near_boundaries` / `away_from_boundaries`: the largest difference
    within `window` units of a boundary, and elsewhere (nan where there is no such unit). `offline_rms`:
    the offline output's root mean square over those units, the scale the differences compare with."""

    steps: int
    stream_length: int
    offline_length: int
    equal: bool
    compared: int
    max_abs_diff: float
    max_at: int | None
    window: int
    near_boundaries: float
    away_from_boundaries: float
    boundaries: tuple[BoundaryDifference, ...]
    offline_rms: float = float("nan")

    @property
    def length_difference(self) -> int:
        """Units the stream is short of the offline call (negative: longer)."""
        return self.offline_length - self.stream_length

    @property
    def lengths_equal(self) -> bool:
        return self.stream_length == self.offline_length

    def __str__(self) -> str:
        if self.equal:
            return f"equal: {self.steps} steps, {self.stream_length} units, torch.equal to one offline call"
        length = (
            f"{self.stream_length} units, as long as the offline call"
            if self.lengths_equal
            else f"{self.stream_length} units, {abs(self.length_difference)} "
            f"{'fewer' if self.length_difference > 0 else 'more'} than the offline call's {self.offline_length}"
        )
        return (
            f"{self.steps} steps: {length}; max abs diff {self.max_abs_diff:.3g} at {self.max_at}; "
            f"within {self.window} units of its {len(self.boundaries)} boundaries {self.near_boundaries:.3g}, "
            f"away from them {self.away_from_boundaries:.3g} (offline rms {self.offline_rms:.3g})"
        )

    def to_json(self) -> dict:
        def number(value: float) -> float | None:
            return None if math.isnan(value) else value

        return {
            "steps": self.steps,
            "stream_length": self.stream_length,
            "offline_length": self.offline_length,
            "length_difference": self.length_difference,
            "equal": self.equal,
            "compared": self.compared,
            "max_abs_diff": number(self.max_abs_diff),
            "max_at": self.max_at,
            "window": self.window,
            "near_boundaries": number(self.near_boundaries),
            "away_from_boundaries": number(self.away_from_boundaries),
            "boundaries": [[b.boundary, b.position, number(b.max_abs_diff)] for b in self.boundaries],
            "offline_rms": number(self.offline_rms),
        }


def _pick(value: Any, output: str | int | None) -> torch.Tensor:
    """The output tensor of one step: the tensor, or `output` of a dict or a tuple."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        if output is None:
            if len(value) != 1:
                raise ValueError(f"the stream returns {sorted(value)}: say which with output=")
            return next(iter(value.values()))
        return value[output]
    if isinstance(value, Sequence) and isinstance(output, int):
        return value[output]
    raise ValueError(f"the stream returned {type(value).__name__}: give output= (a name or an index)")


def _call(method: Callable[..., Any], item: StepInput) -> Any:
    return method(**item) if isinstance(item, Mapping) else method(item)


@contextlib.contextmanager
def _stepper(stream: Any, seed: int):
    """A runtime opens a fresh session (closed after); a session or a stock loop is used as it is."""
    if callable(getattr(stream, "session", None)) and hasattr(stream, "plan"):
        session = stream.session(seed=seed)
        try:
            yield session
        finally:
            session.close()
    else:
        yield stream


ENDS = ("finish", "flush", "step")
"""How a stream ends: its last input through `finish`; every input through `step`, then a `finish` with
no new input (`flush`); or every input through `step` and nothing more. A stream without `finish`
(a stock loop) steps every input either way."""


def _empty(item: StepInput, axis: int) -> StepInput:
    """`item` with no unit left on its time axis: the input of an end of stream that brings nothing new."""
    if isinstance(item, Mapping):
        return {name: value.narrow(axis, 0, 0) for name, value in item.items()}
    return item.narrow(axis, 0, 0)


def stream_outputs(
    stream: Any,
    inputs: Sequence[StepInput],
    output: str | int | None = None,
    end: str = "finish",
    seed: int = 0,
    axis: int = -1,
) -> list[torch.Tensor]:
    """Every step's output of `stream` over `inputs` (one step each: a tensor, passed positionally,
    or a dict of them, by name), ended as `end` says (ENDS); with `flush`, the last item is what the
    end of the stream released."""
    if end not in ENDS:
        raise ValueError(f"end must be one of {', '.join(ENDS)}, not {end!r}")
    chunks: list[torch.Tensor] = []
    with _stepper(stream, seed) as stepper, torch.no_grad():
        finishes = callable(getattr(stepper, "finish", None)) and end != "step"
        for index, item in enumerate(inputs):
            last = finishes and end == "finish" and index == len(inputs) - 1
            value = _call(stepper.finish if last else stepper.step, item)
            chunks.append(_pick(value, output).detach().clone())
        if finishes and end == "flush" and inputs:
            chunks.append(_pick(_call(stepper.finish, _empty(inputs[-1], axis)), output).detach().clone())
    return chunks


def whole_input(inputs: Sequence[StepInput], axis: int = -1) -> StepInput:
    """The steps' inputs concatenated along their time axis: what one offline call gets."""
    if not inputs:
        raise ValueError("no input: give at least one step")
    named = [item for item in inputs if isinstance(item, Mapping)]
    tensors = [item for item in inputs if isinstance(item, torch.Tensor)]
    if len(named) == len(inputs):
        return {name: torch.cat([item[name] for item in named], dim=axis) for name in named[0]}
    if len(tensors) != len(inputs):
        raise ValueError("give every step's input as a tensor, or every one as a dict of tensors by name")
    return torch.cat(tensors, dim=axis)


def compare_offline(
    chunks: Sequence[torch.Tensor], offline: torch.Tensor, axis: int = -1, window: int | None = None
) -> OfflineReport:
    """Compare a stream's per-step outputs (concatenated along `axis`) with one offline call's output.
    `window`: units on each side of a boundary that count as near it (default: a tenth of the shortest
    step's output, at least 1)."""
    if not chunks:
        raise ValueError("no step output to compare")
    lengths = [chunk.shape[axis] for chunk in chunks]
    if window is None:
        window = max(min(lengths) // 10, 1)
    stream = torch.cat(list(chunks), dim=axis)
    stream_length, offline_length = stream.shape[axis], offline.shape[axis]
    equal = stream.shape == offline.shape and stream.dtype == offline.dtype and torch.equal(stream, offline)
    compared = min(stream_length, offline_length)
    a = stream.narrow(axis, 0, compared).detach().to(device="cpu", dtype=torch.float64)
    b = offline.narrow(axis, 0, compared).detach().to(device="cpu", dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(
            f"the stream's outputs {tuple(stream.shape)} and the offline output {tuple(offline.shape)} differ "
            "in more than their time axis"
        )
    per_unit = (a - b).abs().movedim(axis, -1).reshape(-1, compared).amax(dim=0) if compared else torch.zeros(0)
    positions = list(_cumulative(lengths))[:-1]
    near = torch.zeros(compared, dtype=torch.bool)
    boundaries = []
    for number, position in enumerate(positions, start=1):
        low, high = max(position - window, 0), min(position + window, compared)
        if low < high:
            near[low:high] = True
        boundaries.append(BoundaryDifference(number, position, _largest(per_unit[low:high])))
    largest = _largest(per_unit)
    max_at = int(torch.argmax(per_unit)) if compared else None
    return OfflineReport(
        len(chunks),
        stream_length,
        offline_length,
        bool(equal),
        compared,
        largest,
        max_at,
        window,
        _largest(per_unit[near]),
        _largest(per_unit[~near]),
        tuple(boundaries),
        float(b.pow(2).mean().sqrt()) if compared else float("nan"),
    )


def _cumulative(lengths: Sequence[int]):
    total = 0
    for length in lengths:
        total += length
        yield total


def _largest(values: torch.Tensor) -> float:
    return float(values.max()) if values.numel() else float("nan")


def verify_offline(
    stream: Any,
    offline: Callable[..., torch.Tensor],
    inputs: Sequence[StepInput],
    output: str | int | None = None,
    axis: int = -1,
    window: int | None = None,
    end: str = "finish",
    seed: int = 0,
) -> OfflineReport:
    """Run `stream` over `inputs`, one step each, ended as `end` says (`stream_outputs`), and one `offline`
    call over the whole input (`whole_input`: a tensor positionally, a dict by name); compare
    (`compare_offline`; a flush's output counts as the last step's, its boundary as one).

    `stream`: a `Runtime` (a fresh session with `seed`), a session, or a stock streaming loop.
    `offline`: the stock model's whole-utterance call, e.g. the tail's `offline` bound to its model."""
    with deterministic_cudnn():
        chunks = stream_outputs(stream, inputs, output, end, seed, axis)
        whole = whole_input(inputs, axis)
        with torch.no_grad():
            reference = _call(offline, whole)
    return compare_offline(chunks, _pick(reference, output), axis, window)
