"""From a `Recording` to proposals: the input and output streams, the clocks, and one region per
persistent tensor with its time axis, advance per call, retention, start and binding.

Each rule reads the recording only; where a rule had to guess, the proposal carries a note that
the written `.clock` shows as a `#` comment.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from fractions import Fraction

import attrs
import torch

from duplexcadence.interpreter.draft.observe import Seen
from duplexcadence.interpreter.draft.record import Call, Recording, Stream

DTYPE_NAMES = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}


@attrs.frozen
class InputProposal:
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    units_per_call: Fraction
    context: int  # units of history each call re-reads (kept between calls)
    given: int  # units present before the first call's new ones
    new_units: tuple[int, ...]  # new units per call
    notes: tuple[str, ...] = ()
    first: bool = False  # the history it keeps starts as copies of its first unit (`start first`)


@attrs.frozen
class OutputProposal:
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    units_per_call: Fraction  # the steady advance, or the mean when the module decides
    advance: int | None  # fixed units per call, None when the length follows the input
    latency: int
    notes: tuple[str, ...] = ()
    loss: int = 0  # units every call is short of what its input is worth (`loses L`)


@attrs.frozen
class Retention:
    kind: str  # "fixed", "last", "ring", "first_last", "all"
    first: int = 0
    last: int = 0

    def keeps(self) -> int:
        return self.first + self.last


@attrs.frozen
class RegionProposal:
    path: str
    bindable: bool
    dtype: str
    shape: tuple[int | None, ...]
    time_axis: int | None
    advance: int | None
    retention: Retention
    start: str
    start_length: int
    stock: int | None
    notes: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    def signature(self) -> tuple:
        return (self.dtype, self.shape, self.time_axis, self.advance, self.retention, self.start, self.start_length)


@attrs.frozen
class CounterProposal:
    """Host ints that start at 0 and advance by `step` every call: one `counter` (`paths`: where they live,
    several when they count alike at paths that differ by an index)."""

    paths: tuple[str, ...]
    step: int

    @property
    def path(self) -> str:
        return self.paths[0]


@attrs.frozen
class Proposals:
    calls: int
    call_rate: Fraction
    inputs: tuple[InputProposal, ...]
    outputs: tuple[OutputProposal, ...]
    regions: tuple[RegionProposal, ...]
    counters: tuple[str, ...]  # notes on host-side ints that change between calls
    skipped: tuple[str, ...]  # notes on tensors seen but not proposed
    draws_random: bool
    module_order: tuple[str, ...]
    counter_proposals: tuple[CounterProposal, ...] = ()
    state_roots: dict[str, str] = attrs.field(factory=dict)  # caller-owned objects: path prefix -> name
    handback: bool = False
    call: Call | None = None  # the step as a call of the model (else a hook stands for it)
    state_learnt: bool = False  # the handed-back state started as None: the object is what the first call returned


class DraftError(Exception):
    """The recording cannot be turned into a `.clock` draft (what is missing, and what would help)."""


# --- streams -------------------------------------------------------------------------------------


def units_per_call(counts: list[int]) -> Fraction:
    """The exact units per call q whose floor pattern (⌊(k+1)q⌋ − ⌊kq⌋, as the runtime feeds an input
    on a faster clock) reproduces `counts`; the mean when none with a small denominator does."""
    total, calls = sum(counts), len(counts)
    for denominator in range(1, 17):
        q = Fraction(total, calls).limit_denominator(denominator)
        if all((k + 1) * q // 1 - k * q // 1 == n for k, n in enumerate(counts)):
            return q
    return Fraction(total, calls)


def _overlap(previous: tuple, current: tuple) -> int:
    """The most units at the head of `current` equal to the tail of `previous` (fewer than `current` has)."""
    for count in range(min(len(previous), len(current) - 1), 0, -1):
        if current[:count] == previous[-count:]:
            return count
    return 0


def _shape(shape: tuple[int, ...], axis: int | None) -> tuple[int | None, ...]:
    return tuple(None if i == axis else d for i, d in enumerate(shape))


def propose_input(stream: Stream) -> InputProposal:
    lengths = [shape[stream.time_axis] for shape in stream.shapes]
    overlaps = [_overlap(stream.prints[k - 1], stream.prints[k]) for k in range(1, len(lengths))]
    context = overlaps[0] if overlaps and overlaps[0] > 0 and len(set(overlaps)) == 1 else 0
    notes = []
    given = context if context and len(lengths) > 1 and lengths[0] == lengths[1] else 0
    new = [lengths[0] - given] + [n - context for n in lengths[1:]]
    if context:
        notes.append(
            f"each call re-reads the previous call's last {context} units: left context, or lookahead the "
            f"previous call held back (then `read {stream.name} last {lengths[-1]} lookahead {context}`)"
        )
    q = units_per_call(new)
    if len(set(new)) > 1:
        notes.append(f"{'/'.join(map(str, new[:6]))} new units per call: {q} on average")
    dtype = DTYPE_NAMES.get(stream.dtype)
    if dtype is None:
        raise DraftError(f"input '{stream.name}' has dtype {stream.dtype}, which no region can hold")
    if given:
        notes.append(f"the first call already read {given} units before its new ones: given at session start")
    shape = _shape(stream.shapes[0], stream.time_axis)
    return InputProposal(stream.name, dtype, shape, q, context, given, tuple(new), tuple(notes))


def propose_output(stream: Stream, input_units: list[int], call_rate: Fraction) -> OutputProposal:
    lengths = [shape[stream.time_axis] for shape in stream.shapes]
    dtype = DTYPE_NAMES.get(stream.dtype)
    if dtype is None:
        raise DraftError(f"output '{stream.name}' has dtype {stream.dtype}, which no region can hold")
    shape = _shape(stream.shapes[-1], stream.time_axis)
    steady = lengths[1:] or lengths
    if len(set(steady)) == 1:
        advance = steady[0]
        latency = advance - lengths[0] if lengths[0] < advance else 0
        notes = []
        if latency:
            notes.append(f"the first call wrote {lengths[0]}, every later one {advance}: {latency} held back")
        return OutputProposal(stream.name, dtype, shape, Fraction(advance), advance, latency, tuple(notes))
    pairs = sorted(set(zip(input_units, lengths)))
    if len({n for n, _ in pairs}) >= 2:
        (n0, l0), (n1, l1) = pairs[0], pairs[-1]
        per_unit = Fraction(l1 - l0, n1 - n0)
        offset = l0 - per_unit * n0
        if per_unit > 0 and per_unit.denominator == 1 and all(length == per_unit * n + offset for n, length in pairs):
            note = f"writes {per_unit} units per input unit" + (f" and {int(offset):+d} per call" if offset else "")
            loss = int(-offset) if offset < 0 else 0  # every call short: lost at each boundary of a stream
            return OutputProposal(
                stream.name, dtype, shape, per_unit * units_per_call(input_units), None, 0, (note,), loss
            )
    mean = Fraction(sum(lengths), len(lengths))
    guess = f"wrote {'/'.join(map(str, lengths[:6]))} units per call; the rate is a guess from their mean"
    return OutputProposal(stream.name, dtype, shape, mean, None, 0, (guess,))


# --- regions -------------------------------------------------------------------------------------


def _present(recording: Recording, path: str) -> list[Seen | None]:
    return [snapshot.get(path) for snapshot in recording.after]


def _mode(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None


def _input_history(recording: Recording, path: str, inputs: dict[str, InputProposal]) -> tuple[str, int] | None:
    """(input, most units) when the tensor always holds the newest units of an input stream."""
    series = _present(recording, path)
    for name, stream in recording.inputs.items():
        proposal = inputs[name]
        axis = stream.time_axis
        history: list = []
        longest = 0
        for k, state in enumerate(series):
            history.extend(stream.prints[k][proposal.context if k else 0 :])
            if state is None or state.slices is None:
                continue
            if state.dtype != stream.dtype or len(state.shape) != len(stream.shapes[k]):
                break
            if _shape(state.shape, axis) != _shape(stream.shapes[k], axis):
                break
            length = state.shape[axis]
            if length == 0 or length > len(history) or tuple(history[-length:]) != state.slices[axis]:
                break
            longest = max(longest, length)
        else:
            if longest:
                return name, longest
    return None


def _changes(series: list[Seen | None]) -> bool:
    for before, now in itertools.pairwise(series):
        if (before is None) != (now is None):
            return True
        if before is None or now is None:
            continue
        if before.shape != now.shape or before.whole != now.whole or before.slices != now.slices:
            return True
    return False


def _shift(series: list[Seen | None], axis: int) -> int | None:
    """The d such that every call's tensor is the previous one moved d units towards the head (a window)."""
    pairs = [(b, n) for b, n in itertools.pairwise(series) if b is not None and n is not None and b.shape == n.shape]
    # the prints along `axis` of each pair (a pair has both or neither: its tensors have one shape)
    along = [(b.slices[axis], n.slices[axis]) for b, n in pairs if b.slices is not None and n.slices is not None]
    if not pairs or len(along) != len(pairs):
        return None
    length = pairs[0][1].shape[axis]
    for d in range(1, length):
        if all(new[: length - d] == old[d:] for old, new in along) and any(new != old for old, new in along):
            return d
    return None


