"""Running a stock loop and recording what persists between its calls.

Every call, drafting walks the model and the caller-owned state (modules, buffers, plain
attributes, dataclasses, attrs classes, lists, tuples, dicts) for tensors, and records each one's
shape, dtype, address and a fingerprint per slice along each axis (sum, max, min: equal slices
print equally, so shifts and rewrites can be told apart without keeping copies). Forward hooks on
every module record the tail and head prints of the tensors the modules take and return, so that
a carry can be matched to the module input or output it is the tail of.
"""

from __future__ import annotations

import dataclasses
import keyword
import types
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch

SLICE_PRINT_LIMIT = 1 << 26
"""Tensors with more elements get one print for the whole tensor, not one per slice."""
IO_PRINT_LIMIT = 1 << 24
"""Module inputs and outputs with more elements are not matched against carries."""
MAX_DEPTH = 16

_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
_SKIPPED_TYPES = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    type,
    torch.device,
    torch.dtype,
    torch.Generator,
    str,
    bytes,
    float,
    complex,
)

Print = tuple[float, float, float]


def slice_prints(tensor: torch.Tensor, axis: int) -> tuple[Print, ...]:
    """One (sum, max, min) per slice of `tensor` along `axis` (reductions only: no copy of the tensor)."""
    values = tensor.detach()
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    if values.is_complex():
        values = torch.view_as_real(values)
    if values.numel() == 0:
        return tuple((0.0, 0.0, 0.0) for _ in range(values.shape[axis]))
    others = tuple(d for d in range(values.dim()) if d != axis)
    if not others:
        column = values.double().tolist()
        return tuple((v, v, v) for v in column)
    sums = values.sum(others, dtype=torch.float64).tolist()
    highs = values.amax(others).double().tolist()
    lows = values.amin(others).double().tolist()
    return tuple(zip(sums, highs, lows))


def whole_print(tensor: torch.Tensor) -> Print:
    if tensor.numel() == 0:
        return (0.0, 0.0, 0.0)
    values = tensor.detach()
    if values.dtype == torch.bool:
        values = values.to(torch.uint8)
    if values.is_complex():
        values = torch.view_as_real(values)
    return (float(values.sum(dtype=torch.float64)), float(values.max()), float(values.min()))


