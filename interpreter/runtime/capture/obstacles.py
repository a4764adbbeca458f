"""What stands in the way of capturing a stage into a CUDA graph, found by running it once before capture.

A graph replays device work only: whatever a stage does on the host is done once, at capture, and never
again. The probe runs a stage's body once under a `TorchDispatchMode` that sees every ATen operation it
calls and counts the ones a graph cannot hold:

* a device value read on the host (`aten._local_scalar_dense`: `.item()`, `int()`, `float()`, `bool()`,
  `if tensor:`, `.tolist()`), and an operation whose output size depends on the data (`nonzero`,
  `masked_select`, `unique`, indexing with a boolean mask): each waits for the device;
* a copy from host memory to the device (a CPU tensor `.to(device)`, `torch.tensor(..., device=...)`,
  `copy_` from a CPU tensor) and from the device to the host (`.cpu()`, `.numpy()`);
* an operation that reads a tensor the caller owns outside the arena (a tensor kept in a caller-owned
  object that is not a region): a graph would read it at the address it had at capture.

Each kind is counted per firing, so one probe reports them all (a stage that reads 37 device scalars says
so), instead of stopping at the first. `find_obstacles` takes the device type to look for, so the counting
is the same on a CPU (where `.item()` of a CPU tensor counts, and a copy to the `meta` device stands for a
host-to-device copy) as on CUDA.

Inside the probe, `torch.compile`'d functions run their Python eagerly (`torch.compiler.set_stance("force_eager")`,
`eager_compiled_code`). Under a `TorchDispatchMode` every tensor's dispatch key set gains `Python` and
`PythonTLSSnapshot`, so every guard of a compiled function fails; dynamo then refuses to compile under the mode
and marks the function's code object to be skipped for good: from then on the function runs eagerly in the
whole process, for the stock code too, with other rounding than its compiled kernel (moshi's `torch_compile_lazy`
rope: PersonaPlex's graphs would bake the eager rope while a stock reference run before them used the compiled
one). With the stance, dynamo never sees the frame and its cache is untouched.

A counter's host value (`firing.counters`, or a bound attribute that holds a Python int) is baked into a
graph at capture; a graph replays at instants a hyperperiod apart, so a stage that uses a counter whose
value changes between them cannot be captured either (`counter_obstacles`, with `RecordedCounters` telling
which counters a hook read).

Public: `Obstacle`, `ObstacleCounter`, `RecordedCounters`, `find_obstacles`, `eager_compiled_code`, `sync_warnings_in`,
`counter_obstacles`, `diagnostics_of`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import Diagnostic
from duplexcadence.dsl.source import Span

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_values  # what dict.items() and dict.values() return

HOST_READ = "reads a device value on the host (aten._local_scalar_dense: .item(), int(), float(), bool(), `if tensor:`, .tolist())"
DATA_SIZED = "runs an operation whose output size depends on the data ({ops}), which waits for the device"
HOST_TO_DEVICE = "copies host memory to the device ({ops}: a CPU tensor .to(device), torch.tensor(..., device=...))"
DEVICE_TO_HOST = "copies device memory to the host ({ops}: .cpu(), .numpy(), .tolist())"
CALLER_OWNED = "reads {path}, a caller-owned tensor outside the arena, whose address a graph would keep"
UNATTRIBUTED = "synchronises with the host where no operator shows it (torch.cuda.synchronize, an event or stream wait)"
HOST_COUNTER = "uses counter '{name}' as a Python int ({how}), whose value changes between replays of one graph"

ADVICE = {
    HOST_READ: "keep the value on the device (torch.where instead of `if`, a shape instead of a value); a hook "
    "that needs a step count takes `firing` and reads firing.count or firing.counters",
    DATA_SIZED: "give the output a fixed size (torch.nonzero_static, torch.where over the whole tensor, a mask "
    "multiplied in)",
    HOST_TO_DEVICE: "make the constant once, on the device (a registered buffer), outside the call",
    DEVICE_TO_HOST: "keep the result on the device, or move the host work out of the stage (a hook after it)",
    CALLER_OWNED: 'declare it as a region bound into its object (`bind OBJECT "path"`), so that it lives at a '
    "stable address in the arena",
    UNATTRIBUTED: "remove the synchronisation from the stage, or split the stage at it",
    HOST_COUNTER: "read the counter's device scalar in captured code (`read {name}`, or bind it to an attribute "
    "that holds a 0-d tensor), or give it a modulus the hyperperiod's advance is a multiple of",
}

_DATA_SIZED_OPS = frozenset(
    {
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten._unique2.default",
        "aten.unique_dim.default",
        "aten.unique_consecutive.default",
        "aten.repeat_interleave.Tensor",
    }
)


@attrs.frozen
class Obstacle:
    """One kind of host-side work in a stage, with how many times one firing did it (0: not counted, a use
    of a counter's host value): `kind` is one of the texts above (`HOST_READ`, ...), `operation` the words
    for it (with the operators seen), `advice` what to do."""

    kind: str
    operation: str
    count: int
    advice: str


def _device_of(value: Any) -> torch.device | None:
    return value.device if isinstance(value, torch.Tensor) else None


class ObstacleCounter(TorchDispatchMode):
    """Counts, while active, the operations of the kinds above on `device_type` (the device graphs are
    captured on), and the reads of `owned` tensors (data pointer -> a path naming it)."""

    def __init__(self, device_type: str, owned: dict[int, str] | None = None):
        super().__init__()
        self.device_type = device_type
        self.owned = dict(owned or {})
        self.counts: Counter[tuple[str, str]] = Counter()  # (kind, operator or path) -> count

    def _on_device(self, value: Any) -> bool:
        device = _device_of(value)
        return device is not None and device.type == self.device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [value for value in flat if isinstance(value, torch.Tensor)]
        if name == "aten._local_scalar_dense.default" and tensors and self._on_device(tensors[0]):
            self.counts[(HOST_READ, name)] += 1
        elif name in _DATA_SIZED_OPS and tensors and self._on_device(tensors[0]):
            self.counts[(DATA_SIZED, name.removeprefix("aten.").removesuffix(".default"))] += 1
        elif (
            name == "aten.index.Tensor"
            and self._on_device(args[0])
            and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
        ):
            self.counts[(DATA_SIZED, "indexing with a boolean mask")] += 1
        if self.owned:
            for tensor in tensors:
                pointer = _pointer(tensor)
                path = self.owned.get(pointer) if pointer is not None else None
                if path is not None:
                    self.counts[(CALLER_OWNED, path)] += 1
        result = func(*args, **kwargs)
        if name in ("aten._to_copy.default", "aten.copy_.default", "aten.lift_fresh.default"):
            self._copy(name, args, result)
        return result

    def _copy(self, name: str, args: tuple, result: Any) -> None:
        """A copy between the host and the device: `_to_copy(source) -> result`, `copy_(target, source)`,
        `lift_fresh(a tensor torch.tensor made from Python data)`."""
        if name == "aten.lift_fresh.default":
            if self.device_type != "cpu" and self._on_device(result):
                self.counts[(HOST_TO_DEVICE, "torch.tensor")] += 1
            return
        source, target = (args[0], result) if name == "aten._to_copy.default" else (args[1], args[0])
        source_device, target_device = _device_of(source), _device_of(target)
        if source_device is None or target_device is None:
            return
        if source_device.type == "cpu" and target_device.type == self.device_type != "cpu":
            self.counts[(HOST_TO_DEVICE, name.removeprefix("aten.").removesuffix(".default"))] += 1
        elif source_device.type == self.device_type != "cpu" and target_device.type == "cpu":
            self.counts[(DEVICE_TO_HOST, name.removeprefix("aten.").removesuffix(".default"))] += 1

    def obstacles(self, unattributed_syncs: int = 0) -> list[Obstacle]:
        """What was counted, one `Obstacle` per kind (per tensor for caller-owned reads), in a fixed order;
        `unattributed_syncs`: host synchronisations seen (sync-debug warnings) beyond those counted."""
        found: list[Obstacle] = []
        for kind in (HOST_READ, DATA_SIZED, HOST_TO_DEVICE, DEVICE_TO_HOST):
            ops = sorted((op, count) for (k, op), count in self.counts.items() if k == kind)
            if not ops:
                continue
            total = sum(count for _, count in ops)
            listed = ", ".join(op if count == 1 else f"{op} x{count}" for op, count in ops)
            operation = kind if kind == HOST_READ else kind.format(ops=listed)
            found.append(Obstacle(kind, operation, total, ADVICE[kind]))
        for (kind, path), count in sorted(self.counts.items()):
            if kind == CALLER_OWNED:
                found.append(Obstacle(kind, kind.format(path=path), count, ADVICE[kind]))
        if unattributed_syncs > 0:
            found.append(Obstacle(UNATTRIBUTED, UNATTRIBUTED, unattributed_syncs, ADVICE[UNATTRIBUTED]))
        return found

    def synchronising(self) -> int:
        """How many of the counted operations wait for the device (what sync-debug mode warns about)."""
        return sum(
            count
            for (kind, _), count in self.counts.items()
            if kind in (HOST_READ, DATA_SIZED, DEVICE_TO_HOST, HOST_TO_DEVICE)
        )


def _pointer(tensor: torch.Tensor) -> int | None:
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return None
    try:
        return tensor.data_ptr()
    except RuntimeError:  # a tensor without storage (a functional or fake tensor)
        return None


def owned_pointers(
    tensors: Iterable[tuple[str, torch.Tensor]], device_type: str, inside: Callable[[int], bool]
) -> dict[int, str]:
    """Data pointer -> path of the caller-owned tensors on `device_type` that are not arena memory (`inside`
    tells the arena's pointers)."""
    found: dict[int, str] = {}
    for path, tensor in tensors:
        if tensor.device.type != device_type:
            continue
        pointer = _pointer(tensor)
        if pointer is not None and not inside(pointer):
            found.setdefault(pointer, path)
    return found


def eager_compiled_code() -> AbstractContextManager:
    """`torch.compile`'d functions called inside run their Python eagerly, and dynamo's caches and skip marks
    stay as they were (see the module docstring: a compiled function called under a `TorchDispatchMode`
    would otherwise be left uncompiled for the rest of the process)."""
    return torch.compiler.set_stance("force_eager")


def find_obstacles(
    call: Callable[[], Any], device_type: str, owned: dict[int, str] | None = None, sync_warnings: bool = False
) -> list[Obstacle]:
    """Run `call()` once and return what would keep it out of a graph captured on `device_type`.
    `sync_warnings`: also run it under CUDA's sync-debug "warn" mode and report the synchronisations no
    counted operator explains."""
    counter = ObstacleCounter(device_type, owned)
    if not sync_warnings:
        with eager_compiled_code(), counter:
            call()
        return counter.obstacles()
    import warnings

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with eager_compiled_code(), counter:
                call()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    synchronisations = sync_warnings_in(str(w.message) for w in caught)
    return counter.obstacles(max(0, synchronisations - counter.synchronising()))


SYNC_WARNING = "called a synchronizing CUDA operation"
"""What CUDA's sync-debug "warn" mode says at each host synchronisation (c10/cuda/CUDAFunctions.cpp)."""


def sync_warnings_in(messages: Iterable[str]) -> int:
    """How many of `messages` report a host synchronisation. Other warnings do not count, among them the
    one torch gives once per process when sync-debug mode is first set ("Synchronization debug mode is a
    prototype feature and does not yet detect all synchronizing operations")."""
    return sum(1 for message in messages if SYNC_WARNING in message)


_K = TypeVar("_K")
_V = TypeVar("_V")


class RecordedCounters(dict[str, int]):
    """`firing.counters` during the probe: the counters a hook reads are in `read`, also when it copies them
    (`dict(...)`, `{**...}`, `.copy()`, `|`)."""

    def __init__(self, values: dict[str, int]):
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> int:
        self.read.add(key)
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        # Overriding __iter__ takes CPython's dict copy off its fast path: `dict(...)`, `{**...}` and
        # `update(...)` then read every value through __getitem__.
        return super().__iter__()

    def copy(self) -> dict[str, int]:
        self.read.update(self)
        return dict(super().items())

    def __or__(self, other: dict[_K, _V]) -> dict[str | _K, int | _V]:
        return self.copy() | other

    def __ror__(self, other: dict[_K, _V]) -> dict[str | _K, int | _V]:
        return other | self.copy()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def values(self) -> dict_values[str, int]:
        self.read.update(self)
        return super().values()

    def items(self) -> dict_items[str, int]:
        self.read.update(self)
        return super().items()


def counter_obstacles(read: Iterable[str], bound: Iterable[tuple[str, str]]) -> list[Obstacle]:
    """The counters a stage uses as host values that change between replays: `read` from `firing.counters`,
    `bound` (name, where) as Python ints in attributes."""
    uses = [(name, "firing.counters") for name in sorted(read)] + sorted(bound)
    return [
        Obstacle(HOST_COUNTER, HOST_COUNTER.format(name=name, how=how), 0, ADVICE[HOST_COUNTER].format(name=name))
        for name, how in uses
    ]


def diagnostics_of(stage: str, obstacles: Sequence[Obstacle], span: Span | None) -> list[Diagnostic]:
    """One located `capture-blocked` diagnostic per obstacle: the stage, the operation, how many times a
    firing does it, what to do."""
    return [messages.capture_obstacle(stage, o.operation, o.count, o.advice, span) for o in obstacles]
