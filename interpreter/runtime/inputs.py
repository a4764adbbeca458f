"""A step's inputs against the plan: the planned instant they repeat, or the instant they make (checked).

Everything here runs before a step changes anything: a bad input is a `StepError` and the session is
exactly as before the call.

Public: `template_index`, `plan_instant`, `input_regions`, `check_initial`, `refuse_non_finite`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.off_plan import over_capacity
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.trace import Firing, Simulator
from duplexcadence.interpreter.runtime.binding import describe
from duplexcadence.interpreter.runtime.capture.strategy import StepTemplate
from duplexcadence.interpreter.runtime.errors import StepError
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES


def template_index(
    plan: Plan,
    templates: Sequence[StepTemplate],
    device: torch.device,
    instant: int,
    args: tuple,
    inputs: dict[str, torch.Tensor],
) -> int | None:
    """The planned instant (index into `templates`, `templates_of(plan)`) that a step at `instant` repeats,
    if the inputs are exactly the planned ones on `device`; a positional input is then named in `inputs`."""
    index = plan.trace.planned_index(instant)
    if index is None or index >= len(templates):
        return None
    template = templates[index]
    named = inputs
    if args:
        if len(args) != 1 or len(template.inputs) != 1 or inputs:
            return None
        named = {next(iter(template.inputs)): args[0]}
    if named.keys() != template.inputs.keys():
        return None
    for name, tensor in named.items():
        if (
            not isinstance(tensor, torch.Tensor)
            or tensor.is_nested
            or tensor.layout != torch.strided
            or tuple(tensor.shape) != template.inputs[name]
            or tensor.dtype != TORCH_DTYPES[plan.program.regions[name].dtype]
            or tensor.device != device
        ):
            return None
    inputs.update(named)  # only on a match: the off-plan path names a positional input itself
    return index


def input_regions(program: Program, simulator: Simulator, instant: int) -> dict[str, str]:
    """Input regions fed at `instant`, mapped to the stage that reads them."""
    fed: dict[str, str] = {}
    for stage in simulator.stages_at(instant):
        for access in program.stages[stage].accesses:
            if access.kind == "read" and program.regions[access.region].role == "input":
                fed.setdefault(access.region, stage)
    return fed


def plan_instant(
    plan: Plan,
    device: torch.device,
    simulator: Simulator,
    instant: int,
    args: tuple,
    inputs: dict[str, torch.Tensor],
    last: bool,
) -> tuple[list[Firing], Simulator, bool]:
    """The firings of `instant` for these inputs (on `device`), traced on a copy of `simulator`: (firings,
    the simulator after the instant, whether the instant is off the plan). StepError for inputs it cannot
    take; a positional input is named in `inputs`."""
    program = plan.program
    expected = input_regions(program, simulator, instant)
    if args:
        if len(args) != 1 or len(expected) != 1 or inputs:
            raise StepError(f"pass inputs by name: this instant takes {_names(expected)}")
        inputs[next(iter(expected))] = args[0]
    unknown = sorted(set(inputs) - set(expected))
    missing = sorted(set(expected) - set(inputs))
    if unknown or missing:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(missing))
        if unknown:
            parts.append("unexpected " + ", ".join(unknown))
        raise StepError(f"step() at instant {instant}: {'; '.join(parts)}; this instant takes {_names(expected)}")
    override: dict[str, int] = {}
    probe = simulator.copy()
    # each fed input's planned units (a feed's length is always known)
    planned = {
        v.region: v.length
        for f in probe.copy().run_instant(instant)
        for v in f.views
        if v.kind == "feed" and v.length is not None
    }
    for name, tensor in inputs.items():
        region = program.regions[name]
        problem = _input_problem(region, tensor, device)
        if problem:
            raise StepError(
                f"step() input '{name}': {problem}; expected {_expected(region, planned[name])} on {device}"
            )
        assert region.time_axis is not None, "an input region has a time axis"
        units = tensor.shape[region.time_axis]
        if units == 0 and planned[name] > 0 and not (last and _lookahead(program, simulator, instant, name)):
            raise StepError(
                f"step() input '{name}' has no units; this instant takes {_expected(region, planned[name])} "
                f"on {device} (an instant with fewer units, down to 1, is a shorter one)"
            )
        if units != planned[name]:
            override[name] = units
    try:
        firings = probe.run_instant(instant, override, last=last)
    except ValueError as error:
        raise StepError(f"step() at instant {instant}: {error}") from error
    off_plan = bool(override) or last or plan.trace.planned_index(instant) is None
    over = over_capacity(plan.schedule, firings)
    if over is not None:
        view, needed, capacity = over
        region = program.regions[view.region]
        longer = [
            f"'{name}' has {messages.units(count)} where the plan feeds {planned[name]}"
            for name, count in sorted(override.items())
            if count > planned[name]
        ]
        cause = (
            f"input {', '.join(longer)}: feed at most the planned units an instant"
            if longer
            else "the session has reached the end of what its .clock plans for: reset() it, or declare "
            "a longer retention or horizon"
        )
        raise StepError(
            f"step() at instant {instant}: region '{view.region}' would hold {needed} "
            f"units, over its capacity of {capacity} ({region.retention.describe()}); {cause}"
        )
    return firings, probe, off_plan


def check_initial(program: Program, initial: Mapping[str, torch.Tensor], device: torch.device | None = None) -> None:
    """StepError unless `initial` gives exactly the `start given` regions, each at its declared start, as a
    dense tensor with data (not on the meta device), on the CPU or on `device`."""
    given = {n: r for n, r in program.regions.items() if r.start == "given"}
    for name in initial:
        if name not in given:
            raise StepError(
                f"initial value for '{name}', which is not a region declared `start given`; "
                f"those are: {_names(given) or 'none'}"
            )
    missing = sorted(set(given) - set(initial))
    if missing:
        raise StepError(f"the session needs initial values for {', '.join(missing)} (declared `start given`)")
    for name, tensor in initial.items():
        region = given[name]
        want = region.shape if region.fixed else region.shape_at(region.start_length)
        expected = f"{region.dtype}[{', '.join(map(str, want))}]"
        if isinstance(tensor, torch.Tensor):
            problem = _layout_problem(tensor)
            if problem is None and tensor.device.type == "meta":
                problem = "on the meta device, which holds no values"
            elif problem is None and device is not None and tensor.device.type not in ("cpu", device.type):
                problem = f"on {tensor.device}, neither the CPU nor the runtime's {device}"
            if problem is not None:
                raise StepError(f"initial value for '{name}' is {problem}; expected a dense {expected}")
        if (
            not isinstance(tensor, torch.Tensor)
            or tuple(tensor.shape) != tuple(want)
            or tensor.dtype != TORCH_DTYPES[region.dtype]
        ):
            raise StepError(f"initial value for '{name}' is {describe(tensor)}; expected {expected}")


def refuse_non_finite(inputs: Mapping[str, torch.Tensor]) -> None:
    """StepError naming the first input with a NaN or an infinite value (floating-point inputs; one host
    read each): what `check_finite=True` adds to a step."""
    for name, tensor in sorted(inputs.items()):
        if not tensor.is_floating_point():
            continue
        bad = int((~torch.isfinite(tensor)).sum())
        if bad:
            nans = int(torch.isnan(tensor).sum())
            raise StepError(
                f"step() input '{name}' has {bad} non-finite value(s) ({nans} NaN, {bad - nans} infinite); "
                "check_finite refuses them (load without it to let them propagate, as the stock model does)"
            )


def _layout_problem(tensor: torch.Tensor) -> str | None:
    """Why a tensor cannot be copied into a region's dense memory, or None."""
    if tensor.is_nested:
        return "a nested tensor"
    if tensor.layout != torch.strided:
        return f"a tensor of layout {tensor.layout} (sparse)"
    return None


