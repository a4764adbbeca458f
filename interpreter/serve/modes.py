"""How a pool's sessions map onto the runtime, one strategy per mode, chosen by name (`MODES`).

* `lanes`: a session is a runtime session in its own slot; a round is one `Runtime.step_many` over the sessions
  with a tick (sessions of different lanes run concurrently).
* `lockstep`: a session is a row of a `LockstepGroup` (a runtime session at batch `rows`); a round is one
  `Runtime.step_many` over the groups whose members all have a tick, each group's inputs batched along the
  region's batch axis (idle rows get zeros, as `LockstepGroup.step` feeds them) and its outputs split by row.

Every method runs on the pool's device thread. A handle is what a mode gives a session: a runtime `Session`, or
a `Member` of a group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

import duplexcadence
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.scheduler import TickError
from duplexcadence.interpreter.serve.tail import LoadedTail


@attrs.frozen(eq=False)
class WholeGroup:
    """A lockstep group's tick given whole: its inputs already batched over every row (a bundle that holds
    every row of the group, in row order), its outputs returned batched."""

    group: Any


@attrs.frozen
class TensorSpec:
    """One input or output of a session: its region's dtype and its shape for one session (None on the time
    axis; 1 on a lockstep group's batch axis), with the units a session's first tick carries."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    time_axis: int | None
    units: int | None

    @property
    def first_shape(self) -> tuple[int, ...]:
        """The shape of a session's first tick (the time axis at the planned units)."""
        dims = []
        for axis, dim in enumerate(self.shape):
            dims.append((self.units or 0) if axis == self.time_axis or dim is None else dim)
        return tuple(dims)

    def declared(self) -> str:
        dims = ", ".join("time" if axis == self.time_axis else str(dim) for axis, dim in enumerate(self.shape))
        return f"{self.dtype}[{dims}]"

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.first_shape), "time_axis": self.time_axis}


@attrs.frozen
class StepResult:
    """A round's outcome by handle: outputs (host tensors by output name), ticks refused or failed, and the
    handles whose session is now failed (a stage raised), with the cause."""

    outputs: dict[Any, dict[str, torch.Tensor]]
    errors: dict[Any, TickError]
    failed: dict[Any, str]


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


class PlanFacts:
    """What the pool reads from the runtime's plan: the tick period, each traced instant's fed inputs and
    written outputs, the input and output specs of one session."""

    def __init__(self, runtime: Any, batch_axes: Mapping[str, int | None] | None = None):
        plan = runtime.plan
        program = plan.program
        self.plan = plan
        clocks = plan.clocks
        self.tick_period_s = float(clocks.hyperperiod / len(clocks.instants))
        self.feeds: list[dict[str, tuple[int, ...]]] = []
        self.written: list[list[str]] = []
        for firings in plan.trace.by_instant():
            self.feeds.append({v.region: tuple(v.shape) for f in firings for v in f.views if v.kind == "feed"})
            self.written.append(
                [
                    v.region
                    for f in firings
                    for v in f.views
                    if v.kind == "write" and program.regions[v.region].role == "output"
                ]
            )
        self.batch_axes = dict(batch_axes or {})
        first = self.feeds[0] if self.feeds else {}
        first_writes = plan.trace.by_instant()[0] if plan.trace.firings else []
        written = {v.region: v.length for f in first_writes for v in f.views if v.kind == "write" and v.length}
        self.inputs = [self._spec(region, first) for region in program.regions.values() if region.role == "input"]
        self.outputs = [
            self._spec(region, {}, written.get(region.name))
            for region in program.regions.values()
            if region.role == "output"
        ]
        fed = [set(feeds) for feeds in self.feeds]
        self.always_fed = sorted(set.intersection(*fed)) if fed else []
        self.most_units: dict[str, int] = {}
        """The most time units the plan feeds each input at one instant (an input with a time axis)."""
        for feeds in self.feeds:
            for name, shape in feeds.items():
                axis = program.regions[name].time_axis
                if axis is not None:
                    self.most_units[name] = max(self.most_units.get(name, 0), shape[axis])

    def _spec(self, region: Any, first: Mapping[str, tuple[int, ...]], written: int | None = None) -> TensorSpec:
        shape = list(region.shape)
        axis = self.batch_axes.get(region.name)
        if axis is not None:
            shape[axis] = 1
        units = None
        if region.time_axis is not None:
            units = first[region.name][region.time_axis] if region.name in first else (written or 1)
        return TensorSpec(region.name, region.dtype, tuple(shape), region.time_axis, units)

    def planned(self, instant: int) -> int | None:
        return self.plan.trace.planned_index(instant)

    def output_names(self, instant: int) -> list[str]:
        """The output regions written at `instant` (a runtime step returns a bare tensor for one)."""
        index = self.planned(instant)
        if index is not None and index < len(self.written):
            return self.written[index]
        return [spec.name for spec in self.outputs]

    def zeros(self, instant: int) -> dict[str, torch.Tensor]:
        """Zeros of the planned inputs of one session at `instant` (a lockstep member's batch axis 1)."""
        index = self.planned(instant)
        feeds = self.feeds[index] if index is not None and index < len(self.feeds) else self.feeds[-1]
        tensors = {}
        for name, shape in feeds.items():
            spec = next(s for s in self.inputs if s.name == name)
            dims = list(shape)
            axis = self.batch_axes.get(name)
            if axis is not None:
                dims[axis] = 1
            tensors[name] = torch.zeros(dims, dtype=TORCH_DTYPES[spec.dtype])
        return tensors


