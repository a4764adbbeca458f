"""A stage's body: bind the region views, call the stage, store what it returns, trim.

The body is what a CUDA graph captures and what an eager firing runs, so the two paths execute the
same arithmetic. Views are exact-shape and at the region's stable address; bound regions are handed
over through the model's attributes, the others as arguments (`binding.call_arguments`).

Public: `Body`; `invoke` (a stage's call), `returned_values` (what the call returned for each of its returns,
by position or by field), `record_fields`, `first_call_object` (an object made at load by one call of its
stage).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.program import Access, ObjectPass, Program, RegionInfo, StageInfo
from duplexcadence.interpreter.plans.trace import Firing, View
from duplexcadence.interpreter.runtime.binding import (
    Attribute,
    ObjectSlot,
    StageCallable,
    StageCallFailed,
    describe,
    object_slots,
)
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES, RegionStorage


class Body:
    """The stage bodies of one session: the binding (the runtime's `callables` and `attributes`, shared:
    not copied), its region storage, and the lengths its bound attributes show.

    `bound_lengths`: each region's length at the start of the instant being run, with the updates of the
    instant's firings so far applied (what a bound attribute's view shows); set by the step path before
    an instant's first body, and by `bind_current`.

    `objects`: the session's caller-owned objects by name (the session keeps the dict; a stage that
    `update`s an object replaces its entry with what the call returns); regions bound into them are
    reached through `ObjectSlot`s, with the model's attributes, in `attributes`."""

    def __init__(
        self,
        program: Program,
        model: Any,
        callables: dict[str, StageCallable],
        attributes: dict[str, Attribute],
        storage: dict[str, RegionStorage],
        objects: dict[str, Any] | None = None,
        host_counters: frozenset[str] = frozenset(),
    ):
        self.program = program
        self.model = model
        self.callables = callables
        self.objects = objects if objects is not None else {}
        self.attributes: Mapping[str, Attribute | ObjectSlot] = (
            {**attributes, **object_slots(program, self.objects)} if program.objects else attributes
        )
        self.storage = storage
        self.host_counters = host_counters
        self.bound_lengths: dict[str, int] = {}

    def run(self, firing: Firing) -> dict[str, torch.Tensor]:
        """Bind, call, store, trim; returns the firing's writes that have no length (a module output).

        Always without autograd: parameters require grad by default, and an in-place write into a
        region under grad mode would chain every tick onto the arena's autograd history. The grad mode
        is put back from two nested `finally` blocks (as rng.call_with_rng puts the generator back): an
        interrupt inside the stage cannot leave the process without autograd."""
        enabled = torch.is_grad_enabled()
        try:
            try:
                torch.set_grad_enabled(False)
                return self._run(firing)
            finally:
                torch.set_grad_enabled(enabled)
        finally:
            torch.set_grad_enabled(enabled)

    def _run(self, firing: Firing) -> dict[str, torch.Tensor]:
        program = self.program
        stage = program.stages[firing.stage]
        call = self.callables[stage.name]
        reads = [v for v in firing.views if v.kind == "read"]
        updates = [v for v in firing.views if v.kind == "update"]
        for view in firing.views:
            if view.initial and view.kind == "feed":
                self._copy_first_unit(view)
        for name in self.host_counters:  # a counter the stock code keeps as a Python int
            self.attributes[name].set(firing.counters[name])
        args: list = []
        kwargs: dict = {}
        handed: dict[str, Any] = {}
        returned: list[Any] = []  # what the call returns, in order: unbound updates, writes, updated objects
        read_iter, update_iter = iter(reads), iter(updates)
        for used in stage.in_declared_order():
            if isinstance(used, ObjectPass):
                value = self.objects[used.object]
                if used.kind == "update":
                    returned.append(used)
                if used.alias:
                    kwargs[used.alias] = value
                else:
                    args.append(value)
                continue
            if used.kind == "write":
                if used.region not in self.attributes:
                    returned.append(used)
                continue
            view = next(read_iter) if used.kind == "read" else next(update_iter)
            tensor = None if view.initial and view.kind == "update" else self._view_tensor(view)
            if used.region in self.attributes:
                self.attributes[used.region].set(tensor)
                handed[used.region] = tensor
                continue
            if used.kind == "update":
                returned.append(used)
                handed[used.region] = tensor
            if used.alias:
                kwargs[used.alias] = tensor
            else:
                args.append(tensor)
        result = invoke(call, self.model, args, {**kwargs, **dict(stage.arguments)}, firing)
        values = returned_values(stage, result, returned)
        module_outputs: dict[str, torch.Tensor] = {}
        by_region: dict[str, Any] = {}
        for used, value in zip(returned, values):
            if isinstance(used, ObjectPass):
                self.objects[used.object] = value  # what the call returns in its place is the object now
            else:
                by_region[used.region] = value
        write_views = {v.region: v for v in firing.views if v.kind == "write"}
        for view in updates:
            region = program.regions[view.region]
            if view.region in self.attributes:
                new = self.attributes[view.region].get()
                if new is handed[view.region] and new is not None:
                    self._check_in_place(stage.name, view)
                    continue
                if region.fixed or region.retention.kind == "ring":
                    self._store_whole(stage.name, view, new)
                    continue
                self._store(stage.name, view, new)
            else:
                if region.fixed or region.retention.kind == "ring":
                    self._store_whole(stage.name, view, by_region[view.region])
                    continue
                self._store(stage.name, view, by_region[view.region], handed.get(view.region))
        for name, view in write_views.items():
            written: Any = by_region.get(name)  # whatever the call returned for this write (checked below)
            if view.length is None:
                module_outputs[name] = written
                continue
            region = program.regions[name]
            axis = _time_axis(region)  # a write with a length appends units: its region has a time axis
            if not _fits(region, written) or written.shape[axis] != view.length:  # copy_ would broadcast
                raise TypeError(
                    f"stage '{stage.name}' wrote {describe(written)} to region '{name}', declared "
                    f"{region.dtype}[{_dims(region)}] with {messages.units(view.length)} at this firing"
                )
            self.storage[name].append(view.offset, 0, written)
            if view.initial:
                self._copy_first_unit(view)
        for view in firing.views:
            if view.kind in ("feed", "write", "read") and view.kept is not None and view.length is not None:
                region = program.regions[view.region]
                self.storage[view.region].trim(view.transient, region.retention)
        for name in firing.advances:
            counter = program.counters[name]
            scalar = self.storage[name].view()
            scalar.add_(counter.step)
            if counter.modulo is not None:
                scalar.remainder_(counter.modulo)
        self.bind_current(after=firing)
        return module_outputs

    def _copy_first_unit(self, view: View) -> None:
        """`start first`: the units the region held before its first units arrived become copies of the
        first of them (replicate padding)."""
        held = view.offset
        axis = self.program.regions[view.region].time_axis
        if not held or axis is None:
            return
        whole = self.storage[view.region].view(view.transient)
        first = whole.narrow(axis, held, 1)
        target = whole.narrow(axis, 0, held)
        target.copy_(first.expand_as(target))

    def bind_current(self, lengths: Mapping[str, int] | None = None, after: Firing | None = None) -> None:
        """Point every bound attribute at its region's current view: at `lengths` (the lengths at the start of
        an instant), or at the bound lengths with the updates of firing `after` applied."""
        if after is None:
            self.bound_lengths = dict(lengths or {})
        else:
            for view in after.views:
                if view.kind == "update" and view.kept is not None:
                    self.bound_lengths[view.region] = view.kept
        bound = self.bound_lengths
        for name, slot in self.attributes.items():
            region = self.program.regions[name]
            storage = self.storage[name]
            if name in self.host_counters:
                continue  # set to the firing's value before each call
            if region.fixed:
                slot.set(storage.view())
            elif region.retention.kind == "ring":
                slot.set(storage.view(region.retention.last))
            else:
                length = bound.get(name, 0)
                if length == 0 and region.start == "empty" and slot.get() is None and after is None:
                    continue  # lazily created state stays None until the module makes it
                slot.set(storage.view(length))

    def call_text(self, firing: Firing) -> str:
        """How the stage was called, for an error: `module 'path' called as (x f32[1, 2, 1], ...)`."""
        stage = self.program.stages[firing.stage]
        call = self.callables[stage.name]
        parts = ["model"] if call.is_hook else []
        views = iter(v for v in firing.views if v.kind in ("read", "update"))
        for used in stage.in_declared_order():
            if isinstance(used, ObjectPass):
                text = f"{used.object} (object {type(self.objects.get(used.object)).__name__})"
                parts.append(f"{used.alias}={text}" if used.alias else text)
                continue
            if used.kind == "write":
                continue
            view = next(views)
            if used.region in self.attributes:
                continue
            region = self.program.regions[used.region]
            if view.initial and view.kind == "update":
                text = f"{used.region} None (start {region.start})"
            else:
                shape = view.shape if view.shape is not None else region.shape
                text = f"{used.region} {region.dtype}[{', '.join(map(str, shape))}]"
            parts.append(f"{used.alias}={text}" if used.alias else text)
        callee = f"hook '{stage.target}'" if call.is_hook else f"module '{stage.target or '(root)'}'"
        return f"{callee} called as ({', '.join(parts)})"

    def _store_whole(self, stage: str, view: View, version: Any) -> None:
        """A fixed region's or a ring's new version (a new tensor): copied whole."""
        region = self.program.regions[view.region]
        if not _fits(region, version):
            raise TypeError(
                f"stage '{stage}' gave {describe(version)} as the new version of region "
                f"'{view.region}', declared {region.dtype}[{_dims(region)}]"
            )
        target = self.storage[view.region].view(None if region.fixed else view.length)
        if tuple(version.shape) != tuple(target.shape):  # copy_ would broadcast it
            raise ValueError(
                f"stage '{stage}' returned {describe(version)} as region '{view.region}', which is always "
                f"{describe(target)} ({'fixed' if region.fixed else region.retention.describe()})"
            )
        target.copy_(version)

    def _store(self, stage: str, view: View, version: Any, handed: torch.Tensor | None = None) -> None:
        """Keep the retained part of a stage's new version of a window region. Its length must be exactly
        what the `.clock` declares: the units held plus the advance, or (a module that trims its state
        itself) what the retention keeps of them. `handed`: the view the stage was given, when the region
        is unbound: a version that is that memory again, as long as it was, was not advanced."""
        region = self.program.regions[view.region]
        if not _fits(region, version):  # a copy into the region would broadcast it or cast it silently
            raise TypeError(
                f"stage '{stage}' gave {describe(version)} as the new version of region "
                f"'{view.region}', declared {region.dtype}[{_dims(region)}]"
            )
        units = version.shape[_time_axis(region)]
        advance = view.transient - _length(view)
        storage = self.storage[view.region]
        unadvanced = handed is not None and advance > 0 and units == view.length and storage.holds(version)
        if units not in (view.transient, view.kept) or unadvanced:
            raise ValueError(_length_message(stage, view, region, units, advance, unadvanced))
        storage.store_version(version, region.retention)

    def _check_in_place(self, stage: str, view: View) -> None:
        """A bound attribute that still holds the view it was handed: the module updated it in place, which
        leaves the length handed, so that length must be what the region keeps after the update."""
        region = self.program.regions[view.region]
        if region.fixed or region.retention.kind == "ring" or view.length == view.kept:
            return
        raise ValueError(
            f"stage '{stage}' left region '{view.region}' as the {messages.units(_length(view))} it was handed (updated in "
            f"place, or not at all); the .clock says it advances {view.transient - _length(view)} per firing and "
            f"keeps {view.kept} ({region.retention.describe()}): assign the new version to the attribute"
        )

    def _view_tensor(self, view: View) -> torch.Tensor:
        region = self.program.regions[view.region]
        storage = self.storage[view.region]
        if region.fixed:
            return storage.view()
        length = _length(view)
        if view.kind == "update" or region.retention.kind == "ring":
            return storage.view(length)
        whole = storage.view(view.start + length)
        if view.start == 0:
            return whole
        return whole.narrow(_time_axis(region), view.start, length)