def _lookahead(program: Program, simulator: Simulator, instant: int, name: str) -> int:
    """The most units a read of input `name` at `instant` holds back as lookahead (what `finish()` releases)."""
    return max(
        (
            access.lookahead
            for stage in simulator.stages_at(instant)
            for access in program.stages[stage].accesses
            if access.region == name and access.kind == "read"
        ),
        default=0,
    )


def _names(regions) -> str:
    return ", ".join(sorted(regions)) or "no inputs"


def _expected(region, length: int) -> str:
    return f"{region.dtype}[{', '.join(map(str, region.shape_at(length)))}]"


def _input_problem(region, tensor: Any, device: torch.device) -> str | None:
    if not isinstance(tensor, torch.Tensor):
        return f"got {type(tensor).__name__}, not a tensor"
    layout = _layout_problem(tensor)
    if layout is not None:
        return f"got {layout}; give a dense (strided) tensor" + (
            ", e.g. tensor.to_dense()" if not tensor.is_nested else ""
        )
    if tensor.dtype != TORCH_DTYPES[region.dtype]:
        return f"dtype {describe(tensor)}"
    if tensor.device != device and not (tensor.device.type == device.type == "cuda" and device.index is None):
        return f"on {tensor.device}"
    if tensor.dim() != len(region.shape):
        return f"got {describe(tensor)}"
    for axis, dim in enumerate(region.shape):
        if dim is not None and tensor.shape[axis] != dim:
            return f"got {describe(tensor)}"
    return None