def _ring(series: list[Seen | None], axis: int) -> int | None:
    """The c such that each call rewrites c consecutive slots along `axis`, the next c each call (mod L)."""
    present = [s for s in series if s is not None]
    along = [s.slices[axis] for s in present if s.slices is not None]
    if len(present) < 3 or len({s.data_ptr for s in present}) != 1 or len(along) != len(present):
        return None
    length = present[0].shape[axis]
    starts, width = [], None
    for before, now in itertools.pairwise(along):
        changed = [j for j in range(length) if before[j] != now[j]]
        if not changed or len(changed) >= length:
            return None
        count = len(changed)
        start = next(j for j in changed if (j - 1) % length not in changed)
        if sorted((start + t) % length for t in range(count)) != changed:
            return None
        if width is not None and count != width:
            return None
        width = count
        starts.append(start)
    if width is None or any((b + width) % length != n for b, n in itertools.pairwise(starts)):
        return None
    return width


def _owner_advance(recording: Recording, path: str, shape: tuple[int, ...]) -> tuple[int, int, str] | None:
    """(axis, units per call, note) from the input or output of the module that owns the tensor."""
    owners = [m for m in recording.module_shapes if m and (path == m or path.startswith(m + "."))]
    if not owners:
        return None
    owner = max(owners, key=len)
    inputs, outputs = recording.module_shapes[owner]
    for role, shapes in (("output", outputs), ("input", inputs)):
        for other in shapes:
            if len(other) != len(shape):
                continue
            differing = [a for a, (x, s) in enumerate(zip(other, shape)) if x != s]
            if len(differing) == 1:
                axis = differing[0]
                note = (
                    f"rate guessed from the {role} of module '{owner}' ({other[axis]} units per call along axis "
                    f"{axis}); check it against what the module keeps"
                )
                return axis, other[axis], note
            if not differing:
                axis = len(shape) - 1
                note = f"rate guessed from the {role} of module '{owner}' (same shape): check the time axis"
                return axis, other[axis], note
    return None