def _length_message(stage: str, view: View, region, units: int, advance: int, returned_handed: bool) -> str:
    expected = (
        messages.units(view.transient)
        if view.transient == view.kept
        else f"{messages.units(view.transient)} (held + advance), or {view.kept} (what the retention keeps of them)"
    )
    what = f"the {messages.units(units)} it was handed" if returned_handed else messages.units(units)
    return (
        f"stage '{stage}' returned {what} as the new version of region '{view.region}'; the .clock says it held "
        f"{view.length} and advances {advance} per firing ({region.retention.describe()}), so the version has "
        f"{expected}; check its `start` and `update` declarations"
    )


def _time_axis(region: RegionInfo) -> int:
    """The time axis of a region the caller knows has one (it stores or hands over units of it)."""
    assert region.time_axis is not None, f"region '{region.name}' has no time axis"
    return region.time_axis


def _length(view: View) -> int:
    """The units of a view of a region with a time axis, which the trace gives every such read and update."""
    assert view.length is not None, f"a {view.kind} view of region '{view.region}' with no length"
    return view.length


def _fits(region, value: Any) -> bool:
    """Whether `value` is a tensor of the region's dtype and declared dims (any length on the time axis)."""
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == TORCH_DTYPES[region.dtype]
        and value.dim() == len(region.shape)
        and all(dim is None or value.shape[axis] == dim for axis, dim in enumerate(region.shape))
    )


