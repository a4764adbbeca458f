"""Binding a checked program to a PyTorch model: module paths, hook callables, attribute paths.

Paths are attribute paths from the model root: `decoder.model.0._streaming_state.previous`;
`layers[3]` indexes a sequence, a plain number part (`model.0`) names a child module. A path walks
only through what the model is made of: modules, tensors, lists, dicts and plain objects holding
state; one that reaches a Python module, a class, a function (or a dunder attribute) is refused
with `unsafe-path` before anything is called or set, and a stage calls a module or a method bound to
the object its path reaches. Every other failure is a located `binding-mismatch` diagnostic naming
the region or stage, the `.clock` line, the declared and the real value.
"""

from __future__ import annotations

import copy
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.program import ObjectPass, Program, RegionInfo, StageInfo
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES

_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)((?:\[[0-9]+\])*)$")


class PathError(Exception):
    pass


class PathLeavesModel(PathError):
    """A path that reaches something outside the model: a dunder attribute, a Python module, a class,
    a function that is neither a module nor a method of the object it was reached from."""

    def __init__(self, part: str, found: str):
        super().__init__(f"'{part}' is {found}")
        self.part = part
        self.found = found


def _outside(obj: Any) -> str | None:
    """What `obj` is when a path may not walk through it (None: a module, a tensor, a container or a
    plain object holding state)."""
    if isinstance(obj, (torch.nn.Module, torch.Tensor)):
        return None
    if isinstance(obj, types.ModuleType):
        return f"the Python module '{obj.__name__}'"
    if isinstance(obj, type):
        return f"the class '{obj.__qualname__}'"
    if callable(obj):
        name = getattr(obj, "__qualname__", None) or type(obj).__name__
        return f"the {type(obj).__name__} '{name}', not a module of the model"
    return None


def _step(obj: Any, name: str) -> Any:
    if name.startswith("__"):  # `dsl check` refuses these; a Program built by hand meets this
        raise PathLeavesModel(name, "a dunder attribute")
    if name.isdigit():
        if isinstance(obj, torch.nn.Module) and name in obj._modules:
            return obj._modules[name]
        try:
            return obj[int(name)]
        except (TypeError, IndexError, KeyError) as error:
            raise PathError(f"'{type(obj).__name__}' has no item {name}") from error
    if isinstance(obj, Mapping) and name in obj:
        return obj[name]
    if isinstance(obj, Mapping) and not hasattr(obj, name):
        keys = ", ".join(map(str, list(obj)[:12]))
        raise PathError(
            f"'{type(obj).__name__}' has no key '{name}'" + (f" (its keys: {keys})" if keys else " (it is empty)")
        )
    if not hasattr(obj, name):
        children = sorted(getattr(obj, "_modules", {}) or [])
        hint = f" (children: {', '.join(children[:12])})" if children else ""
        raise PathError(f"'{type(obj).__name__}' has no attribute '{name}'{hint}")
    return getattr(obj, name)


def _parts(path: str) -> list[str]:
    parts: list[str] = []
    for piece in path.split("."):
        match = _PART.match(piece)
        if not match:
            raise PathError(f"'{piece}' is not a path part")
        parts.append(match.group(1))
        parts.extend(re.findall(r"\[([0-9]+)\]", match.group(2)))
    return parts


def _walk(root: Any, parts: list[str]) -> Any:
    """The object `parts` lead to from `root`, through modules, tensors, containers and plain objects
    only (PathLeavesModel at the first part that reaches anything else)."""
    obj = root
    for part in parts:
        obj = _step(obj, part)
        found = _outside(obj)
        if found is not None:
            raise PathLeavesModel(part, found)
    return obj


