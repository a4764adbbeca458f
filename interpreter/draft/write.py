"""From proposals to `.clock` text: clocks named by their factor on the input clock, regions named by
the shortest unique tail of their path, `{index}` families for members that differ only by an index."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from fractions import Fraction

import attrs

from duplexcadence.dsl.parse import reserved_words
from duplexcadence.dsl.resolve import path_problem, unsafe_segment
from duplexcadence.interpreter.draft.propose import Proposals, RegionProposal

INPUT_CLOCK = "frame"
CALL_CLOCK = "call"
STAGE = "step"
HOOK = "stock_step"
_GENERIC_PARTS = {"_streaming_state", "streaming_state"}


@attrs.frozen
class Family:
    """Regions that differ only by a number at one part of their path: the whole part (`layers.3.cache`) or a
    number inside it (`convnext_layer_5`), between `prefix` and `suffix`; `numbers` in member order."""

    members: tuple[RegionProposal, ...]
    index_part: int | None  # position of the index among the path's parts (None: a single region)
    index_name: str
    prefix: str = ""
    suffix: str = ""
    numbers: tuple[int, ...] = ()

    @property
    def first(self) -> RegionProposal:
        return self.members[0]

    def placeholder(self) -> str:
        """What the binding puts where the number goes: `{layer}`, `{layer + 5}`, `{2 * layer + 1}`, or a list
        of the numbers indexed, `{[1, 2, 4][layer]}`, for numbers that skip irregularly."""
        index, numbers = self.index_name, self.numbers
        steps = {b - a for a, b in itertools.pairwise(numbers)}
        if len(steps) != 1:
            return "{[" + ", ".join(map(str, numbers)) + "][" + index + "]}"
        step, first = steps.pop(), numbers[0]
        text = index if step == 1 else f"{step} * {index}"
        return "{" + text + (f" + {first}" if first else "") + "}"

    def template(self) -> str:
        parts = self.first.path.split(".")
        if self.index_part is not None:
            parts[self.index_part] = self.prefix + self.placeholder() + self.suffix
        return ".".join(parts)


def _identifier(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    return re.sub(r"_+", "_", cleaned)


def _legal(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_") and name not in reserved_words()


def rate_text(rate: Fraction) -> str:
    """A rate literal: a decimal where one is exact, else a product of exact factors."""
    denominator = rate.denominator
    while denominator % 2 == 0:
        denominator //= 2
    while denominator % 5 == 0:
        denominator //= 5
    if denominator == 1:
        text = f"{float(rate):.10f}".rstrip("0").rstrip(".")
        return f"{text} Hz"
    return f"1 Hz * {rate.numerator} / {rate.denominator}"


def factor_text(base: str, factor: Fraction) -> str:
    text = base
    if factor.numerator != 1:
        text += f" * {factor.numerator}"
    if factor.denominator != 1:
        text += f" / {factor.denominator}"
    return text


def _index_name(part: str) -> str:
    name = _identifier(part)
    if name.endswith("ies") and len(name) > 4:
        name = name[:-3] + "y"
    elif name.endswith("s") and len(name) > 3:
        name = name[:-1]
    return name if _legal(name) else "i"


def group_families(regions: tuple[RegionProposal, ...]) -> list[Family]:
    """Members of one family share everything but one number in one part of their path (the whole part, or a
    number inside it, as in `convnext_layer_5`); the numbers may start anywhere and skip."""
    groups: dict[tuple, list[tuple[int, RegionProposal]]] = defaultdict(list)
    for region in regions:
        parts = region.path.split(".")
        for position, part in enumerate(parts):
            for number in re.finditer(r"[0-9]+", part):
                prefix, suffix = part[: number.start()], part[number.end() :]
                template = tuple(p if i != position else None for i, p in enumerate(parts))
                key = (template, position, prefix, suffix, region.signature(), region.bindable)
                groups[key].append((int(number.group()), region))
    candidates = []
    for (_, position, prefix, suffix, *_rest), numbered in groups.items():
        if len(numbered) >= 2 and len({n for n, _ in numbered}) == len(numbered):
            ordered = sorted(numbered, key=lambda m: m[0])
            candidates.append((position, prefix, suffix, ordered))
    candidates.sort(key=lambda c: -len(c[3]))
    taken: set[str] = set()
    families: list[Family] = []
    for position, prefix, suffix, ordered in candidates:
        members = [r for _, r in ordered]
        if any(m.path in taken for m in members):
            continue
        taken.update(m.path for m in members)
        parts = members[0].path.split(".")
        words = re.findall(r"[A-Za-z]+", prefix)
        named = words[-1] if words else (parts[position - 1] if position > 0 else "")
        index_name = _index_name(named) if named else "i"
        families.append(Family(tuple(members), position, index_name, prefix, suffix, tuple(n for n, _ in ordered)))
    for region in regions:
        if region.path not in taken:
            families.append(Family((region,), None, ""))
    order = {region.path: i for i, region in enumerate(regions)}
    families.sort(key=lambda f: order[f.first.path])
    return families


def _name_parts(family: Family) -> list[str]:
    parts = family.first.path.split(".")
    kept = []
    for i, part in enumerate(parts):
        if i == family.index_part:
            part = family.prefix + family.suffix  # the part without its number
        if part in _GENERIC_PARTS or (i == 0 and not family.first.bindable):
            continue
        name = _identifier(part)
        if name:
            kept.append(name)
    return kept or ["region"]


def assign_names(families: list[Family], taken: set[str]) -> list[str]:
    """The shortest unique tail of each family's path parts, as a legal name."""
    parts = [_name_parts(f) for f in families]
    depth = [1] * len(families)

    def name(i: int) -> str:
        while depth[i] < len(parts[i]) and not _legal("_".join(parts[i][-depth[i] :])):
            depth[i] += 1
        text = "_".join(parts[i][-depth[i] :])
        return text if _legal(text) else "r_" + text

    while True:
        names = [name(i) for i in range(len(families))]
        counts = defaultdict(list)
        for i, n in enumerate(names):
            counts[n].append(i)
        clashes = [i for n, ids in counts.items() if len(ids) > 1 or n in taken for i in ids]
        growable = [i for i in clashes if depth[i] < len(parts[i])]
        if not growable:
            break
        for i in growable:
            depth[i] += 1
    final, used = [], set(taken)
    for n in names:
        candidate, suffix = n, 2
        while candidate in used:
            candidate, suffix = f"{n}_{suffix}", suffix + 1
        used.add(candidate)
        final.append(candidate)
    return final