def _dims(region) -> str:
    return ", ".join("time" if d is None else str(d) for d in region.shape)


def invoke(call: StageCallable, model: Any, args: list, kwargs: dict, firing: Firing) -> Any:
    """Call a stage: a hook as `fn(model, *args, **kwargs)` (and `firing=` when it takes it), a module or
    method as `fn(*args, **kwargs)`."""
    if call.is_hook:
        if call.wants_firing:
            kwargs = {**kwargs, "firing": firing}
        return call.fn(model, *args, **kwargs)
    return call.fn(*args, **kwargs)


def _returned_name(used: Access | ObjectPass) -> str:
    return used.object if isinstance(used, ObjectPass) else used.region


def record_fields(record: Any) -> list[str]:
    """The fields a returned record offers, for a message: a mapping's keys, a dataclass's, attrs or named
    tuple's fields, else its public attributes."""
    if isinstance(record, Mapping):
        return [str(key) for key in record]
    if dataclasses.is_dataclass(record):
        return [f.name for f in dataclasses.fields(record)]
    if attrs.has(type(record)):
        return [f.name for f in attrs.fields(type(record))]
    if isinstance(record, tuple) and hasattr(record, "_fields"):
        return list(record._fields)
    return [name for name in vars(record) if not name.startswith("_")] if hasattr(record, "__dict__") else []