def _start(
    initial: Seen | None,
    first: Seen | None,
    axis: int | None,
    advance: int | None,
    match_zero: bool,
    match_first: bool = False,
):
    if initial is not None and initial.numel > 0:
        if initial.is_zero():
            return "zeros", (initial.shape[axis] if axis is not None else 0), None
        return "given", (initial.shape[axis] if axis is not None else 0), None
    if axis is None:
        return "zeros", 0, None
    if first is not None and first.slices is not None and advance:
        length = first.shape[axis]
        if length > advance and all(p == (0.0, 0.0, 0.0) for p in first.slices[axis][: length - advance]):
            return "zeros", 0, "the first call left zeros ahead of its units: the stock pads zeros"
    if match_zero:
        return "zeros", 0, "the first call's module input began with zeros where the carry goes: the stock pads zeros"
    if match_first:
        return (
            "first-firing",
            0,
            "the first call's module input began with copies of its first new unit where the carry goes: the "
            "stock pads by replicating it, from the data (its first call makes the start)",
        )
    return "empty", 0, None


def propose_region(recording: Recording, path: str, call_rate: Fraction) -> RegionProposal | str | None:
    """A proposal, a note saying why the tensor is left out, or None for a constant."""
    series = _present(recording, path)
    initial = recording.initial.get(path)
    present = [s for s in series if s is not None]
    if not present:
        return None
    if all(s.numel == 0 for s in present):
        return _zero_length(recording, path, present[-1])
    if not _changes(series):
        return None
    last = present[-1]
    dtype = DTYPE_NAMES.get(last.dtype)
    if dtype is None:
        return f"{path}: dtype {last.dtype} changes between calls but no region can hold it"
    location = recording.locations[path]
    notes: list[str] = []
    shapes = [s.shape for s in present] + ([initial.shape] if initial is not None else [])
    if len({len(s) for s in shapes}) != 1:
        return f"{path}: its rank changes between calls"
    varying = [a for a in range(len(last.shape)) if len({s[a] for s in shapes}) > 1]
    after_calls = [s.shape for s in series if s is not None]
    grows_later = len(varying) == 1 and len({s[varying[0]] for s in after_calls}) > 1
    axis: int | None = None
    advance: int | None = None
    retention: Retention
    match_zero = match_first = False
    matches = [m for k, found in enumerate(recording.matches) if k > 0 for m in found.get(path, ())]
    first_matches = recording.matches[0].get(path, ()) if recording.matches else ()
    if len(varying) > 1:
        return f"{path}: its shape changes along {len(varying)} axes between calls"
    if grows_later:
        axis = varying[0]
        lengths = [s.shape[axis] if s is not None else 0 for s in series]
        before = initial.shape[axis] if initial is not None else 0
        steps = [b - a for a, b in zip([before, *lengths], lengths)]
        advance = _mode([d for d in steps[1:] if d > 0])
        most = max(lengths)
        flat = len(lengths) >= 2 and lengths[-1] == lengths[-2] == most
        if not flat:
            retention = Retention("all", 0, most)
            notes.append(
                f"grows by {advance} per call for {recording.calls} calls; run more calls (--max-calls) to see "
                "whether it stops, and give the session horizon"
            )
        else:
            pinned = _pinned(series, axis, most, from_head=True)
            pinned_tail = _pinned(series, axis, most, from_head=False)
            if 0 < pinned < most:
                retention = Retention("first_last", pinned, most - pinned)
                notes.append(f"the first {pinned} units never changed once it was full: a pinned prefix")
            elif 0 < pinned_tail < most:
                retention = Retention("first_last", most - pinned_tail, pinned_tail)
                notes.append(
                    f"newest units first (the stock puts new units before old ones): the last {pinned_tail} never "
                    f"changed once it was full, the first {most - pinned_tail} are the newest; declared in the "
                    "stock's index order"
                )
            else:
                retention = Retention("last", 0, most)
                notes.append(f"grew by {advance} per call until {most}, then kept {most}")
    else:
        for candidate in range(len(last.shape)) if last.slices is not None else ():
            d = _shift(series, candidate)
            if d is not None:
                axis, advance = candidate, d
                break
        if axis is None and matches:
            # the tail of a module's input says more than the tail of an output: an output's tail may be
            # pending (a transposed convolution's overlap) or simply the next module's input
            inputs_only = [m for m in matches if m.role == "input"] or matches
            counted = Counter((m.axis, m.arrived) for m in inputs_only)
            (axis, advance), _ = counted.most_common(1)[0]
        if axis is None and last.slices is not None:
            for candidate in range(len(last.shape)):
                width = _ring(series, candidate)
                if width is not None:
                    axis, advance = candidate, width
                    break
        if axis is None:
            owned = _owner_advance(recording, path, last.shape)
            if owned is not None and last.numel > 0:
                axis, advance, note = owned
                notes.append(note)
        if axis is not None:
            match_zero = any(m.head_zero and m.axis == axis for m in first_matches)
            match_first = any(m.head_first and m.axis == axis for m in first_matches)
            length = last.shape[axis]
            pointers = {s.data_ptr for s in present} | ({initial.data_ptr} if initial is not None else set())
            if len(pointers) == 1:
                retention = Retention("ring", 0, length)
            else:
                retention = Retention("last", 0, length)
        else:
            retention = Retention("fixed")
            if last.slices is None:
                notes.append("too large to follow slice by slice: declared whole")
    if axis is not None and advance is None:
        return f"{path}: its time axis is {axis} but no advance per call could be told"
    start, start_length, start_note = _start(initial, series[0], axis, advance, match_zero, match_first)
    if start_note:
        notes.append(start_note)
    if retention.kind == "all" and start == "zeros":
        start = "given"
    if start == "given" and axis is not None:
        start_length = min(start_length, retention.keeps())
        if start_length == 0:
            start = "empty"
    stock = None
    if axis is not None:
        unit_bytes = last.numel // max(last.shape[axis], 1) * torch.empty((), dtype=last.dtype).element_size()
        if unit_bytes:
            most_stored = max(s.storage_bytes for s in present) // unit_bytes
            if most_stored > retention.keeps():
                stock = most_stored
                notes.append(f"stock keeps {most_stored} units alive (the storage its view points into)")
    return RegionProposal(
        path=path,
        bindable=location.bindable,
        dtype=dtype,
        shape=_shape(last.shape, axis),
        time_axis=axis,
        advance=advance,
        retention=retention,
        start=start,
        start_length=start_length,
        stock=stock,
        notes=tuple(notes),
        aliases=recording.aliases.get(path, ()),
    )