def _shape_text(dtype: str, shape: tuple[int | None, ...]) -> str:
    return f"{dtype}[{', '.join('time' if d is None else str(d) for d in shape)}]"


def _retention_text(region: RegionProposal) -> str:
    retention = region.retention
    if retention.kind == "first_last":
        return f"retain first {retention.first} + last {retention.last}"
    if retention.kind == "all":
        return f"retain all horizon {retention.last}"
    return f"retain {retention.kind} {retention.last}"


def _start_text(region: RegionProposal) -> str:
    if region.start == "given" and region.time_axis is not None:
        return f"start given {region.start_length}"
    return f"start {region.start}"


def object_path(proposals: Proposals, path: str) -> tuple[str, str] | None:
    """(object name, path inside it) for a tensor or int found in a caller-owned object the step takes and
    returns (`handback`), when a binding can name it (attribute names and list indices); else None."""
    if not proposals.handback:
        return None
    for prefix, name in sorted(proposals.state_roots.items(), key=lambda item: -len(item[0])):
        if path.startswith(prefix + "."):
            inside = path[len(prefix) + 1 :]
            plain = re.sub(r"\{[^{}]*\}", "0", inside)  # a family's placeholders stand for numbers
            whole = inside.startswith("{")  # the object is the family's list itself: its members are passed
            return (name, inside) if path_problem(plain) is None and not whole else None
    return None


def _bind_text(owner: str | None, path: str) -> str:
    private = unsafe_segment(path, private=False) is not None  # moshi's `_streaming_state`
    return "bind " + ("private " if private else "") + (f"{owner} " if owner else "") + f'"{path}"'


def _counter_names(proposals: Proposals, taken: set[str]) -> list[str]:
    """Each counter's name: the shortest tail of its path's parts that is legal and unique."""
    parts = []
    for counter in proposals.counter_proposals:
        path = counter.path if len(counter.paths) == 1 else re.sub(r"(^|\.)\d+(?=\.|$)", "", counter.path)
        pieces = [_identifier(p) for p in path.split(".") if p and p != "state" and p not in _GENERIC_PARTS]
        parts.append([p for p in pieces if p] or ["count"])
    names: list[str] = []
    for pieces in parts:
        depth = 1
        while True:
            name = "_".join(pieces[-depth:])
            if _legal(name) and name not in taken and name not in names:
                break
            if depth >= len(pieces):
                base = name if _legal(name) else "count_" + name
                name, suffix = f"{base}_count", 2
                while name in taken or name in names:
                    name, suffix = f"{base}_count_{suffix}", suffix + 1
                break
            depth += 1
        names.append(name)
    return names


def _comment_lines(notes, indent: str = "") -> list[str]:
    return [f"{indent}# {note}" for note in notes]


