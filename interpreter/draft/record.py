"""Running the stock loop: one `Recording` of every call's inputs, outputs and persistent tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.draft.loop import StockLoop
from duplexcadence.interpreter.draft.observe import (
    Location,
    ModuleRecorder,
    Seen,
    find_tensors,
    rng_states,
    seen,
    slice_prints,
)


@attrs.frozen
class TailMatch:
    """A persistent tensor equal to the last `length` units of a module's input or output along `axis`:
    the module saw `extent` units there, so `extent - length` arrived in the call."""

    module: str
    role: str
    axis: int
    extent: int
    length: int
    head_zero: bool  # the module's first `length` units along `axis` were all zero
    carried: bool  # those first units were the tensor's value before the call: the module saw carry + new
    head_first: bool = False  # the first `length` units were copies of the unit after them (replicate padding)

    @property
    def arrived(self) -> int:
        """Units that arrived in the call. An output whose tail is the tensor emitted the rest (a transposed
        convolution's overlap stays pending); an input whose head is the old value saw carry + new."""
        if self.role == "output" or self.carried:
            return self.extent - self.length
        return self.extent


@attrs.frozen
class Stream:
    """One input or output: its tensor per call, printed along its time axis."""

    name: str
    time_axis: int
    dtype: torch.dtype
    shapes: tuple[tuple[int, ...], ...]
    prints: tuple[tuple, ...]  # per call, the slice prints along the time axis


@attrs.frozen
class Recording:
    calls: int
    initial: dict[str, Seen]
    after: tuple[dict[str, Seen], ...]
    locations: dict[str, Location]
    aliases: dict[str, tuple[str, ...]]
    matches: tuple[dict[str, tuple[TailMatch, ...]], ...]
    module_shapes: dict[str, tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]]
    module_order: tuple[str, ...]
    inputs: dict[str, Stream]
    outputs: dict[str, Stream]
    counters: dict[str, tuple[int | None, ...]]
    """Each host int at the start, then after each call (None: before the path held one)."""
    draws_random: bool
    state_roots: dict[str, str] = attrs.field(factory=dict)
    """The caller-owned objects: path prefix (`state`, or `state.NAME` for a dict of named objects) -> name."""
    handback: bool = False
    """Whether the step took its state and returned it (`StockLoop.handback`)."""
    call: Call | None = None
    """How the step calls the model, when it is a module or a method of one (else a hook stands for it)."""
    state_learnt: bool = False
    """Whether the step took its state and returned it, starting from None (the object is what it returned)."""


@attrs.frozen
class Call:
    """The stock step as a call of the model: `module` (a path from the model root, `decode` for a method of the
    root), the keyword its state goes in by and comes back from (`state_keyword`, with `handback="NAME"`), the
    constant `keywords`, and whether it returns a record whose fields are the outputs (`record`)."""

    module: str
    keywords: tuple[tuple[str, Any], ...] = ()
    state_keyword: str | None = None
    record: bool = False


class StepError(Exception):
    """The stock loop could not be run or returned something drafting cannot read."""


def module_call(model: Any, step: Any) -> str | None:
    """The path of the module (or `path.method`) the step is, from the model root; None for any other function."""
    target: Any = step
    method = "forward"
    if not isinstance(step, torch.nn.Module):
        target, method = getattr(step, "__self__", None), getattr(step, "__name__", "")
    if not isinstance(model, torch.nn.Module) or not isinstance(target, torch.nn.Module) or not method.isidentifier():
        return None
    for path, module in model.named_modules():
        if module is target:
            if method == "forward":
                return path
            return f"{path}.{method}" if path else method
    return None


def is_record(value: Any) -> bool:
    """A returned value whose outputs are its fields: a mapping (a `ModelOutput`), a dataclass or attrs instance."""
    if isinstance(value, Mapping):
        return True
    return (dataclasses.is_dataclass(value) and not isinstance(value, type)) or attrs.has(type(value))