def resolve(root: Any, path: str) -> Any:
    """The callable at `path` from `root` ('' is the root itself): a module, or a method bound to the
    object the path reaches just before it (`decoder.decode`)."""
    parts = _parts(path) if path else []
    if not parts:
        return root
    owner = _walk(root, parts[:-1])
    target = _step(owner, parts[-1])
    if isinstance(target, types.MethodType) and target.__self__ is owner:
        return target
    found = _outside(target)
    if found is not None:
        raise PathLeavesModel(parts[-1], found)
    return target


@attrs.define
class Attribute:
    """A settable slot: `owner.name`, `owner[index]` or `owner[key]`."""

    owner: Any
    name: str

    def get(self) -> Any:
        if isinstance(self.owner, (list, tuple)):
            return self.owner[int(self.name)]
        if isinstance(self.owner, Mapping) and self.name in self.owner:
            return self.owner[self.name]
        return _step(self.owner, self.name)

    def set(self, value: Any) -> None:
        if isinstance(self.owner, list):
            self.owner[int(self.name)] = value
        elif isinstance(self.owner, dict):
            self.owner[self.name] = value
        elif isinstance(self.owner, torch.nn.Module) and self.name in self.owner._buffers:
            self.owner._buffers[self.name] = value
        else:
            object.__setattr__(self.owner, self.name, value) if not isinstance(
                self.owner, torch.nn.Module
            ) else setattr(self.owner, self.name, value)


def attribute(root: Any, path: str) -> Attribute:
    parts = _parts(path)
    owner = _walk(root, parts[:-1])
    slot = Attribute(owner, parts[-1])
    slot.get()  # raises PathError if missing
    return slot


@attrs.frozen
class StageCallable:
    """What a stage calls and how: `fn(*args, **kwargs)`; hooks get the model first and, if they
    take it, the firing as `firing=`."""

    fn: Callable
    is_hook: bool
    wants_firing: bool


def bind_program(
    program: Program, model: Any, hooks: Mapping[str, Callable] | None, device: torch.device
) -> tuple[dict[str, StageCallable], dict[str, Attribute]]:
    """Resolve every stage callable and every bound attribute, checking declared vs real tensors."""
    hooks = dict(hooks or {})
    problems: list[Diagnostic] = []
    callables: dict[str, StageCallable] = {}
    for stage in program.stages.values():
        found = _bind_stage(stage, model, hooks, problems)
        if found is not None:
            mismatch = call_mismatch(program, stage, found)
            if mismatch is not None:
                problems.append(mismatch)
                continue
            callables[stage.name] = found
    attributes: dict[str, Attribute] = {}
    for region in program.regions.values():
        if region.bind is None or region.bind_object is not None:  # into an object: `bind_objects`
            continue
        try:
            slot = attribute(model, region.bind)
        except PathLeavesModel as error:
            problems.append(
                messages.path_leaves_model("bind", region.name, region.bind, error.part, error.found, region.bind_span)
            )
            continue
        except PathError as error:
            problems.append(messages.binding_missing(region.name, region.bind, str(error), region.bind_span))
            continue
        problem = None if host_int(region, slot.get()) else check_tensor(region, slot.get(), device)
        if problem is not None:
            problems.append(problem)
            continue
        attributes[region.name] = slot
    if problems:
        raise ClockError(problems)
    return callables, attributes


def _bind_stage(stage: StageInfo, model: Any, hooks: Mapping[str, Callable], problems: list) -> StageCallable | None:
    if stage.callable_kind == "hook":
        fn = hooks.get(stage.target)
        if fn is None:
            problems.append(messages.hook_missing(stage.name, stage.target, hooks, stage.callable_span))
            return None
        try:
            wants = "firing" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            wants = False
        return StageCallable(fn, True, wants)
    try:
        fn = resolve(model, stage.target)
    except PathLeavesModel as error:
        problems.append(
            messages.path_leaves_model("module", stage.name, stage.target, error.part, error.found, stage.callable_span)
        )
        return None
    except PathError as error:
        problems.append(messages.module_missing(stage.name, stage.target or "(root)", str(error), stage.callable_span))
        return None
    if not callable(fn):
        problems.append(
            messages.module_missing(
                stage.name, stage.target, f"which is a {type(fn).__name__}, not callable", stage.callable_span
            )
        )
        return None
    return StageCallable(fn, False, False)