def named_outputs(value: Any, names: Sequence[str]) -> dict[str, torch.Tensor]:
    if isinstance(value, Mapping):
        return dict(value)
    return {names[0] if names else "output": value}


def to_device(
    inputs: Mapping[Any, Mapping[str, torch.Tensor]], device: torch.device
) -> dict[Any, dict[str, torch.Tensor]]:
    """Every input on `device` (by handle, then by name, in their order). To an accelerator the host tensors of
    one dtype travel in one copy (concatenated flat, then split into views of their shapes) instead of one
    synchronous copy each."""
    if device.type == "cpu":
        return {handle: {name: tensor.to(device) for name, tensor in named.items()} for handle, named in inputs.items()}
    placed: dict[Any, dict[str, Any]] = {handle: dict.fromkeys(named) for handle, named in inputs.items()}
    by_dtype: dict[torch.dtype, list[tuple[Any, str, torch.Tensor]]] = {}
    for handle, named in inputs.items():
        for name, tensor in named.items():
            if tensor.device == device:
                placed[handle][name] = tensor
            else:
                by_dtype.setdefault(tensor.dtype, []).append((handle, name, tensor))
    for entries in by_dtype.values():
        flat = torch.cat([tensor.reshape(-1) for _, _, tensor in entries]).to(device)
        parts = flat.split([tensor.numel() for _, _, tensor in entries])
        for (handle, name, tensor), part in zip(entries, parts):
            placed[handle][name] = part.view(tensor.shape)
    return placed


def to_host(outputs: Mapping[Any, Mapping[str, torch.Tensor]]) -> dict[Any, dict[str, torch.Tensor]]:
    """Every output on the host (by handle, then by name). From a CUDA device each copy is queued into pinned
    memory without waiting (on the current stream, which `step_many` made wait for every lane), then one wait
    for them all; host tensors are passed as they are."""
    host = {
        handle: {name: tensor.to("cpu", non_blocking=tensor.is_cuda) for name, tensor in named.items()}
        for handle, named in outputs.items()
    }
    devices = {tensor.device for named in outputs.values() for tensor in named.values() if tensor.is_cuda}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return host