def _zero_length(recording: Recording, path: str, last: Seen) -> RegionProposal | str:
    """A tensor that holds no units every call (the cache of a kernel-1 or kernel = stride conv): a region that
    keeps 0 units (`retain last 0`), its time axis the one of length 0, its advance the units the module inputs
    of its other dimensions take per call (the most common)."""
    zeros = [a for a, d in enumerate(last.shape) if d == 0]
    skipped = f"{path}: zero-length every call, along no single axis: nothing to keep"
    location = recording.locations[path]
    if location.bindable and not any(m and (path == m or path.startswith(m + ".")) for m in recording.module_order):
        return f"{path}: zero-length every call, in a module the call never ran: nothing to keep"
    dtype = DTYPE_NAMES.get(last.dtype)
    if len(zeros) != 1 or dtype is None:
        return skipped
    axis = zeros[0]
    others = _shape(last.shape, axis)
    extents = Counter(
        shape[axis]
        for inputs, _ in recording.module_shapes.values()
        for shape in inputs
        if len(shape) == len(last.shape) and _shape(shape, axis) == others and shape[axis] > 0
    )
    if not extents:
        return skipped
    advance = extents.most_common(1)[0][0]
    note = (
        f"zero-length every call (the cache of a kernel-1 conv, or kernel = stride); {advance} units a call, the "
        "most common length of the module inputs of its shape: check it"
    )
    return RegionProposal(
        path=path,
        bindable=location.bindable,
        dtype=dtype,
        shape=others,
        time_axis=axis,
        advance=advance,
        retention=Retention("last", 0, 0),
        start="empty",
        start_length=0,
        stock=None,
        notes=(note,),
        aliases=recording.aliases.get(path, ()),
    )