def write_clock(proposals: Proposals, input_rate: Fraction, cadence: Fraction, source: str) -> tuple[str, dict]:
    """The `.clock` text and what it declares (names by path, clocks by rate) for the summary."""
    clocks: dict[Fraction, str] = {input_rate: INPUT_CLOCK}
    call_rate = proposals.call_rate
    if call_rate not in clocks:
        clocks[call_rate] = CALL_CLOCK

    def clock_for(rate: Fraction) -> str:
        if rate not in clocks:
            factor = rate / input_rate
            suffix = str(factor.numerator) if factor.denominator == 1 else f"{factor.numerator}_{factor.denominator}"
            clocks[rate] = f"{INPUT_CLOCK}_x{suffix}"
        return clocks[rate]

    families = group_families(proposals.regions)
    stream_names = {p.name for p in proposals.inputs} | {p.name for p in proposals.outputs}
    paths = [f.template() for f in families if not f.first.bindable] + [c.path for c in proposals.counter_proposals]
    objects = {found[0] for path in paths if (found := object_path(proposals, path)) is not None}
    reserved = {INPUT_CLOCK, CALL_CLOCK, STAGE} | stream_names | objects
    names = assign_names(families, reserved)
    counter_names = _counter_names(proposals, reserved | set(names))
    used_objects: set[str] = set()

    lines = [
        f"# Drafted by `dsl draft {source}` from {proposals.calls} calls of the stock streaming step.",
        "# Review every `#` note, rename what you like, then `dsl check` and `dsl plan` it.",
    ]
    if proposals.counters:
        lines.append("#")
        lines.append("# Host-side counters (not regions):")
        lines.extend(f"#   {note}" for note in proposals.counters)
    if proposals.skipped:
        lines.append("#")
        lines.append("# Seen but not declared:")
        lines.extend(f"#   {note}" for note in proposals.skipped)
    lines += ["", f"cadence {_duration_text(cadence)}", ""]

    region_lines: list[str] = []
    for proposal in proposals.inputs:
        clock = INPUT_CLOCK
        clauses = [f"on {clock}", "input"]
        if proposal.context:
            clauses.append(f"retain last {proposal.context}")
        if proposal.given:
            clauses.append(f"start given {proposal.given}")
        region_lines += _comment_lines(proposal.notes)
        if proposal.first:
            clauses.append("start first")
        region_lines.append(
            f"region {proposal.name} : {_shape_text(proposal.dtype, proposal.shape)} {' '.join(clauses)}"
        )
    for output in proposals.outputs:
        clock = clock_for(call_rate * output.units_per_call)
        region_lines += _comment_lines(output.notes)
        region_lines.append(f"region {output.name} : {_shape_text(output.dtype, output.shape)} on {clock} output")
    declared = {}
    for family, name in zip(families, names):
        region = family.first
        region_lines.append("")
        region_lines += _comment_lines(region.notes)
        inside = object_path(proposals, family.template()) if not region.bindable else None
        if not region.bindable and inside is None:
            region_lines.append(
                f"# caller-owned: found at {family.template()}, which is not reachable from the model: "
                "the runtime hands the region to the stage"
            )
        for alias in region.aliases[:3]:
            region_lines.append(f"# the same tensor is also reachable as {alias}")
        head = f"region {name}"
        if family.index_part is not None:
            head += f"[{family.index_name} < {len(family.members)}]"
        clauses = []
        if region.time_axis is not None:
            assert region.advance is not None, "a proposal with a time axis has its advance (propose_region)"
            clauses += [f"on {clock_for(call_rate * region.advance)}", _retention_text(region)]
        clauses.append(_start_text(region))
        if region.stock is not None:
            clauses.append(f"stock {region.stock}")
        region_lines.append(f"{head} : {_shape_text(region.dtype, region.shape)} {' '.join(clauses)}")
        if region.bindable:
            region_lines.append(f"    {_bind_text(None, family.template())}")
        elif inside is not None:
            used_objects.add(inside[0])
            region_lines.append(f"    {_bind_text(*inside)}")
        for member in family.members:
            declared[member.path] = name

    counter_lines: list[str] = []
    for counter, name in zip(proposals.counter_proposals, counter_names):
        inside = object_path(proposals, counter.path) if len(counter.paths) == 1 else None
        bind = ""
        if inside is not None:
            used_objects.add(inside[0])
            bind = " " + _bind_text(*inside)
        elif len(counter.paths) == 1 and path_problem(counter.path) is None and not counter.path.startswith("state"):
            bind = " " + _bind_text(None, counter.path)
        where = counter.path if len(counter.paths) == 1 else f"{len(counter.paths)} paths, {counter.path} ..."
        counter_lines.append(
            f"# a host int at {where}: 0, {counter.step}, {2 * counter.step}, ... (+{counter.step} a call)"
        )
        if not bind:
            counter_lines.append(
                f"# not bound: a hook reads it as firing.counters['{name}'] and sets it where the stock keeps it"
            )
        counter_lines.append(f"counter {name} +{counter.step} on {clocks[call_rate]}{bind}")

    call = proposals.call
    if call is not None and call.state_keyword is not None:
        used_objects.add(call.state_keyword)  # passed and returned even when nothing binds into it
    object_lines: list[str] = []
    for name in sorted(used_objects):
        if proposals.state_learnt:
            object_lines.append(
                f"# caller-owned: the step takes and returns it, None before the first call: made at load by one "
                f"call of stage {STAGE}, handed None"
            )
            object_lines.append(f"object {name} from stage {STAGE}")
            continue
        object_lines.append(
            f"# caller-owned: the step {'takes and returns' if proposals.handback else 'uses'} it; register "
            f"hooks={{'new_{name}': <a function of the model that makes a fresh one>}}"
        )
        object_lines.append(f"object {name} from new_{name}")

    clock_lines = [f"clock {INPUT_CLOCK} = {rate_text(input_rate)}  # the inputs' time axis"]
    for rate, name in sorted(clocks.items(), key=lambda item: item[0]):
        if name == INPUT_CLOCK:
            continue
        comment = "one stock call" if name == CALL_CLOCK else f"{rate_text(rate)}"
        clock_lines.append(f"clock {name} = {factor_text(INPUT_CLOCK, rate / input_rate)}  # {comment}")

    stage_clock = clocks[call_rate]
    stage = [f"stage {STAGE} on {stage_clock} {{"]
    if call is not None:
        private = "private " if unsafe_segment(call.module, private=False) is not None else ""
        stage.append(f'    module {private}"{call.module}"  # the stock call')
    else:
        stage.append(f"    hook {HOOK}  # the whole stock call; split it into one stage per module once this checks")
    top = list(dict.fromkeys(path.split(".")[0] for path in proposals.module_order if path))
    if top:
        stage.append(f"    # the call ran these submodules of the model, in this order: {', '.join(top)}")
    for proposal in proposals.inputs:
        read = f"    read {proposal.name} new"
        if proposal.context:
            read += f" + {proposal.context}"
        stage.append(read + (f" as {proposal.name}" if call is not None else ""))
    for name in sorted(used_objects):
        if call is not None and call.state_keyword == name:
            stage.append(f"    update {name} as {name} from {name}")
            continue
        stage.append(f"    {'update' if proposals.handback else 'read'} {name}")
    for keyword, value in call.keywords if call is not None else ():
        text = _argument_text(value)
        if text is None:
            stage.append(
                f"    # the call also takes {keyword}={value!r}, which `with` cannot give: call it from a hook"
            )
        else:
            stage.append(f"    with {keyword} = {text}")
    for family, name in zip(families, names):
        region = family.first
        stage.append(f"    update {name}" + (f" +{region.advance}" if region.time_axis is not None else ""))
    for output in proposals.outputs:
        write = f"    write {output.name}"
        if output.advance is not None:
            write += f" +{output.advance}"
            if output.latency:
                write += f" latency {output.latency}"
        if output.loss:
            write += f" loses {output.loss}"
        if call is not None and call.record:
            write += f" from {output.name}"
        stage.append(write)
    if proposals.draws_random:
        stage.append("    rng  # the call drew from the default generator")
    stage.append("}")
    extra = [""] + object_lines if object_lines else []
    extra += [""] + counter_lines if counter_lines else []
    text = "\n".join(lines + clock_lines + extra + [""] + region_lines + ["", *stage]) + "\n"
    return text, {"regions": declared, "clocks": {name: rate for rate, name in clocks.items()}, "families": families}


def _argument_text(value: object) -> str | None:
    """A constant keyword argument as a `with` value (`true`, `2`, `0.5`, `"zeros"`); None when `with` cannot
    give it (None, a tensor, an object)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        text = repr(value)
        return text if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text) else None
    if isinstance(value, str) and '"' not in value and "\n" not in value:
        return f'"{value}"'
    return None


def _duration_text(seconds: Fraction) -> str:
    if seconds.denominator == 1:
        return f"{seconds.numerator} s"
    milliseconds = seconds * 1000
    if milliseconds.denominator == 1:
        return f"{milliseconds.numerator} ms"
    return f"{seconds.numerator} s / {seconds.denominator}"