def call_arguments(program: Program, stage: StageInfo, found: StageCallable) -> tuple[list[str], dict[str, str]]:
    """What the runtime passes when the stage fires, by region (or object) name: every unbound `read` and
    `update`, and every object the stage passes, positionally in declared order (`read x as name` by
    keyword), a hook's model first and its `firing=` last. Bound regions reach the module through their
    attribute instead."""
    args: list[str] = ["model"] if found.is_hook else []
    kwargs: dict[str, str] = {}
    for used in stage.in_declared_order():
        if isinstance(used, ObjectPass):
            name, alias = used.object, used.alias
        elif used.kind == "write" or program.regions[used.region].bind is not None:
            continue
        else:
            name, alias = used.region, used.alias
        if alias:
            kwargs[alias] = name
        else:
            args.append(name)
    for keyword, _value in stage.arguments:
        kwargs[keyword] = keyword
    if found.wants_firing:
        kwargs["firing"] = "firing"
    return args, kwargs


def _signature_target(fn: Callable) -> Callable | None:
    """What to read the call signature from: a module's `forward` (its `__call__` takes anything);
    None when pre-hooks may rewrite the arguments."""
    if isinstance(fn, torch.nn.Module):
        if fn._forward_pre_hooks or getattr(torch.nn.modules.module, "_global_forward_pre_hooks", None):
            return None
        return getattr(fn, "_orig_mod", fn).forward
    return fn


def call_mismatch(program: Program, stage: StageInfo, found: StageCallable) -> Diagnostic | None:
    """A `binding-mismatch` when the stage's callable cannot accept what the runtime will pass it
    (known at load from its signature; a callable taking `*args` is not judged)."""
    target = _signature_target(found.fn)
    if target is None:
        return None
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    args, kwargs = call_arguments(program, stage, found)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        passed = ", ".join(args + [f"{key}={value}" for key, value in kwargs.items()])
        callee = f"hook '{stage.target}'" if found.is_hook else f"module '{stage.target or '(root)'}'"
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or type(target).__name__
        plain = signature.replace(
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        return messages.call_mismatch(stage.name, callee, passed, f"{name}{plain}", str(error), stage.callable_span)
    return None


def describe(tensor: Any) -> str:
    if isinstance(tensor, torch.Tensor):
        dtype = next((k for k, v in TORCH_DTYPES.items() if v == tensor.dtype), str(tensor.dtype))
        return f"{dtype}[{', '.join(map(str, tensor.shape))}] on {tensor.device.type}"
    return "None" if tensor is None else type(tensor).__name__


def declared(region: RegionInfo) -> str:
    dims = ", ".join("time" if d is None else str(d) for d in region.shape)
    return f"{region.dtype}[{dims}]"


def check_tensor(region: RegionInfo, tensor: Any, device: torch.device) -> Diagnostic | None:
    """None if `tensor`, what bound `region`'s attribute holds, can be replaced by the region's views; else a
    located mismatch."""
    bound = region.bind
    assert bound is not None, f"region '{region.name}' is not bound"
    if tensor is None:
        return None  # lazily created state (None until the first call): the runtime sets the view before every firing
    if not isinstance(tensor, torch.Tensor):
        return messages.binding_shape(region.name, bound, declared(region), describe(tensor), region.bind_span)
    wrong = tensor.dtype != TORCH_DTYPES[region.dtype] or tensor.dim() != len(region.shape)
    if not wrong:
        for axis, dim in enumerate(region.shape):
            if dim is not None and tensor.shape[axis] != dim:
                wrong = True
    if wrong:
        return messages.binding_shape(region.name, bound, declared(region), describe(tensor), region.bind_span)
    return None


# --- caller-owned objects --------------------------------------------------------------------------


@attrs.define
class ObjectSlot:
    """A settable slot inside a caller-owned object of one session: the path is walked from the object each
    time (a stage that takes and returns the object may return a new one, with new containers inside)."""

    objects: dict[str, Any]
    root: str
    parts: list[str]

    def _slot(self) -> Attribute:
        return Attribute(_walk(self.objects[self.root], self.parts[:-1]), self.parts[-1])

    def get(self) -> Any:
        return self._slot().get()

    def set(self, value: Any) -> None:
        self._slot().set(value)


@attrs.frozen
class ObjectSource:
    """Where a session's object comes from: `factory(model)` (a hook the `.clock` names with `from`; called
    as `factory(model, params=...)`, the program's params by name, when it takes `params`); a deep copy of
    `template` (`from stage NAME`: what one call of the stage returned at load in the object's place); or
    `given` (the object passed at load, shared by the sessions as the model is)."""

    factory: Callable | None
    given: Any = None
    template: Any = None
    params: Mapping[str, Any] | None = None

    def make(self, model: Any) -> Any:
        if self.factory is not None:
            return self.factory(model, params=dict(self.params)) if self.params is not None else self.factory(model)
        if self.template is not None:
            return copy.deepcopy(self.template, _shared_with(model))
        return self.given


def _shared_with(model: Any) -> dict[int, Any]:
    """A deep copy's memo that keeps what the model is made of (its modules, parameters and buffers) shared: an
    object a stage's call made may point into the model (a config, a layer), and a session's copy must too."""
    if not isinstance(model, torch.nn.Module):
        return {id(model): model} if model is not None else {}
    shared: dict[int, Any] = {id(module): module for module in model.modules()}
    shared.update({id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]})
    return shared