def _pinned(series: list[Seen | None], axis: int, most: int, from_head: bool) -> int:
    """Units at the head (or the tail) that stayed equal between consecutive full calls (the least over them)."""
    full = [s.slices[axis] for s in series if s is not None and s.shape[axis] == most and s.slices is not None]
    if len(full) < 2:
        return 0
    pinned = most
    for old, new in itertools.pairwise(full):
        if not from_head:
            old, new = old[::-1], new[::-1]
        count = 0
        while count < most and old[count] == new[count]:
            count += 1
        pinned = min(pinned, count)
    return pinned


def propose(recording: Recording, rate: Fraction) -> Proposals:
    if not recording.inputs:
        raise DraftError("the feed gave no input tensor: drafting needs at least one input with a time axis")
    inputs = {name: propose_input(stream) for name, stream in recording.inputs.items()}
    first_input = next(iter(inputs.values()))
    call_rate = rate / first_input.units_per_call
    input_units = list(first_input.new_units)
    outputs = tuple(propose_output(s, input_units, call_rate) for s in recording.outputs.values())
    regions: list[RegionProposal] = []
    skipped: list[str] = []
    consumed: dict[str, int] = {}
    replicated: set[str] = set()
    paths = list(dict.fromkeys(p for snapshot in recording.after for p in snapshot))
    for path in paths:
        history = _input_history(recording, path, inputs) if _changes(_present(recording, path)) else None
        if history is not None:
            name, longest = history
            consumed[name] = max(consumed.get(name, 0), longest)
            if any(m.head_first for m in (recording.matches[0].get(path, ()) if recording.matches else ())):
                replicated.add(name)
            skipped.append(f"{path}: the newest {longest} units of input '{name}' (its history)")
            continue
        proposal = propose_region(recording, path, call_rate)
        if isinstance(proposal, RegionProposal):
            regions.append(proposal)
        elif isinstance(proposal, str):
            skipped.append(proposal)
    final_inputs = []
    for name, found in inputs.items():
        kept = consumed.get(name, 0)
        if kept > found.context:
            note = f"the stock loop keeps the newest {kept} units of '{name}' between calls"
            found = attrs.evolve(found, context=kept, notes=(*found.notes, note))
        if name in replicated and not found.given:
            note = (
                f"before the first call that history was copies of the first unit of '{name}' (replicate padding): "
                "`start first`"
            )
            found = attrs.evolve(found, first=True, notes=(*found.notes, note))
        final_inputs.append(found)
    counters: dict[tuple, list[str]] = {}
    counting: dict[tuple[str, int], list[str]] = {}
    for path, values in recording.counters.items():
        known = [v for v in values if v is not None]
        steps_seen = {b - a for a, b in itertools.pairwise(known)}
        if len(known) == len(values) and known and known[0] == 0 and len(steps_seen) == 1 and min(steps_seen) > 0:
            template = re.sub(r"(^|\.)\d+(?=\.|$)", r"\1{i}", path)
            counting.setdefault((template, steps_seen.pop()), []).append(path)
            continue
        if len(set(known)) > 1:
            steps = tuple(sorted({b - a for a, b in itertools.pairwise(known)}))
            template = re.sub(r"(^|\.)\d+(?=\.|$)", r"\1{i}", path)
            counters.setdefault((template, known[0], known[-1], steps), []).append(path)
    counter_notes = []
    for (template, first, last, steps), paths in counters.items():
        where = paths[0] if len(paths) == 1 else f"{template} ({len(paths)} of them)"
        counter_notes.append(
            f"{where}: a host int, {first} -> {last} over {recording.calls} calls (steps "
            f"{', '.join(map(str, steps))}): not a region; in a hook, derive it from `firing.count`"
        )
    return Proposals(
        calls=recording.calls,
        call_rate=call_rate,
        inputs=tuple(final_inputs),
        outputs=outputs,
        regions=tuple(regions),
        counters=tuple(counter_notes),
        skipped=tuple(skipped),
        draws_random=recording.draws_random,
        module_order=recording.module_order,
        counter_proposals=tuple(CounterProposal(tuple(paths), step) for (_, step), paths in counting.items()),
        state_roots=dict(recording.state_roots),
        handback=recording.handback,
        call=recording.call,
        state_learnt=recording.state_learnt,
    )