class LanesMode:
    """A session per runtime slot; a round is one `step_many` over the sessions that tick."""

    name = "lanes"
    unit = "session"

    def __init__(self, loaded: LoadedTail, slots: int):
        self.loaded = loaded
        self.runtime = loaded.runtime
        self.device = self.runtime.device
        self.slots = slots
        self.facts = PlanFacts(self.runtime)

    @property
    def session_slots(self) -> int:
        return self.slots

    def units(self) -> int:
        return self.slots

    def open_unit(self, seed: int) -> Any:
        return self.runtime.session(initial=self.loaded.initial, seed=seed)

    def warm(self) -> None:
        """A session in every slot once: on CUDA the first session of a slot captures its graphs."""
        sessions = [self.open_unit(seed) for seed in range(self.slots)]
        for session in sessions:
            session.close()

    def join(self, seed: int, group: int | None = None) -> Any:
        return self.open_unit(seed)

    def leave(self, handle: Any) -> None:
        handle.close()

    def reset(self, handle: Any) -> Any:
        handle.reset()
        return handle

    def instant(self, handle: Any) -> int:
        return handle.instant

    def step(self, ticks: Sequence[tuple[Any, dict[str, torch.Tensor], bool]]) -> StepResult:
        errors: dict[Any, TickError] = {}
        failed: dict[Any, str] = {}
        regular = to_device({handle: inputs for handle, inputs, last in ticks if not last}, self.device)
        instants = {handle: handle.instant for handle, _, _ in ticks}
        done: dict[Any, Any] = {}
        if regular:
            try:
                done = self.runtime.step_many(regular)
            except duplexcadence.SessionsFailed as error:
                done = dict(error.outputs)
                for handle, cause in error.failures.items():
                    failed[handle] = first_line(cause)
                    errors[handle] = TickError(messages.STAGE_FAILED, str(cause))
            except (duplexcadence.StepError, duplexcadence.SessionFailed, RuntimeError):
                # an input the plan refuses at its instant (nothing was stepped): one at a time, so that only
                # that session's tick gets the error
                for handle, inputs in regular.items():
                    self._step_one(handle, inputs, False, done, errors, failed)
        for handle, inputs, last in ticks:
            if last:
                self._step_one(handle, self._on_device(inputs), True, done, errors, failed)
        outputs = to_host(
            {handle: named_outputs(value, self.facts.output_names(instants[handle])) for handle, value in done.items()}
        )
        return StepResult(outputs, errors, failed)

    def _on_device(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensor.to(self.device) for name, tensor in inputs.items()}

    @staticmethod
    def _step_one(handle: Any, inputs: dict, last: bool, done: dict, errors: dict, failed: dict) -> None:
        try:
            done[handle] = handle.finish(**inputs) if last else handle.step(**inputs)
        except duplexcadence.StepError as error:
            errors[handle] = TickError(messages.BAD_INPUT, str(error))
        except duplexcadence.SessionFailed as error:
            failed[handle] = first_line(error)
            errors[handle] = TickError(messages.STAGE_FAILED, str(error))

    def calibration_units(self, count: int) -> list[Any]:
        return [self.open_unit(seed) for seed in range(count)]

    def release_calibration(self, units: list[Any]) -> None:
        for unit in units:
            unit.close()

    def unit_ticks(self, units: list[Any], inputs_of) -> list[tuple[Any, dict, bool]]:
        return [(unit, inputs_of(seed, unit.instant), False) for seed, unit in enumerate(units)]


