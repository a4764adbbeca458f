"""Rules over a resolved program: rates, clocks, retention, roles and cycles.

Each rule is a function `(program) -> diagnostics`; `run` applies them in order. Before the rules,
`size_io_regions` gives inputs and outputs without a `retain` clause the window their stages need.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import attrs
import networkx as nx

from . import depgraph, messages
from .diagnostics import Diagnostic, Note
from .printer import number_text
from .program import Access, Program, Retention, StageInfo, lcm_fractions


def _fmt(value: Fraction) -> str:
    return number_text(value)


def units_per_firing(program: Program, stage: StageInfo, region: str) -> Fraction:
    return program.rate_of_region(region) / program.clocks[stage.clock].rate


def max_new_units(per_firing: Fraction) -> int:
    """The most units one firing sees when a region advances `per_firing` units per firing on average."""
    return math.ceil(per_firing)


def read_need(program: Program, stage: StageInfo, access: Access) -> tuple[int, str] | None:
    """How many units a read needs retained, and how to say so; None for a whole-region read."""
    if access.window == "last":
        need, what = access.count, f"last {access.count}"
    elif access.window == "new":
        new = max_new_units(units_per_firing(program, stage, access.region))
        need, what = new + access.context, f"up to {new} new" + (f" + {access.context} context" if access.context else "")
    else:
        return None
    if access.lookahead:
        what += f", of which {access.lookahead} lookahead"
    return need, what


def size_io_regions(program: Program) -> Program:
    """Inputs and outputs without `retain`: an output keeps nothing between instants (scratch); an
    input keeps the history its readers need beyond the units that arrive for their firing."""
    regions = dict(program.regions)
    for name, region in program.regions.items():
        if region.retention.kind != "io" or region.fixed:
            continue
        history = 0
        if region.role == "input":
            for stage in program.stages.values():
                for access in stage.accesses:
                    if access.region == name and access.kind == "read":
                        found = read_need(program, stage, access)
                        arriving = math.floor(units_per_firing(program, stage, name))
                        if found is not None:
                            history = max(history, found[0] - arriving)
        retention = (Retention("last", last=history, span=region.span) if history > 0
                     else Retention("scratch", span=region.span))
        regions[name] = attrs.evolve(region, retention=retention)
    return attrs.evolve(program, regions=regions)


def derive_advances(program: Program) -> Program:
    """`write R` without an advance gets the clocks' advance when it is a whole number per firing."""
    stages = {}
    for name, stage in program.stages.items():
        accesses = []
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind == "write" and access.advance is None and region.role != "output":
                per_firing = units_per_firing(program, stage, access.region)
                if per_firing.denominator == 1:
                    access = attrs.evolve(access, advance=per_firing.numerator)
            accesses.append(access)
        stages[name] = attrs.evolve(stage, accesses=tuple(accesses))
    return attrs.evolve(program, stages=stages)


def check_rates(program: Program) -> Iterator[Diagnostic]:
    for stage in program.stages.values():
        stage_clock = program.clocks[stage.clock]
        for access in stage.accesses:
            region = program.regions[access.region]
            if region.fixed:
                if access.advance is not None or access.window != "all":
                    yield messages.fixed_advance(stage.name, access.region, access.span)
                continue
            region_clock = program.clocks[region.clock]
            per_firing = units_per_firing(program, stage, access.region)
            if access.kind == "update" and access.advance is None:
                yield messages.missing_advance(stage.name, access.region, _fmt(per_firing), access.span)
                continue
            verb = {"read": "reads new units of", "update": "updates", "write": "writes"}[access.kind]
            if (access.kind != "read" or access.window == "new") and per_firing < 1:
                yield messages.slower_region(stage.name, stage.clock, _fmt(stage_clock.rate), verb, access.region,
                                             region.clock, _fmt(region_clock.rate), access.span)
                continue
            if access.kind == "read" or region.retention.kind == "scratch":
                continue
            if access.advance is None:
                if region.role != "output":
                    yield messages.advance_mismatch(stage.name, stage.clock, _fmt(stage_clock.rate), "writes",
                                                    f"{_fmt(per_firing)} (not a whole number of)", access.region,
                                                    region.clock, _fmt(region_clock.rate), _fmt(per_firing),
                                                    access.span)
                continue
            if Fraction(access.advance) != per_firing:
                verb = "updates" if access.kind == "update" else "writes"
                yield messages.advance_mismatch(stage.name, stage.clock, _fmt(stage_clock.rate), verb,
                                                str(access.advance), access.region, region.clock,
                                                _fmt(region_clock.rate), _fmt(per_firing), access.span)