def returned_values(stage: StageInfo, result: Any, returned: list[Access | ObjectPass]) -> tuple:
    """What the call returned for each of `returned` (its unbound updates, writes and updated objects, in
    declared order): from the record's fields when the stage names them (`from FIELD`), else by position."""
    if stage.returns_record():
        values = []
        for used in returned:
            field = used.field
            assert field is not None, "a stage that takes its returns by field names every one (check_returns)"
            if isinstance(result, Mapping) and field in result:
                values.append(result[field])
            elif hasattr(result, field):  # an attribute; a ModelOutput keeps a field left None out of its keys
                values.append(getattr(result, field))
            else:
                fields = record_fields(result)
                raise TypeError(
                    f"stage '{stage.name}' takes '{_returned_name(used)}' from the field '{field}' of what its call "
                    f"returned, a {type(result).__name__}, which has no such field"
                    + (f" (its fields: {', '.join(fields)})" if fields else "")
                )
        return tuple(values)
    count = len(returned)
    if count == 0:
        return ()
    if count == 1:
        if isinstance(result, (tuple, list)) and len(result) == 1:
            return (result[0],)
        return (result,)
    if not isinstance(result, (tuple, list)) or len(result) != count:
        names = ", ".join(_returned_name(used) for used in returned)
        got = type(result).__name__ if not isinstance(result, (tuple, list)) else f"{len(result)} values"
        fields = [] if isinstance(result, (tuple, list, torch.Tensor)) else record_fields(result)
        hint = (
            f"; it returned a record (fields {', '.join(fields)}): take each return from its field with `from "
            f"FIELD` (`write {_returned_name(returned[-1])} from {fields[0]}`)"
            if fields
            else ""
        )
        raise TypeError(
            f"stage '{stage.name}' must return {count} values as a tuple (its unbound updates, writes and updated "
            f"objects, in declared order: {names}), got {got}{hint}"
        )
    return tuple(result)