def _takes_params(factory: Callable) -> bool:
    try:
        return "params" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def bind_objects(
    program: Program,
    model: Any,
    hooks: Mapping[str, Callable] | None,
    objects: Mapping[str, Any] | None,
    device: torch.device,
    stage_made: Callable[[str, dict[str, Any]], Any] | None = None,
) -> dict[str, ObjectSource]:
    """Each object's source, with the regions bound into it checked on one object made at load (the same
    shape and dtype checks, path rules and messages as a module attribute); ClockError lists every problem.

    `stage_made(name, others)`: the object `name` (declared `from stage NAME`) as one call of its stage returns
    it at load, `others` the other objects made so far; it raises `StageCallFailed` when the call fails."""
    hooks = dict(hooks or {})
    given = dict(objects or {})
    problems: list[Diagnostic] = []
    sources: dict[str, ObjectSource] = {}
    for name in sorted(set(given) - set(program.objects)):
        problems.append(
            messages.object_unavailable(
                name, "is given in objects= but the .clock declares no such object (`object NAME`)", None
            )
        )
    made: dict[str, Any] = {}
    for info in sorted(program.objects.values(), key=lambda o: o.stage is not None):  # made by a stage: last
        maker = info.factory or (f"stage '{info.stage}'" if info.stage is not None else None)
        if maker is not None and info.name in given:
            problems.append(messages.object_given_and_made(info.name, maker, info.span))
            continue
        if info.factory is not None:
            factory = hooks.get(info.factory)
            if factory is None:
                problems.append(
                    messages.object_unavailable(
                        info.name, f"is made by '{info.factory}', which was not registered in hooks=", info.span
                    )
                )
                continue
            source = ObjectSource(factory, params=program.params if _takes_params(factory) else None)
        elif info.stage is not None:
            assert stage_made is not None, "a program with an object made by a stage needs `stage_made`"
            try:
                template = stage_made(info.name, made)
            except StageCallFailed as error:
                problems.append(messages.object_unavailable(info.name, str(error), info.span))
                continue
            source = ObjectSource(None, template=template)
        elif info.name in given:
            source = ObjectSource(None, given[info.name])
        else:
            problems.append(messages.object_unavailable(info.name, "has no factory and none was given", info.span))
            continue
        try:
            probe = source.make(model)
        except Exception as error:  # a factory is user code
            problems.append(
                messages.object_unavailable(info.name, f"could not be made: its factory raised {error!r}", info.span)
            )
            continue
        made[info.name] = probe
        found = _outside(probe)
        if found is not None or probe is None:
            problems.append(
                messages.object_unavailable(
                    info.name, f"is {found or 'None'}: an object holds state (a container, a dataclass)", info.span
                )
            )
            continue
        sources[info.name] = source
        for region in program.regions.values():
            if region.bind_object != info.name or region.bind is None:
                continue
            where = f"{info.name}: {region.bind}"
            try:
                slot = attribute(probe, region.bind)
            except PathLeavesModel as error:
                problems.append(
                    messages.path_leaves_model("bind", region.name, where, error.part, error.found, region.bind_span)
                )
                continue
            except PathError as error:
                lazy = info.factory is not None and info.stage is None
                problems.append(
                    messages.binding_missing(region.name, where, str(error), region.bind_span, lazy_object=lazy)
                )
                continue
            problem = None if host_int(region, slot.get()) else check_tensor(region, slot.get(), device)
            if problem is not None:
                problems.append(problem)
    if problems:
        raise ClockError(problems)
    return sources