def available_to_read(program: Program, stage: StageInfo, access: Access) -> int | None:
    """The most units a read can rely on: the history kept plus the units surely appended earlier in
    the same instant (fed by `step()`, or written by a stage that fires with it and runs before it)."""
    region = program.regions[access.region]
    keeps = region.retention.keeps
    if keeps is None and region.retention.kind != "scratch":
        return None
    available = keeps or 0
    if region.role == "input":
        return available + math.floor(units_per_firing(program, stage, access.region))
    if access.prev:
        return available
    order = depgraph.stage_order(program)
    for other in program.stages.values():
        if other.name == stage.name or other.clock != stage.clock or order.index(other.name) > order.index(stage.name):
            continue
        available += sum(a.advance or 0 for a in other.writes() if a.region == access.region)
    return available


def check_retention(program: Program) -> Iterator[Diagnostic]:
    for stage in program.stages.values():
        for access in stage.accesses:
            if access.kind != "read" or program.regions[access.region].fixed:
                continue
            region = program.regions[access.region]
            found = read_need(program, stage, access)
            if found is None:
                continue
            if region.role == "output" or any(a.advance is None for s in program.stages.values()
                                                for a in s.writes() if a.region == access.region):
                continue
            available = available_to_read(program, stage, access)
            if access.window == "new":  # the new units always arrive; the context must be history
                found = (access.context, f"{access.context} units of context before the new ones")
                available = region.retention.keeps
            if available is not None and found[0] > available:
                yield messages.retention_too_short(stage.name, access.region, found[0], found[1], available,
                                                   access.span, region.retention.span)
            elif access.lookahead > found[0]:
                yield messages.retention_too_short(stage.name, access.region, access.lookahead, "its lookahead",
                                                   found[0], access.span, region.retention.span)


def check_roles(program: Program) -> Iterator[Diagnostic]:
    written = {a.region for s in program.stages.values() for a in s.writes()}
    for stage in program.stages.values():
        for access in stage.writes():
            region = program.regions[access.region]
            if region.role == "input":
                yield messages.write_to_input(stage.name, access.region, access.span, region.span)
            elif access.kind == "write" and region.retention.kind == "ring":
                yield messages.ring_written(stage.name, access.region, access.span, region.retention.span)
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if region.role == "output" and name not in written and key not in reported:
            reported.add(key)
            yield messages.output_never_written(key, region.span)


def check_cycles(program: Program) -> Iterator[Diagnostic]:
    graph = depgraph.instant_graph(program)
    for cycle in sorted(nx.simple_cycles(graph), key=lambda c: (len(c), sorted(c)))[:1]:
        start = min(cycle)
        while cycle[0] != start:
            cycle = cycle[1:] + cycle[:1]
        path = cycle + [cycle[0]]
        notes = []
        for a, b in zip(path, path[1:]):
            edge = graph.edges[a, b]
            notes.append(Note(f"'{b}' reads '{edge['region']}', written by '{a}'", edge["span"]))
        yield messages.instant_cycle(path, program.stages[start].span, notes)


def check_unused(program: Program) -> Iterator[Diagnostic]:
    used = {a.region for s in program.stages.values() for a in s.accesses}
    reported: set[str] = set()
    for name, region in program.regions.items():
        key = region.family or name
        if name not in used and key not in reported and not any(m in used for m in program.families.get(key, ())):
            reported.add(key)
            yield messages.unused_region(key, region.span)


def check_hyperperiod(program: Program) -> Iterator[Diagnostic]:
    stage_periods = [program.clocks[s.clock].period for s in program.stages.values()]
    hyper = lcm_fractions([program.cadence] + stage_periods)
    firings = sum(hyper / period for period in stage_periods)
    if hyper > 3600 or firings > 100_000:
        yield messages.long_hyperperiod(_fmt(hyper), int(firings), program.cadence_span)


RULES = (check_rates, check_retention, check_roles, check_cycles, check_unused, check_hyperperiod)
# rules about what is missing would only echo an earlier error when a declaration failed to resolve
WHOLE_PROGRAM_RULES = (check_roles, check_unused)


def run(program: Program) -> tuple[Program, list[Diagnostic]]:
    """Complete the program (io windows, derived advances), then apply every rule in order."""
    program = derive_advances(size_io_regions(program))
    diagnostics: list[Diagnostic] = []
    for rule in RULES:
        if program.incomplete and rule in WHOLE_PROGRAM_RULES:
            continue
        diagnostics.extend(rule(program))
    return program, diagnostics
