"""Rules over a completed program: rates, clocks, retention, roles and cycles.

Each rule is a function `(program) -> diagnostics`; `run` applies them in order, after
`complete.run` has filled in what the file leaves implicit.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import attrs
import networkx as nx

from duplexcadence.dsl import bounds, complete, depgraph, messages
from duplexcadence.dsl.complete import read_need, units_per_firing
from duplexcadence.dsl.diagnostics import Diagnostic, Note
from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import (
    Access,
    ObjectPass,
    Program,
    RegionInfo,
    StageInfo,
    firings_within,
    lcm_fractions,
    session_seconds,
)
from duplexcadence.dsl.source import Span


def _fmt(value: Fraction) -> str:
    return number_text(value)


def check_rates(program: Program) -> Iterator[Diagnostic]:
    for stage in program.stages.values():
        stage_clock = program.clocks[stage.clock]
        for access in stage.accesses:
            region = program.regions[access.region]
            if _run_time_count(program, stage, region):
                continue  # counted at run time: check_run_time_lengths
            if region.fixed:
                if access.advance is not None or access.window != "all":
                    yield messages.fixed_advance(stage.name, access.region, access.span)
                continue
            assert region.clock is not None, "a region with a time axis advances on a clock"
            region_clock = program.clocks[region.clock]
            per_firing = units_per_firing(program, stage, access.region)
            rates = (stage.name, stage.clock, _fmt(stage_clock.rate))
            if access.kind == "update" and access.advance is None:
                yield messages.missing_advance(stage.name, access.region, _fmt(per_firing), access.span)
                continue
            verb = {"read": "reads new units of", "update": "updates", "write": "writes"}[access.kind]
            if (access.kind != "read" or access.window == "new") and per_firing < 1:
                yield messages.slower_region(
                    *rates, verb, access.region, region.clock, _fmt(region_clock.rate), access.span
                )
                continue
            if access.kind == "read":
                continue
            if access.advance is None and region.role == "output":
                continue  # the module decides the length
            if per_firing.denominator != 1:
                yield messages.fractional_advance(
                    *rates, verb, access.region, region.clock, _fmt(region_clock.rate), _fmt(per_firing), access.span
                )
                continue
            if access.advance is not None and Fraction(access.advance) != per_firing:
                yield messages.advance_mismatch(
                    *rates,
                    verb,
                    str(access.advance),
                    access.region,
                    region.clock,
                    _fmt(region_clock.rate),
                    _fmt(per_firing),
                    access.span,
                )


def available_to_read(program: Program, stage: StageInfo, access: Access, order: list[str] | None = None) -> int | None:
    """The most units a read can rely on: the history kept plus the units surely appended earlier in
    the same instant (fed by `step()`, or written by a stage that fires with it and runs before it).
    `order`: the stages in dataflow order, when the caller has it (it is the same for every read)."""
    region = program.regions[access.region]
    keeps = region.retention.keeps
    if keeps is None and region.retention.kind != "scratch":
        return None
    available = keeps or 0
    if region.role == "input":
        return available + math.floor(units_per_firing(program, stage, access.region))
    if access.prev:
        return available
    if order is None:
        try:
            order = depgraph.stage_order(program)
        except nx.NetworkXUnfeasible:  # stages that feed each other within an instant: `check_cycles` says so
            return None
    position = _positions(tuple(order))
    for other in program.stages.values():
        if other.name == stage.name or other.clock != stage.clock or position[other.name] > position[stage.name]:
            continue
        available += sum(a.advance or 0 for a in other.writes() if a.region == access.region)
    return available


@functools.lru_cache(maxsize=4)
def _positions(order: tuple[str, ...]) -> dict[str, int]:
    return {name: i for i, name in enumerate(order)}


def check_accesses(program: Program) -> Iterator[Diagnostic]:
    """Reads and writes that do not fit their region: windows on rings, lookaheads longer than the
    read, latencies without or beyond the advance, a region written twice, scratch read when dead."""
    writer_of: dict[str, tuple[str, Access]] = {}
    for stage in program.stages.values():
        written: dict[str, Access] = {}
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind == "read":
                if program.run_time_length(access.region):
                    continue  # handed whole: check_run_time_lengths
                if region.retention.kind == "ring" and access.window != "all":
                    window = f"last {access.count}" if access.window == "last" else "new units"
                    yield messages.window_on_ring(stage.name, access.region, window, access.span)
                elif access.lookahead:
                    found = read_need(program, stage, access)
                    span_units = found[0] if found is not None else region.retention.keeps
                    if span_units is not None and access.lookahead > span_units:
                        yield messages.lookahead_too_long(
                            stage.name, access.region, access.lookahead, span_units, access.span
                        )
                continue
            if access.kind == "write" and access.loss:
                if region.role != "output":
                    yield messages.loss_on_state(stage.name, access.region, access.span)
                elif access.advance is not None and access.loss + access.latency > access.advance:
                    yield messages.loss_over_advance(
                        stage.name, access.region, access.loss, access.latency, access.advance, access.span
                    )
            if access.kind == "write" and access.latency:
                if access.advance is None:
                    yield messages.bad_latency(
                        stage.name, access.region, "but no advance: write `+N latency L`", access.span
                    )
                elif access.latency > access.advance:
                    yield messages.bad_latency(
                        stage.name,
                        access.region,
                        f"of {messages.units(access.latency)}, longer than its advance of {access.advance}",
                        access.span,
                    )
            if access.region in written:
                yield messages.written_twice(stage.name, access.region, access.span, written[access.region].span)
                continue
            written[access.region] = access
            if region.fixed:
                continue
            if program.on_bounded_clock(access.region):
                writer_of.setdefault(access.region, (stage.name, access))
                continue  # the stages of a unit share a region on a bounded clock: check_run_time_lengths
            if access.region in writer_of and writer_of[access.region][0] != stage.name:
                other, first = writer_of[access.region]
                yield messages.several_writers(access.region, stage.name, other, access.span, first.span)
            else:
                writer_of.setdefault(access.region, (stage.name, access))
    for stage in program.stages.values():
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind != "read" or region.retention.kind != "scratch" or access.region not in writer_of:
                continue
            writer, _ = writer_of[access.region]
            if access.prev:
                yield messages.dead_scratch(
                    stage.name, access.region, "with `prev`: before this instant's writes it holds nothing", access.span
                )
                continue
            writer_rate = program.clocks[program.stages[writer].clock].rate
            reader_rate = program.clocks[stage.clock].rate
            if (writer_rate / reader_rate).denominator != 1:
                yield messages.dead_scratch(
                    stage.name,
                    access.region,
                    f"on clock '{stage.clock}' ({_fmt(reader_rate)} Hz), which ticks at instants where its writer "
                    f"'{writer}' on clock '{program.stages[writer].clock}' ({_fmt(writer_rate)} Hz) does not fire",
                    access.span,
                )


def check_retention(program: Program) -> Iterator[Diagnostic]:
    sized_by_module = {a.region for s in program.stages.values() for a in s.writes() if a.advance is None}
    try:
        order: list[str] | None = depgraph.stage_order(program)
    except nx.NetworkXUnfeasible:  # stages that feed each other within an instant: `check_cycles` says so
        order = None
    for stage in program.stages.values():
        for access in stage.accesses:
            if access.kind != "read" or program.regions[access.region].fixed or program.run_time_length(access.region):
                continue
            region = program.regions[access.region]
            found = read_need(program, stage, access)
            if found is None:
                continue
            if region.role == "output" or access.region in sized_by_module:
                continue
            if order is None and region.role != "input" and not access.prev:
                continue  # no order within the instant to count earlier writes by
            available = available_to_read(program, stage, access, order)
            if access.window == "new":  # the new units always arrive; the context must be history
                found = (access.context, "context before the new ones")
                available = region.retention.keeps
            if available is not None and found[0] > available:  # (a lookahead longer than the read: bad-access)
                keeps = region.retention.keeps or 0
                yield messages.retention_too_short(
                    stage.name,
                    access.region,
                    found[0],
                    found[1],
                    keeps,
                    access.span,
                    region.retention.span,
                    arriving=available - keeps,
                )


def check_roles(program: Program) -> Iterator[Diagnostic]:
    written = {a.region for s in program.stages.values() for a in s.writes()}
    for stage in program.stages.values():
        for access in stage.writes():
            region = program.regions[access.region]
            if region.role == "input":
                yield messages.write_to_input(stage.name, access.region, access.span, region.span)
            elif access.kind == "write" and region.retention.kind == "ring":
                yield messages.ring_written(stage.name, access.region, access.span, region.retention.span)
    first_reader: dict[str, tuple[str, Span | None]] = {}
    for stage in program.stages.values():
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind != "read" or region.role != "input":
                continue
            if access.region not in first_reader:
                first_reader[access.region] = (stage.name, access.span)
            elif first_reader[access.region][0] != stage.name:  # a stage may read its input in several windows
                first_stage, first_span = first_reader[access.region]
                yield messages.input_read_twice(access.region, stage.name, first_stage, access.span, first_span)
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if region.role == "output" and name not in written and key not in reported:
            reported.add(key)
            yield messages.output_never_written(key, region.span)
        elif (
            region.role == "output" and region.retention.kind not in ("io", "scratch") and key not in reported
        ):  # the runtime clones an output's units after the trim would move them
            reported.add(key)
            yield messages.output_retained(key, region.retention.describe(), region.retention.span or region.span)


def check_cycles(program: Program) -> Iterator[Diagnostic]:
    """One cycle within an instant: the shortest through the first stage (by name) that is on one.
    Found in time linear in the graph (components, then one breadth-first search), never by listing
    every cycle, which grows exponentially with the stages."""
    graph = depgraph.instant_graph(program)
    on_cycles = [component for component in nx.strongly_connected_components(graph) if len(component) > 1]
    if not on_cycles:
        return
    start = min(min(component) for component in on_cycles)
    component = next(c for c in on_cycles if start in c)
    cycle = _shortest_cycle(graph.subgraph(component), start)
    path = cycle + [cycle[0]]
    notes = []
    for a, b in itertools.pairwise(path):
        edge = graph.edges[a, b]
        notes.append(Note(f"'{b}' reads '{edge['region']}', written by '{a}'", edge["span"]))
    yield messages.instant_cycle(path, program.stages[start].span, notes)


def _shortest_cycle(graph: nx.DiGraph, start: str) -> list[str]:
    """The shortest cycle through `start` (which lies on one), from `start`; ties go to the names
    first in order (successors are visited sorted)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph.successors(node)):
                if successor == start:
                    cycle = [node]
                    while cycle[-1] != start:
                        cycle.append(parent[cycle[-1]])
                    return cycle[::-1]
                if successor not in parent:
                    parent[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError("the start of a strongly connected component of several stages lies on a cycle")


def check_unused(program: Program) -> Iterator[Diagnostic]:
    """Regions no stage uses (outputs are left to `check_roles`, which makes that an error)."""
    used = {a.region for s in program.stages.values() for a in s.accesses}
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if region.role in ("output", "counter"):  # a counter may reach only hooks (`firing.counters`)
            continue
        if name not in used and key not in reported and not any(m in used for m in program.families.get(key, ())):
            reported.add(key)
            yield messages.unused_region(key, region.span)


def check_bounds(program: Program) -> Iterator[Diagnostic]:
    """The plan's limits (dsl/bounds.py): hyperperiod, warm-up, firings, views, bytes."""
    yield from bounds.check(program)


def check_hyperperiod(program: Program) -> Iterator[Diagnostic]:
    """A warning for clocks that line up only after an hour (within the hyperperiod limit)."""
    if not program.stages:
        return
    span, problem = bounds.clock_span(program)
    if span is None or problem is not None or bounds.period_firings_problem(program, span) is not None:
        return  # over a limit: check_bounds says so
    stage_periods = [program.clocks[s.clock].period for s in program.stages.values()]
    hyper = lcm_fractions([program.cadence] + stage_periods)
    if hyper > 3600:
        firings = sum(hyper / period for period in stage_periods)
        yield messages.long_hyperperiod(_fmt(hyper), int(firings), program.cadence_span)


def check_boundary_loss(program: Program) -> Iterator[Diagnostic]:
    """An output whose every firing is short (`loses L`) loses L units at each boundary between two
    firings; a warning, unless the loss is marked `intended`."""
    horizon = session_seconds(program.cadence)
    for stage in program.stages.values():
        rate = program.clocks[stage.clock].rate
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind != "write" or not access.loss or access.loss_intended or region.role != "output":
                continue
            if access.advance is not None and access.loss + access.latency > access.advance:
                continue  # bad-access says so
            assert region.clock is not None, "an output has a time axis"
            # a session's firings in the horizon, and the end of the stream's where something is held back
            boundaries = max(firings_within(rate, horizon) - 1 + program.holds_back(), 0)
            yield messages.boundary_loss(
                access.region,
                region.clock,
                program.clocks[region.clock].rate,
                access.loss,
                boundaries,
                horizon,
                access.span,
            )


def _kind(region: RegionInfo) -> str:
    """What a region of the program is to its user: a counter's device scalar is the counter."""
    return "counter" if region.role == "counter" else "region"


def check_bindings(program: Program) -> Iterator[Diagnostic]:
    """Two regions bound to one attribute would alias one tensor."""
    bound: dict[tuple[str | None, str], str] = {}
    for name, region in program.regions.items():
        if region.bind is None:
            continue
        key = (region.bind_object, region.bind)
        if key in bound:
            first = program.regions[bound[key]]
            yield messages.shared_binding(
                name, region.bind, bound[key], region.bind_span, first.bind_span, _kind(region), _kind(first)
            )
        else:
            bound[key] = name


# --- data-dependent starts, counters and caller-owned objects -------------------------------------


def check_data_starts(program: Program) -> Iterator[Diagnostic]:
    """`start first` needs units that arrive (an input, or a `write`); `start first-firing` a stage that
    updates the region (its first firing makes the start)."""
    written = {a.region for s in program.stages.values() for a in s.accesses if a.kind == "write"}
    updater = {a.region: s.name for s in program.stages.values() for a in s.accesses if a.kind == "update"}
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if key in reported:
            continue
        span = region.start_span or region.span
        if region.start == "first" and region.role != "input" and name not in written:
            reported.add(key)
            yield messages.start_first_unfed(key, updater.get(name), span)
        elif region.start == "first-firing" and name not in updater:
            reported.add(key)
            yield messages.start_first_firing_unused(key, span)


def check_counters(program: Program) -> Iterator[Diagnostic]:
    """A counter advances with the ticks of its clock, which a stage on that clock marks."""
    clocks = {stage.clock for stage in program.stages.values()}
    for counter in program.counters.values():
        if program.stages and counter.clock not in clocks:
            yield messages.counter_without_stage(counter.name, counter.clock, counter.span)


def check_objects(program: Program) -> Iterator[Diagnostic]:
    """A region bound into an object reaches a stage only through a stage that passes the object."""
    passed = {p.object for s in program.stages.values() for p in s.passes}
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if region.bind_object is None or region.bind_object in passed or key in reported:
            continue
        reported.add(key)
        declared = program.objects[region.bind_object].span if region.bind_object in program.objects else None
        yield messages.object_unpassed(key, region.bind_object, region.bind_span, declared, _kind(region))


# --- the duplex unit: bounded clocks, sliding windows, rows ------------------------------------------


def _run_time_count(program: Program, stage: StageInfo, region: RegionInfo) -> bool:
    """Whether the stage's units of the region are counted at run time: the stage is on a bounded clock
    (and the region is not fixed), or the region is."""
    return not region.fixed and (program.burst(stage.name) is not None or program.on_bounded_clock(region.name))


def check_run_time_lengths(program: Program) -> Iterator[Diagnostic]:
    """Bounded clocks (`up to N per CLOCK`) and `slide` windows: lengths decided at run time. A region on a
    bounded clock is no input, keeps a slide, `all` or scratch, and its writers, on the clock it counts per
    or on clocks bounded per it, add up to its bound; a stage on a bounded clock advances only such regions
    and reads no `new` units; a region with a run-time length is read whole; a slide is updated, not
    appended to; a stage with `rows` has fixed shapes."""
    for name, region in program.regions.items():
        if region.clock is None:
            continue
        clock = program.clocks[region.clock]
        if region.retention.kind == "slide" and region.role in ("input", "output"):
            yield messages.slide_role(name, region.role, region.retention.span or region.span)
        if clock.bound is None:
            continue
        if region.role == "input":
            yield messages.bounded_input(name, clock.name, region.span)
            continue
        if region.retention.kind not in ("slide", "all", "scratch", "io"):
            yield messages.bounded_retention(name, clock.name, region.retention.describe(), region.retention.span)
        yield from _bounded_writers(program, name, region, clock)
    for stage in program.stages.values():
        burst = program.burst(stage.name)
        for access in stage.accesses:
            region = program.regions[access.region]
            if region.fixed:
                continue
            bounded = program.on_bounded_clock(access.region)
            slide = region.retention.kind == "slide" and not bounded
            if access.kind == "read":
                if program.run_time_length(access.region) and access.window != "all":
                    window = f"the last {access.count}" if access.window == "last" else "the new units"
                    why = "keeps a slide" if slide else f"is on bounded clock '{region.clock}'"
                    yield messages.run_time_window(stage.name, access.region, why, window, slide, access.span)
                elif burst is not None and access.window == "new":
                    yield messages.burst_reads_new(stage.name, stage.clock, access.region, access.span)
                continue
            if burst is not None and not bounded:
                yield messages.burst_advances_exact(stage.name, stage.clock, access.region, access.span)
                continue
            if access.up_to and not bounded:
                yield messages.up_to_on_exact(stage.name, access.region, region.clock or "", access.span)
                continue
            if slide and access.kind == "write":
                yield messages.slide_appended(stage.name, access.region, access.span, region.retention.span)
            if stage.rows is not None and access.up_to:
                yield messages.rows_with_run_time_shape(stage.name, access.region, stage.rows_span, access.span)


def _bounded_writers(program: Program, name: str, region: RegionInfo, clock) -> Iterator[Diagnostic]:
    """A region on a bounded clock: its writers count per its clock's `per`, and add up to its bound."""
    total, parts, notes, complete = 0, [], [], True
    for stage in program.stages.values():
        for access in stage.writes():
            if access.region != name:
                continue
            stage_clock = program.clocks[stage.clock]
            if clock.per not in (stage.clock, stage_clock.per):
                complete = False
                yield messages.bounded_writer(
                    stage.name, stage.clock, name, clock.name, clock.per, access.span, clock.span
                )
                continue
            if access.advance is None:
                complete = False
                yield messages.bounded_advance_missing(stage.name, name, access.span)
                continue
            times = stage_clock.bound or 1
            total += times * access.advance
            advance = f"up to {access.advance}" if access.up_to else f"+{access.advance}"
            parts.append(f"'{stage.name}' {advance}" + (f" x up to {times} firings" if stage_clock.bound else ""))
            notes.append(Note(f"'{stage.name}' advances it here", access.span))
    if complete and parts and total != clock.bound and not program.stages_left_out:  # a writer may have failed
        yield messages.bounded_total(name, clock.name, clock.bound, clock.per, total, parts, region.span, notes)


def check_returns(program: Program) -> Iterator[Diagnostic]:
    """A call that returns a record gives every return from a field of its own (`from FIELD`); a bound region's
    new version stays at its attribute, so it has no field; an object made by a stage is updated by it."""
    for stage in program.stages.values():
        if not stage.returns_record():
            continue
        returned: list[tuple[str, str | None, Any]] = []
        for used in stage.in_declared_order():
            if isinstance(used, ObjectPass):
                if used.kind == "update":
                    returned.append((f"update {used.object}", used.field, used.span))
                continue
            bound = program.regions[used.region].bind is not None
            if used.kind == "read" or (bound and used.kind == "update"):
                if used.field is not None:
                    yield messages.field_on_bound(stage.name, used.region, used.field, used.span)
                continue
            returned.append((f"{used.kind} {used.region}", used.field, used.span))
        fields = [field for _, field, _ in returned if field]
        first: dict[str, Any] = {}
        for item, field, span in returned:
            if field is None:
                yield messages.return_without_field(stage.name, item, fields, span)
            elif field in first:
                yield messages.duplicate_field(stage.name, field, span, first[field])
            else:
                first[field] = span
    for obj in program.objects.values():
        if obj.stage is None or obj.stage not in program.stages:
            continue
        stage = program.stages[obj.stage]
        if not any(p.object == obj.name and p.kind == "update" for p in stage.passes):
            yield messages.object_stage_not_passing(obj.name, stage.name, obj.span, stage.span)


RULES = (
    check_bounds,
    check_rates,
    check_accesses,
    check_retention,
    check_roles,
    check_cycles,
    check_bindings,
    check_data_starts,
    check_counters,
    check_objects,
    check_returns,
    check_unused,
    check_hyperperiod,
    check_boundary_loss,
    check_run_time_lengths,
)
# rules about what is missing would only echo an earlier error when a declaration failed to resolve
WHOLE_PROGRAM_RULES = (check_roles, check_unused, check_data_starts, check_counters, check_objects)

# a member's name, quoted ('kv[3]') or inside a quoted snippet (`update kv[3] +1`)
_MEMBER = re.compile(r"(?<=['`\s])([A-Za-z_][\w.]*)\[\d+\](?=['`\s])")


def collapse_family_members(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per family instead of one per member, when every member's says the same.

    `update kv +3` on a family of 8 gives 8 diagnostics at one span that differ only in `kv[i]`;
    they become one about `kv`. A diagnostic about a single member (`read kv[3] ...`) is kept as is.
    """
    groups: dict[tuple, list[Diagnostic]] = {}
    order: list[tuple] = []
    for diagnostic in diagnostics:
        key = (
            diagnostic.code,
            diagnostic.span,
            _MEMBER.sub(r"\1", diagnostic.message),
            tuple(_MEMBER.sub(r"\1", h) for h in diagnostic.helps),
        )
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(diagnostic)
    result = []
    for key in order:
        members = groups[key]
        if len(members) == 1:
            result.append(members[0])
            continue
        first = members[0]
        result.append(
            attrs.evolve(
                first,
                message=key[2],
                helps=key[3],
                notes=tuple(attrs.evolve(n, message=_MEMBER.sub(r"\1", n.message)) for n in first.notes),
            )
        )
    return result


def run(program: Program) -> tuple[Program, list[Diagnostic]]:
    """Complete the program (`complete.run`), then apply every rule in order."""
    program, diagnostics = complete.run(program)
    for rule in RULES:
        if program.incomplete and rule in WHOLE_PROGRAM_RULES:
            continue
        diagnostics.extend(rule(program))
    return program, diagnostics