def record_items(value: Any) -> dict[str, Any]:
    """A record's fields by name (a `ModelOutput` keeps only the fields that are set)."""
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if attrs.has(type(value)):
        return {f.name: getattr(value, f.name) for f in attrs.fields(type(value))}
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _outputs(loop: StockLoop, value: Any) -> dict[str, torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return {loop.outputs[0]: value}
    if is_record(value):
        tensors = {k: v for k, v in record_items(value).items() if isinstance(v, torch.Tensor)}
    elif isinstance(value, (list, tuple)):
        if len(value) > len(loop.outputs):
            names = [*loop.outputs, *(f"out{i}" for i in range(len(loop.outputs), len(value)))]
        else:
            names = list(loop.outputs)
        tensors = {names[i]: v for i, v in enumerate(value) if isinstance(v, torch.Tensor)}
    else:
        tensors = {}
    if not tensors:
        raise StepError(f"the step returned {type(value).__name__}, not a tensor, a tuple or a dict of tensors")
    return tensors


def _axis(shapes: list[tuple[int, ...]], given: int | None, name: str) -> int:
    """The time axis of a stream: the one given, else the one along which its length changes between calls,
    else the last."""
    rank = len(shapes[0])
    if rank == 0:
        raise StepError(f"'{name}' is a 0-d tensor: it has no time axis")
    if given is not None:
        return given % rank
    varying = [a for a in range(rank) if len({shape[a] for shape in shapes}) > 1]
    return varying[0] if len(varying) == 1 else rank - 1


def _tail_matches(
    snapshot: Mapping[str, Seen], previous: Mapping[str, Seen] | None, module_tensors, cache: dict
) -> dict[str, tuple[TailMatch, ...]]:
    found: dict[str, list[TailMatch]] = {}
    by_rank: dict[int, list] = {}
    for item in module_tensors:
        by_rank.setdefault(len(item.shape), []).append(item)
    for path, state in snapshot.items():
        if state.slices is None:
            continue
        for item in by_rank.get(len(state.shape), ()):
            if item.tensor.dtype != state.dtype:
                continue
            differing = [a for a, (x, s) in enumerate(zip(item.shape, state.shape)) if x != s]
            if len(differing) != 1 or item.shape[differing[0]] <= state.shape[differing[0]]:
                continue
            axis = differing[0]
            length, extent = state.shape[axis], item.shape[axis]
            key = (id(item.tensor), axis, length)
            if key not in cache:
                tail = slice_prints(item.tensor.narrow(axis, extent - length, length), axis)
                head = slice_prints(item.tensor.narrow(axis, 0, length), axis)
                after_head = slice_prints(item.tensor.narrow(axis, length, 1), axis)[0] if extent > length else None
                cache[key] = (tail, head, after_head)
            tail, head, after_head = cache[key]
            if tail == state.slices[axis]:
                head_zero = all(p == (0.0, 0.0, 0.0) for p in head)
                before = previous.get(path) if previous is not None else None
                if before is not None and before.slices is not None and before.shape == state.shape:
                    carried = head == before.slices[axis]
                else:
                    carried = head_zero
                head_first = after_head is not None and not head_zero and all(p == after_head for p in head)
                match = TailMatch(item.module, item.role, axis, extent, length, head_zero, carried, head_first)
                found.setdefault(path, []).append(match)
    return {path: tuple(matches) for path, matches in found.items()}


def record(loop: StockLoop, calls: int, max_calls: int) -> Recording:
    """Run `loop` for `calls` calls, and on up to `max_calls` while a tensor is still growing."""
    walker = find_tensors(loop.model, loop.state)
    initial = {path: seen(t) for path, t in walker.tensors.items()}
    locations = dict(walker.locations)
    aliases: dict[str, set[str]] = {p: set(a) for p, a in walker.aliases.items()}
    recorder = ModuleRecorder(walker.modules)
    device_types = {t.device.type for t in walker.tensors.values()}
    after: list[dict[str, Seen]] = []
    matches: list[dict[str, tuple[TailMatch, ...]]] = []
    module_shapes: dict[str, tuple[list, list]] = {}
    inputs: dict[str, dict] = {}
    outputs: dict[str, dict] = {}
    counters: dict[str, list[int | None]] = {path: [value] for path, value in walker.counters.items()}
    draws_random = False
    state = loop.state
    records: list[bool] = []
    try:
        with torch.no_grad():
            for tick in range(max_calls):
                feed = dict(loop.feed(tick))
                for name, tensor in feed.items():
                    if not isinstance(tensor, torch.Tensor):
                        raise StepError(f"feed({tick}) gave '{name}' as {type(tensor).__name__}, not a tensor")
                    if tensor.dim() == 0:
                        raise StepError(f"'{name}' is a 0-d tensor: it has no time axis")
                    stream = inputs.setdefault(name, {"dtype": tensor.dtype, "shapes": [], "prints": []})
                    stream["shapes"].append(tuple(tensor.shape))
                    stream["prints"].append(
                        tuple(slice_prints(tensor, a) if tensor.shape[a] else () for a in range(tensor.dim()))
                    )
                rng_before = rng_states(device_types)
                try:
                    result = _call(loop, state, feed)
                except Exception as error:
                    names = ", ".join(feed)
                    raise StepError(
                        f"call {tick} of the stock step (with {names}) raised {type(error).__name__}: {error}"
                    ) from error
                if isinstance(loop.handback, str):
                    if not is_record(result) or loop.handback not in record_items(result):
                        raise StepError(
                            f"with handback={loop.handback!r} the step returns a record (a ModelOutput, a dataclass, "
                            f"a dict) with the field '{loop.handback}', not {type(result).__name__}"
                        )
                    fields = record_items(result)
                    state = fields.pop(loop.handback)
                    result = fields
                elif loop.handback:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise StepError("with handback=True the step must return (output, new_state)")
                    result, state = result
                records.append(is_record(result))
                rng_after = rng_states(device_types)
                draws_random = draws_random or any(not torch.equal(a, b) for a, b in zip(rng_before, rng_after))
                for name, tensor in _outputs(loop, result).items():
                    if tensor.dim() == 0:
                        raise StepError(f"'{name}' is a 0-d tensor: it has no time axis")
                    stream = outputs.setdefault(name, {"dtype": tensor.dtype, "shapes": [], "prints": []})
                    stream["shapes"].append(tuple(tensor.shape))
                walker = find_tensors(loop.model, state)
                snapshot = {path: seen(t) for path, t in walker.tensors.items()}
                for path, location in walker.locations.items():
                    locations.setdefault(path, location)
                for path, more in walker.aliases.items():
                    aliases.setdefault(path, set()).update(more)
                for path, value in walker.counters.items():
                    counters.setdefault(path, [None] * (tick + 1)).append(value)
                module_tensors = recorder.take()
                for item in module_tensors:
                    shapes = module_shapes.setdefault(item.module, ([], []))
                    shapes[0 if item.role == "input" else 1].append(item.shape)
                matches.append(_tail_matches(snapshot, after[-1] if after else initial, module_tensors, {}))
                del module_tensors
                after.append(snapshot)
                if tick + 1 >= calls and not _still_growing(after):
                    break
    finally:
        recorder.close()
    return Recording(
        calls=len(after),
        initial=initial,
        after=tuple(after),
        locations=locations,
        aliases={path: tuple(sorted(more)) for path, more in aliases.items()},
        matches=tuple(matches),
        module_shapes={m: (tuple(dict.fromkeys(i)), tuple(dict.fromkeys(o))) for m, (i, o) in module_shapes.items()},
        module_order=tuple(recorder.order),
        inputs={n: _stream(n, s, loop.axis_of(n)) for n, s in inputs.items()},
        outputs={n: _stream(n, s, loop.axis_of(n)) for n, s in outputs.items()},
        counters={path: tuple(values) for path, values in counters.items()},
        draws_random=draws_random,
        state_roots=state_roots(loop.state, loop.handback),
        handback=bool(loop.handback),
        call=_described_call(loop, all(records)),
        state_learnt=loop.handback is not False and loop.state is None,
    )


def _call(loop: StockLoop, state: Any, feed: dict[str, Any]) -> Any:
    """One stock call: the state handed in as the loop says, with the constant keywords."""
    if isinstance(loop.handback, str):
        return loop.step(**feed, **{loop.handback: state}, **loop.keywords)
    if loop.handback:
        return loop.step(state, **feed, **loop.keywords)
    return loop.step(**feed, **loop.keywords)


def _stream(name: str, recorded: dict, given: int | None) -> Stream:
    """A recorded input (prints along every axis) or output (none) along its time axis."""
    axis = _axis(recorded["shapes"], given, name)
    prints = tuple(call[axis] for call in recorded.get("prints", ()))
    return Stream(name, axis, recorded["dtype"], tuple(recorded["shapes"]), prints)


def _described_call(loop: StockLoop, record: bool) -> Call | None:
    module = module_call(loop.model, loop.step)
    if module is None:
        return None
    keyword = loop.handback if isinstance(loop.handback, str) else None
    return Call(module, tuple(loop.keywords.items()), keyword, record)


def state_roots(state: Any, handback: bool | str = False) -> dict[str, str]:
    """The path prefix of each caller-owned object the walker visits (`find_tensors`), with its name: the
    keyword a `handback="NAME"` step takes it by, else `state` (an object the first call returns, when None)."""
    if isinstance(handback, str):
        return {"state": handback}
    if state is None:
        return {"state": "state"} if handback else {}
    if isinstance(state, Mapping) and all(isinstance(k, str) and k.isidentifier() for k in state):
        return {f"state.{name}": name for name in state}
    return {"state": "state"}


def _still_growing(after: list[dict[str, Seen]]) -> bool:
    """Whether some tensor's size changed between the last two calls (a window still filling)."""
    if len(after) < 2:
        return True
    last, before = after[-1], after[-2]
    return any(path in before and before[path].numel != state.numel for path, state in last.items())