class StageCallFailed(Exception):
    """The call of a stage that makes an object at load (`object NAME from stage STAGE`) failed; the message
    says how it was called and what it raised or returned."""


def host_int(region: RegionInfo, value: Any) -> bool:
    """Whether a counter's bound attribute holds a Python int: the runtime then sets it to the counter's host
    value before each firing (as the stock code keeps it); one that holds a tensor gets the device scalar."""
    return region.role == "counter" and isinstance(value, int) and not isinstance(value, bool)


def host_counters(
    program: Program, attributes: Mapping[str, Attribute], sources: Mapping[str, ObjectSource], model: Any
) -> frozenset[str]:
    """The counters bound to attributes that hold a Python int (in the model, or in an object made at load)."""
    probes = {name: source.make(model) for name, source in sources.items()} if program.counters else {}
    found = set()
    for name in program.counters:
        region = program.regions[name]
        if region.bind is None:
            continue
        if region.bind_object is None:
            value = attributes[name].get() if name in attributes else None
        else:
            value = attribute(probes[region.bind_object], region.bind).get()
        if host_int(region, value):
            found.add(name)
    return frozenset(found)


def object_slots(program: Program, objects: dict[str, Any]) -> dict[str, ObjectSlot]:
    """The slots of the regions bound into a session's `objects` (a dict the session keeps up to date)."""
    return {
        name: ObjectSlot(objects, region.bind_object, _parts(region.bind))
        for name, region in program.regions.items()
        if region.bind_object is not None and region.bind is not None
    }


def tensors_in(obj: Any, prefix: str, depth: int = 6, seen: set[int] | None = None) -> list[tuple[str, torch.Tensor]]:
    """The tensors a caller-owned object holds, with their paths (containers, dataclasses, plain objects;
    not through modules, classes or functions), for the capture probe's aliasing report."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, torch.nn.Module) or _outside(obj) is not None or isinstance(obj, (str, bytes, int, float)):
        return []
    if isinstance(obj, Mapping):
        items = [(f"{prefix}[{key!r}]", value) for key, value in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(f"{prefix}[{index}]", value) for index, value in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = [(f"{prefix}.{key}", value) for key, value in vars(obj).items() if not key.startswith("__")]
    else:
        return []
    found: list[tuple[str, torch.Tensor]] = []
    for path, value in items:
        found.extend(tensors_in(value, path, depth - 1, seen))
    return found
