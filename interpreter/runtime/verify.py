"""Verify: stock eager streaming and the runtime side by side, every output compared with torch.equal.

The stock side is any object with `reset()` and `step(**inputs)` (one instant, same inputs as the
runtime's session). Both sides start from the same seed and keep their own RNG state, so random
draws inside a stage match. Both run under the process's own settings, as the stock loop does;
`deterministic=True` makes cuDNN deterministic for the run (`deterministic_cudnn`): with its default
algorithm choice two eager runs of the same convolution can differ in the last bits (measured on the H200).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.runtime.rng import get_rng_state, seeded_rng_state, set_rng_state


@attrs.frozen
class Mismatch:
    tick: int
    output: str
    max_abs_diff: float
    first_index: tuple[int, ...] | None
    detail: str


@attrs.frozen
class VerifyReport:
    """`ticks` compared; `equal` when every output of every tick was torch.equal."""

    ticks: int
    outputs: int
    mismatches: tuple[Mismatch, ...]
    runtime_counters: Any

    @property
    def equal(self) -> bool:
        return not self.mismatches

    @property
    def first(self) -> Mismatch | None:
        return self.mismatches[0] if self.mismatches else None

    def __str__(self) -> str:
        if self.equal:
            return f"bit-identical: {self.outputs} outputs over {self.ticks} ticks are torch.equal to stock eager"
        m = self.mismatches[0]
        return (
            f"NOT bit-identical: {len(self.mismatches)} of {self.outputs} outputs differ; first at tick {m.tick}, "
            f"output '{m.output}': {m.detail}"
        )


def compare(tick: int, name: str, expected: torch.Tensor, actual: torch.Tensor | None) -> Mismatch | None:
    """The mismatch of output `name` at `tick` (None: torch.equal); `actual` None: the output is missing."""
    if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return Mismatch(tick, name, float("nan"), None, f"got {type(actual).__name__}, expected a tensor")
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return Mismatch(
            tick,
            name,
            float("nan"),
            None,
            f"shape/dtype {tuple(actual.shape)} {actual.dtype} vs stock {tuple(expected.shape)} {expected.dtype}",
        )
    if torch.equal(expected, actual):
        return None
    difference = (expected.double() - actual.double()).abs()
    where = torch.nonzero(difference > 0)
    first = tuple(int(i) for i in where[0]) if len(where) else None
    largest = float(difference.max())
    return Mismatch(tick, name, largest, first, f"max abs diff {largest:.3g}, first differing element {first}")


def count_unequal(mine: Iterable[Iterable[torch.Tensor]], theirs: Iterable[Iterable[torch.Tensor]]) -> tuple[int, int]:
    """(outputs compared, outputs not `torch.equal`): output j of session i in both runs, per session."""
    compared = unequal = 0
    for outputs_mine, outputs_theirs in zip(mine, theirs):
        for output_mine, output_theirs in zip(outputs_mine, outputs_theirs):
            compared += 1
            unequal += not torch.equal(output_mine, output_theirs)
    return compared, unequal


@contextlib.contextmanager
def deterministic_cudnn():
    """cuDNN's deterministic algorithms (and no benchmark search) inside the block; the settings put back after."""
    previous = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous


def _as_dict(value: Any) -> dict[str, torch.Tensor]:
    if isinstance(value, Mapping):
        return dict(value)
    return {"output": value}


def verify(
    runtime,
    stock,
    inputs: Iterable[Mapping[str, torch.Tensor]] | Callable[[int], Mapping],
    ticks: int | None = None,
    seed: int = 0,
    deterministic: bool = False,
) -> VerifyReport:
    """Run `ticks` instants through `stock` and a fresh runtime session; compare every output. Both run under
    the process's cuDNN settings (the stock loop's own), or under deterministic cuDNN with `deterministic`."""
    device = runtime.device
    feed = inputs if callable(inputs) else list(inputs).__getitem__
    if ticks is None:
        if callable(inputs):
            raise ValueError("give ticks= when inputs is a function of the tick")
        ticks = len(list(inputs))
    mismatches: list[Mismatch] = []
    outputs = 0
    with deterministic_cudnn() if deterministic else contextlib.nullcontext(), torch.no_grad():
        session = (
            runtime.session(seed=seed)
            if not getattr(stock, "initial", None)
            else runtime.session(initial=stock.initial, seed=seed)
        )
        try:
            stock.reset()
            stock_rng = seeded_rng_state(seed, device)
            for tick in range(ticks):
                step_inputs = dict(feed(tick))
                saved = get_rng_state(device)
                set_rng_state(device, stock_rng)
                expected = _as_dict(stock.step(**step_inputs))
                stock_rng = get_rng_state(device)
                set_rng_state(device, saved)
                actual = session.step(**step_inputs)
                actual = (
                    _as_dict(actual)
                    if isinstance(actual, Mapping) or len(expected) != 1
                    else {next(iter(expected)): actual}
                )
                if list(expected) == ["output"] and "output" not in actual:
                    raise ValueError(
                        f"the stock step returned one tensor, the session {', '.join(sorted(actual))}: with several "
                        "outputs the stock step returns a dict keyed by output name"
                    )
                for name, value in expected.items():
                    outputs += 1
                    found = compare(tick, name, value, actual.get(name))
                    if found is not None:
                        mismatches.append(found)
            counters = session.counters
        finally:
            session.close()
    return VerifyReport(ticks, outputs, tuple(mismatches), counters)
