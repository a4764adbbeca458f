"""A stage's body: bind the region views, call the stage, store what it returns, trim.

The body is what a CUDA graph captures and what an eager firing runs, so the two paths execute the
same arithmetic. Views are exact-shape and at the region's stable address; bound regions are handed
over through the model's attributes, the others as arguments (`binding.call_arguments`).

Public: `Body`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.trace import Firing, View
from duplexcadence.interpreter.runtime.binding import Attribute, StageCallable, describe
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES, RegionStorage


class Body:
    """The stage bodies of one session: the binding (the runtime's `callables` and `attributes`, shared:
    not copied), its region storage, and the lengths its bound attributes show.

    `bound_lengths`: each region's length at the start of the instant being run, with the updates of the
    instant's firings so far applied (what a bound attribute's view shows); set by the step path before
    an instant's first body, and by `bind_current`."""

    def __init__(
        self,
        program: Program,
        model: Any,
        callables: dict[str, StageCallable],
        attributes: dict[str, Attribute],
        storage: dict[str, RegionStorage],
    ):
        self.program = program
        self.model = model
        self.callables = callables
        self.attributes = attributes
        self.storage = storage
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
        args: list = []
        kwargs: dict = {}
        handed: dict[str, torch.Tensor] = {}
        read_iter, update_iter = iter(reads), iter(updates)
        for access in stage.accesses:
            if access.kind == "write":
                continue
            view = next(read_iter) if access.kind == "read" else next(update_iter)
            tensor = self._view_tensor(view)
            if access.region in self.attributes:
                self.attributes[access.region].set(tensor)
                handed[access.region] = tensor
                continue
            if access.alias:
                kwargs[access.alias] = tensor
            else:
                args.append(tensor)
        if call.is_hook:
            if call.wants_firing:
                kwargs["firing"] = firing
            result = call.fn(self.model, *args, **kwargs)
        else:
            result = call.fn(*args, **kwargs)
        returned = [a for a in stage.accesses if a.kind in ("update", "write") and a.region not in self.attributes]
        values = _as_tuple(result, len(returned), stage.name)
        module_outputs: dict[str, torch.Tensor] = {}
        by_region = {a.region: v for a, v in zip(returned, values)}
        write_views = {v.region: v for v in firing.views if v.kind == "write"}
        for view in updates:
            region = program.regions[view.region]
            if view.region in self.attributes:
                new = self.attributes[view.region].get()
                if new is handed[view.region] or region.fixed or region.retention.kind == "ring":
                    if new is not handed[view.region]:
                        self.storage[view.region].view(None if region.fixed else view.length).copy_(new)
                    continue
                self._store(stage.name, view, new)
            else:
                self._store(stage.name, view, by_region[view.region])
        for name, view in write_views.items():
            value = by_region.get(name)
            if view.length is None:
                module_outputs[name] = value
                continue
            region = program.regions[name]
            if not _fits(region, value) or value.shape[region.time_axis] != view.length:  # copy_ would broadcast
                raise TypeError(
                    f"stage '{stage.name}' wrote {describe(value)} to region '{name}', declared "
                    f"{region.dtype}[{_dims(region)}] with {view.length} units at this firing"
                )
            self.storage[name].append(view.offset, 0, value)
        for view in firing.views:
            if view.kind in ("feed", "write") and view.kept is not None and view.length is not None:
                region = program.regions[view.region]
                self.storage[view.region].trim(view.transient, region.retention)
        self.bind_current(after=firing)
        return module_outputs

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
        for access in stage.accesses:
            if access.kind == "write":
                continue
            view = next(views)
            if access.region in self.attributes:
                continue
            shape = view.shape if view.shape is not None else self.program.regions[access.region].shape
            text = f"{access.region} {self.program.regions[access.region].dtype}[{', '.join(map(str, shape))}]"
            parts.append(f"{access.alias}={text}" if access.alias else text)
        callee = f"hook '{stage.target}'" if call.is_hook else f"module '{stage.target or '(root)'}'"
        return f"{callee} called as ({', '.join(parts)})"

    def _store(self, stage: str, view: View, version: Any) -> None:
        """Keep the retained part of a stage's new version; it must agree with the plan's lengths."""
        region = self.program.regions[view.region]
        if not _fits(region, version):  # a copy into the region would broadcast it or cast it silently
            raise TypeError(
                f"stage '{stage}' gave {describe(version)} as the new version of region "
                f"'{view.region}', declared {region.dtype}[{_dims(region)}]"
            )
        kept = self.storage[view.region].store_version(version, region.retention)
        if region.fixed:
            return
        if kept != view.kept:
            units = version.shape[region.time_axis]
            raise ValueError(
                f"stage '{stage}' returned {units} units of region '{view.region}'; the .clock says it held "
                f"{view.length} and advances {view.transient - view.length} per firing, so it keeps {view.kept}, "
                f"not {kept} ({region.retention.describe()}); check its `start` and `update` declarations"
            )

    def _view_tensor(self, view: View) -> torch.Tensor:
        region = self.program.regions[view.region]
        storage = self.storage[view.region]
        if region.fixed:
            return storage.view()
        if view.kind == "update" or region.retention.kind == "ring":
            return storage.view(view.length)
        whole = storage.view(view.start + view.length)
        if view.start == 0:
            return whole
        return whole.narrow(region.time_axis, view.start, view.length)


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


def _as_tuple(result: Any, count: int, stage: str) -> tuple:
    if count == 0:
        return ()
    if count == 1:
        if isinstance(result, (tuple, list)) and len(result) == 1:
            return (result[0],)
        return (result,)
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise TypeError(
            f"stage '{stage}' must return {count} tensors (its unbound updates and writes, in "
            f"declared order), got {type(result).__name__}"
        )
    return tuple(result)