class LockstepMode:
    """Sessions in the rows of lockstep groups (one group per runtime slot); a round is one `step_many` over
    the groups whose members all tick."""

    name = "lockstep"
    unit = "group"

    def __init__(self, loaded: LoadedTail, slots: int, rows: int, batch_param: str = "B"):
        self.loaded = loaded
        self.runtime = loaded.runtime
        self.device = self.runtime.device
        self.slots = slots
        self.rows = rows
        self.groups: list[Any] = []
        try:
            for _ in range(slots):
                self.groups.append(duplexcadence.LockstepGroup(self.runtime, batch_param, 0, loaded.initial))
        except duplexcadence.LockstepError as error:
            raise ValueError(messages.lockstep_refused(rows, str(error))) from error
        problem = self._join_problem()
        if problem is not None:
            raise ValueError(messages.lockstep_refused(rows, problem))
        self.axes = self.groups[0].axes
        self.facts = PlanFacts(self.runtime, self.axes)

    def _join_problem(self) -> str | None:
        """Why a session could not join a running group (None: it can at every instant): checked over the
        plan's warm-up and one period."""
        trace = self.runtime.plan.trace
        for instant in range(1, len(trace.states) + 1):
            problem = self.groups[0].join_problem(instant)
            if problem is not None:
                return problem
        return None

    @property
    def session_slots(self) -> int:
        return self.slots * self.rows

    def units(self) -> int:
        return self.slots

    def warm(self) -> None:
        """Every group's slot is taken at start (on CUDA its graphs are captured then)."""

    def join(self, seed: int, group: int | None = None) -> Any:
        return self.groups[group or 0].join()

    def leave(self, handle: Any) -> None:
        group = handle.group
        handle.leave()
        if all(member is None for member in group.members):
            group.reset()  # empty: back to instant 0

    def reset(self, handle: Any) -> Any:
        group = handle.group
        handle.leave()
        return group.join()

    def instant(self, handle: Any) -> int:
        return handle.instant

    def step(self, ticks: Sequence[tuple[Any, dict[str, torch.Tensor], bool]]) -> StepResult:
        """One instant of every group with a tick: a member's tick (a `Member`: its inputs in its row, every
        member of the group given one) or a group's whole (`WholeGroup`: the group's batched inputs)."""
        by_group: dict[Any, dict[Any, dict[str, torch.Tensor]]] = {}
        whole: dict[Any, WholeGroup] = {}
        host: dict[Any, dict[str, torch.Tensor]] = {}
        for member, inputs, _ in ticks:
            if isinstance(member, WholeGroup):
                whole[member.group] = member
                host[member.group.session] = inputs
            else:
                by_group.setdefault(member.group, {})[member] = inputs
        host.update({group.session: self._batch(group, members) for group, members in by_group.items()})
        batched = to_device(host, self.device)
        groups = {group.session: group for group in [*by_group, *whole]}
        instants = {group.session: group.session.instant for group in groups.values()}
        outputs: dict[Any, dict[str, torch.Tensor]] = {}
        errors: dict[Any, TickError] = {}
        failed: dict[Any, str] = {}
        done: dict[Any, Any] = {}
        try:
            done = self.runtime.step_many(batched)
        except duplexcadence.SessionsFailed as error:
            done = dict(error.outputs)
            for session, cause in error.failures.items():
                self._group_failed(groups[session], cause, by_group, whole, errors, failed)
        except (duplexcadence.StepError, duplexcadence.SessionFailed, RuntimeError):
            for session, inputs in batched.items():
                try:
                    done[session] = session.step(**inputs)
                except duplexcadence.StepError as error:
                    group = groups[session]
                    for key in [whole[group]] if group in whole else by_group[group]:
                        errors[key] = TickError(messages.BAD_INPUT, str(error))
                except duplexcadence.SessionFailed as cause:
                    self._group_failed(groups[session], cause, by_group, whole, errors, failed)
        answered = to_host(
            {
                session: named_outputs(value, self.facts.output_names(instants[session]))
                for session, value in done.items()
            }
        )
        for session, named in answered.items():
            group = groups[session]
            if group in whole:
                outputs[whole[group]] = named
                continue
            # one host copy of the group's outputs; each member gets views of its rows (split is one call)
            rows = {name: tensor.split(1, dim=self.axes[name]) for name, tensor in named.items()}
            for member in by_group[group]:
                outputs[member] = {name: split[member.row] for name, split in rows.items()}
        return StepResult(outputs, errors, failed)

    def _group_failed(
        self, group: Any, cause: BaseException, by_group: dict, whole: dict, errors: dict, failed: dict
    ) -> None:
        """A stage raised in a group: every member's stream is lost; the group restarts at instant 0."""
        text = first_line(cause)
        for member in group.members:
            if member is not None:
                failed[member] = text
                if member in by_group.get(group, ()):
                    errors[member] = TickError(messages.STAGE_FAILED, messages.group_failed(text))
        if group in whole:
            errors[whole[group]] = TickError(messages.STAGE_FAILED, messages.group_failed(text))
        group.reset()

    def _batch(self, group: Any, members: Mapping[Any, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The group's inputs (on the host): each member's tensors in its row, zeros in the rows of the others."""
        first = next(iter(members.values()))
        by_row = [members.get(member) if member is not None else None for member in group.members]
        batched = {}
        for name, example in first.items():
            zeros = None
            rows = []
            for inputs in by_row:
                if inputs is None:
                    if zeros is None:
                        zeros = torch.zeros_like(example)
                    rows.append(zeros)
                else:
                    rows.append(inputs[name])
            batched[name] = torch.cat(rows, dim=self.axes[name])
        return batched

    def calibration_units(self, count: int) -> list[Any]:
        units = []
        for group in self.groups[:count]:
            units.append([group.join() for _ in range(self.rows)])
        return units

    def release_calibration(self, units: list[Any]) -> None:
        for members in units:
            group = members[0].group
            for member in members:
                member.leave()
            group.reset()

    def unit_ticks(self, units: list[Any], inputs_of) -> list[tuple[Any, dict, bool]]:
        return [(member, inputs_of(member.row, member.instant), False) for members in units for member in members]


MODES = {"lanes": LanesMode, "lockstep": LockstepMode}


def unit_count(mode: Any, sessions: int) -> int:
    return sessions if mode.name == "lanes" else math.ceil(sessions / mode.rows)
