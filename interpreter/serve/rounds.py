"""The tail's round: what a `pool.SessionPool`'s scheduler runs on the device thread.

`TailRounds` is the `scheduler.RoundRunner` of a tail's sessions: a round's controls (a reset, a close) and
then one step of every session with a tick, through the pool's mode (`modes.py`: `lanes`, a runtime session
per slot; `lockstep`, a row of a group, or a bundle's group stepped whole). It also times the calibration
rounds admission's tick model is fitted to, and checks a tick's inputs against the plan before it is
queued (`InputCheck`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.admission import TickModel, fit
from duplexcadence.interpreter.serve.metrics import PoolMetrics
from duplexcadence.interpreter.serve.modes import StepResult, TensorSpec, WholeGroup
from duplexcadence.interpreter.serve.scheduler import RESET, Round, RoundOutcome, TickError

REPORT_EVERY_S = 1.0
"""How often a round takes the runtime's report (graph replays, eager firings) into the metrics."""
ACCEPTED_KINDS = 1024


class TailRounds:
    """The rounds of a tail's sessions through `mode` (a `modes` strategy; sessions carry its handle)."""

    def __init__(self, mode: Any, metrics: PoolMetrics, report: Callable[[], Any]):
        self.mode = mode
        self.unit = mode.unit
        self.metrics = metrics
        self.report = report
        self.report_at = 0.0

    def run(self, work: Round) -> RoundOutcome:
        """On the device thread: the controls, then one step of every tick."""
        mode = self.mode
        controls: list[tuple[Any, Any, BaseException | None]] = []
        for session, item in work.controls:
            try:
                if item.kind == RESET:
                    for member in session.covered_by(item):
                        member.handle = mode.reset(member.handle)
                else:
                    mode.leave(session.handle)
                controls.append((session, item, None))
            except Exception as error:
                controls.append((session, item, error))
        ticks: list[tuple[Any, Any, Any]] = []
        failed: dict[Any, str] = {}
        started = time.perf_counter()
        units = 0
        if work.ticks:
            keys = [WholeGroup(session.handle.group) if item.whole else session.handle for session, item in work.ticks]
            result = mode.step([(key, item.inputs, item.last) for key, (_, item) in zip(keys, work.ticks, strict=True)])
            failed = result.failed
            for key, (session, item) in zip(keys, work.ticks, strict=True):
                value = result.errors.get(key) or result.outputs.get(key)
                ticks.append((session, item, value))
            units = len({getattr(session.handle, "group", session.handle) for session, _ in work.ticks})
        done_at = time.perf_counter()
        if done_at - self.report_at > REPORT_EVERY_S:
            self.metrics.take_report(self.report())
            self.report_at = time.perf_counter()
        return RoundOutcome(controls, ticks, failed, done_at - started, done_at, units, started)


def calibrate(
    mode: Any,
    lanes: int,
    inputs_of: Callable[[int, int], dict[str, torch.Tensor]],
    sizes: tuple[int, ...] | None,
    warmup: int,
    repeats: int,
) -> TickModel:
    """On the device thread: the tick model fitted to rounds of `sizes` units (None: 1, min(units, 2 x lanes)
    and every unit), after `warmup` rounds, the median of `repeats` rounds each."""
    units = mode.units()
    # the full pool too: past a few units a round can cost more per unit (the device saturates), and
    # admission decides at the top of the range
    sizes = sizes or tuple(sorted({1, min(units, max(2, 2 * lanes)), units}))
    sizes = tuple(sorted({min(max(size, 1), units) for size in sizes}))
    opened = mode.calibration_units(max(sizes))
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    try:
        for _ in range(warmup):
            calibration_round(mode, mode.unit_ticks(opened, inputs_of))
        for _ in range(repeats):
            for size in sizes:
                samples[size].append(calibration_round(mode, mode.unit_ticks(opened[:size], inputs_of)))
    finally:
        mode.release_calibration(opened)
    return fit([(size, statistics.median(times)) for size, times in samples.items()], mode.unit)


def calibration_round(mode: Any, ticks: list) -> float:
    started = time.perf_counter()
    result: StepResult = mode.step(ticks)
    elapsed = time.perf_counter() - started
    if result.errors:
        error = next(iter(result.errors.values()))
        raise RuntimeError(f"the calibration's ticks failed: {error.message}")
    return elapsed


class InputCheck:
    """A tick's inputs against one session's specs, before it is queued: what the runtime checks at the
    instant it checks itself."""

    def __init__(
        self,
        specs: list[TensorSpec],
        always_fed: list[str],
        lockstep: bool,
        bounds: Mapping[str, tuple[int, int]] | None = None,
    ):
        self.specs = {spec.name: spec for spec in specs}
        self.always_fed = always_fed
        self.lockstep = lockstep
        self.bounds = dict(bounds or {}) if lockstep else {}
        """In lockstep, each input's least and most value (`ServedTail.input_bounds`)."""
        self.accepted: set[tuple[str, torch.dtype, torch.Size]] = set()
        """(input, dtype, shape) that passed the checks (a stream repeats them: they are checked once)."""

    def __call__(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> None:
        """TickError (unknown-input, missing-input, wrong-dtype, wrong-shape, bad-input) for a tick the tail
        cannot take."""
        specs = self.specs
        names = list(specs)
        for name in inputs:
            if name not in specs:
                raise TickError(messages.UNKNOWN_INPUT, messages.unknown_input(name, names))
        missing = [name for name in self.always_fed if name not in inputs]
        if missing:
            raise TickError(messages.MISSING_INPUT, messages.missing_input(missing, names))
        if last and self.lockstep:
            raise TickError(messages.BAD_INPUT, messages.no_last_in_lockstep())
        for name, tensor in inputs.items():
            if (name, tensor.dtype, tensor.shape) in self.accepted:
                continue
            spec = specs[name]
            found = codec.DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype))
            if found != spec.dtype:
                raise TickError(messages.WRONG_DTYPE, messages.wrong_dtype(name, found, spec.dtype))
            shape = tuple(tensor.shape)
            problem = shape_problem(spec, shape, self.lockstep)
            if problem:
                raise TickError(messages.WRONG_SHAPE, messages.wrong_shape(name, shape, spec.declared(), problem))
            if len(self.accepted) >= ACCEPTED_KINDS:
                self.accepted.clear()
            self.accepted.add((name, tensor.dtype, tensor.shape))
        self.values(inputs)

    def values(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """TickError (bad-input) for an input with a value outside its bounds (vectorised: one pass each)."""
        for name, (least, most) in self.bounds.items():
            tensor = inputs.get(name)
            if tensor is None or tensor.numel() == 0:
                continue
            low, high = torch.aminmax(tensor)
            if low.item() < least or high.item() > most:
                found = low.item() if low.item() < least else high.item()
                raise TickError(messages.BAD_INPUT, messages.out_of_bounds(name, found, least, most))


def shape_problem(spec: TensorSpec, shape: tuple[int, ...], exact_units: bool) -> str | None:
    """Why a tensor of `shape` cannot be `spec`'s input (None: it can, as far as the shape goes)."""
    if len(shape) != len(spec.shape):
        return f"{len(spec.shape)} dimensions, not {len(shape)}"
    for axis, (found, declared) in enumerate(zip(shape, spec.shape)):
        if axis == spec.time_axis:
            if found < 1:
                return f"dimension {axis} (time) needs at least 1 unit"
            if exact_units and spec.units is not None and found != spec.units:
                return f"dimension {axis} (time) must be {spec.units} in a lockstep group"
        elif declared is not None and found != declared:
            return f"dimension {axis} must be {declared}"
    return None