@attrs.frozen
class Seen:
    """One tensor at one moment: after a call (or before the first one)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    data_ptr: int
    storage_bytes: int
    whole: Print
    slices: tuple[tuple[Print, ...], ...] | None  # per axis; None for a tensor over SLICE_PRINT_LIMIT

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    def is_zero(self) -> bool:
        return self.whole == (0.0, 0.0, 0.0)


def seen(tensor: torch.Tensor) -> Seen:
    tensor = tensor.detach()
    slices = None
    if 0 < tensor.numel() <= SLICE_PRINT_LIMIT:
        slices = tuple(slice_prints(tensor, axis) for axis in range(tensor.dim()))
    try:
        storage_bytes = tensor.untyped_storage().nbytes()
    except RuntimeError:
        storage_bytes = tensor.numel() * tensor.element_size()
    return Seen(tuple(tensor.shape), tensor.dtype, tensor.data_ptr(), storage_bytes, whole_print(tensor), slices)


@attrs.frozen
class Location:
    """Where a tensor was found: `path` from its root; `bindable` when the runtime's attribute paths
    (`a.b.0.c`, identifier dict keys) can name it from the model root."""

    path: str
    bindable: bool


def _part(key: Any) -> tuple[str, bool]:
    if isinstance(key, int):
        return str(key), True
    if isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key):
        return key, True
    return f"[{key!r}]", False


def _join(prefix: str, part: str) -> str:
    if not prefix:
        return part
    return prefix + part if part.startswith("[") else f"{prefix}.{part}"


class Walker:
    """Finds every tensor and every Python int reachable from the roots, once each."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.locations: dict[str, Location] = {}
        self.aliases: dict[str, list[str]] = {}
        self.counters: dict[str, int] = {}
        self.modules: dict[str, torch.nn.Module] = {}
        self._seen_objects: set[int] = set()
        self._tensor_paths: dict[int, str] = {}

    def walk(self, root: Any, prefix: str, bindable: bool) -> None:
        self._visit(root, prefix, bindable, 0)

    def _add_tensor(self, tensor: torch.Tensor, path: str, bindable: bool) -> None:
        if isinstance(tensor, torch.nn.Parameter):
            return
        first = self._tensor_paths.get(id(tensor))
        if first is not None:
            self.aliases.setdefault(first, []).append(path)
            return
        self._tensor_paths[id(tensor)] = path
        self.tensors[path] = tensor
        self.locations[path] = Location(path, bindable)

    def _visit(self, value: Any, path: str, bindable: bool, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            self._add_tensor(value, path, bindable)
            return
        if isinstance(value, bool) or value is None or isinstance(value, _SKIPPED_TYPES):
            return
        if isinstance(value, int):
            self.counters.setdefault(path, value)
            return
        if depth > MAX_DEPTH or id(value) in self._seen_objects:
            return
        self._seen_objects.add(id(value))
        if isinstance(value, torch.nn.Module):
            self._visit_module(value, path, bindable, depth)
            return
        for key, item in self._items(value):
            part, ok = _part(key)
            self._visit(item, _join(path, part), bindable and ok, depth + 1)

    def _visit_module(self, module: torch.nn.Module, path: str, bindable: bool, depth: int) -> None:
        # children first, so that a module reached again through a plain attribute keeps its module path
        walked = [(path, module)]
        for name, child in module.named_modules(prefix=path, remove_duplicate=True):
            if child is not module and id(child) not in self._seen_objects:
                self._seen_objects.add(id(child))
                walked.append((name, child))
        for name, child in walked:
            self.modules.setdefault(name, child)
            for buffer_name, buffer in child._buffers.items():
                if buffer is not None:
                    self._add_tensor(buffer, _join(name, buffer_name), bindable)
        for name, child in walked:
            for attribute, item in vars(child).items():
                if attribute in _MODULE_INTERNALS:
                    continue
                part, ok = _part(attribute)
                self._visit(item, _join(name, part), bindable and ok, depth + 1)

    @staticmethod
    def _items(value: Any) -> Iterator[tuple[Any, Any]]:
        if isinstance(value, Mapping):
            yield from value.items()
        elif isinstance(value, (list, tuple)):
            yield from enumerate(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                yield field.name, getattr(value, field.name, None)
        elif attrs.has(type(value)):
            for field in attrs.fields(type(value)):
                yield field.name, getattr(value, field.name, None)
        elif hasattr(value, "__dict__"):
            yield from vars(value).items()


def find_tensors(model: Any, state: Any) -> Walker:
    walker = Walker()
    walker.walk(model, "", True)
    if state is not None:
        if isinstance(state, Mapping) and all(isinstance(k, str) and k.isidentifier() for k in state):
            for name, item in state.items():
                walker.walk(item, f"state.{name}", False)
        else:
            walker.walk(state, "state", False)
    return walker


@attrs.frozen
class ModuleTensor:
    """A tensor a module took or returned during one call, printed at its head and tail."""

    module: str
    role: str  # "input" or "output"
    shape: tuple[int, ...]
    tensor: torch.Tensor = attrs.field(eq=False, repr=False)


def _flat_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 2 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat_tensors(item, depth + 1)
    elif depth < 2 and isinstance(value, Mapping):
        for item in value.values():
            yield from _flat_tensors(item, depth + 1)


class ModuleRecorder:
    """Forward hooks on every module: the tensors each one took and returned during the current call."""

    def __init__(self, modules: Mapping[str, torch.nn.Module]) -> None:
        self.calls: list[ModuleTensor] = []
        self.order: list[str] = []
        self._handles = []
        for path, module in modules.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(path)))
            self._handles.append(module.register_forward_hook(self._hook(path), with_kwargs=True))

    def _pre_hook(self, path: str):
        def called(module, args):
            if path not in self.order:
                self.order.append(path)

        return called

    def _hook(self, path: str):
        def record(module, args, kwargs, output):
            for role, value in (("input", (args, kwargs)), ("output", output)):
                for tensor in _flat_tensors(value):
                    if 0 < tensor.numel() <= IO_PRINT_LIMIT and tensor.dim() > 0:
                        self.calls.append(ModuleTensor(path, role, tuple(tensor.shape), tensor.detach()))

        return record

    def take(self) -> list[ModuleTensor]:
        calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def rng_states(device_types: set[str]) -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if "cuda" in device_types and torch.cuda.is_available():
        states.extend(torch.cuda.get_rng_state_all())
    return states