def first_call_object(
    program: Program,
    firing: Firing,
    call: StageCallable,
    model: Any,
    name: str,
    objects: Mapping[str, Any],
    device: torch.device,
) -> Any:
    """The object `name` (`object NAME from stage STAGE`) as one call of its stage returns it: the stage's first
    firing, handed None in the object's place (as a stock loop starts), zeros of the firing's shapes for the
    regions it passes as arguments, the other objects from `objects`; the model's bound attributes as they are.
    Raises StageCallFailed (with how the stage was called) when the call raises or returns no such object."""
    stage = program.stages[firing.stage]
    reads = iter(v for v in firing.views if v.kind == "read")
    updates = iter(v for v in firing.views if v.kind == "update")
    args: list = []
    kwargs: dict = {}
    shown: list[str] = []
    returned: list[Access | ObjectPass] = []
    for used in stage.in_declared_order():
        if isinstance(used, ObjectPass):
            value = None if used.object == name else objects.get(used.object)
            text = f"{used.object} ({type(value).__name__})"
            if used.kind == "update":
                returned.append(used)
        elif used.kind == "write":
            if program.regions[used.region].bind is None:
                returned.append(used)
            continue
        else:
            view = next(reads) if used.kind == "read" else next(updates)
            region = program.regions[used.region]
            if region.bind is not None:
                continue
            if used.kind == "update":
                returned.append(used)
            if view.initial and view.kind == "update":
                value, text = None, f"{used.region} None"
            else:
                shape = view.shape if view.shape is not None else tuple(d or 0 for d in region.shape)
                value = torch.zeros(shape, dtype=TORCH_DTYPES[region.dtype], device=device)
                text = f"{used.region} zeros {region.dtype}[{', '.join(map(str, shape))}]"
        if used.alias:
            kwargs[used.alias] = value
            shown.append(f"{used.alias}={text}")
        else:
            args.append(value)
            shown.append(text)
    shown += [f"{key}={value!r}" for key, value in stage.arguments]
    how = f"stage '{stage.name}' called at load as ({', '.join(shown)})"
    enabled = torch.is_grad_enabled()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.set_grad_enabled(False)
            result = invoke(call, model, args, {**kwargs, **dict(stage.arguments)}, firing)
            values = returned_values(stage, result, returned)
    except Exception as error:  # the stage is user code
        raise StageCallFailed(f"could not be made: {how} raised {error!r}") from error
    finally:
        torch.set_grad_enabled(enabled)
    made = next(v for used, v in zip(returned, values) if isinstance(used, ObjectPass) and used.object == name)
    if made is None:
        raise StageCallFailed(f"could not be made: {how} returned None in its place")
    return made
