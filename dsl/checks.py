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
    """Inputs and outputs without `retain` keep what their stages need (a window of `last N`)."""
    regions = dict(program.regions)
    for name, region in program.regions.items():
        if region.retention.kind != "io" or region.fixed:
            continue
        need = 0
        module_defined = False
        for stage in program.stages.values():
            for access in stage.accesses:
                if access.region != name:
                    continue
                per_firing = max_new_units(units_per_firing(program, stage, name))
                if access.kind == "read":
                    found = read_need(program, stage, access)
                    need = max(need, found[0] if found else per_firing)
                elif access.advance is None and region.role == "output":
                    module_defined = True
                else:
                    need = max(need, access.advance if access.advance is not None else per_firing)
        retention = (Retention("scratch", span=region.span) if module_defined or need == 0
                     else Retention("last", last=need, span=region.span))
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


def check_retention(program: Program) -> Iterator[Diagnostic]:
    for stage in program.stages.values():
        for access in stage.accesses:
            if access.kind != "read":
                continue
            region = program.regions[access.region]
            found = read_need(program, stage, access)
            keeps = region.retention.keeps
            if region.retention.kind == "scratch":
                keeps = max((a.advance or 0 for s in program.stages.values() for a in s.writes()
                             if a.region == access.region), default=0)
                if all(a.advance is None for s in program.stages.values() for a in s.writes()
                       if a.region == access.region):
                    continue
            if found is not None and keeps is not None and found[0] > keeps:
                yield messages.retention_too_short(stage.name, access.region, found[0], found[1], keeps, access.span,
                                                   region.retention.span)
            elif access.lookahead and keeps is not None and access.lookahead > keeps:
                yield messages.retention_too_short(stage.name, access.region, access.lookahead, "its lookahead",
                                                   keeps, access.span, region.retention.span)


def check_roles(program: Program) -> Iterator[Diagnostic]:
    written = {a.region for s in program.stages.values() for a in s.writes()}
    for stage in program.stages.values():
        for access in stage.writes():
            region = program.regions[access.region]
            if region.role == "input":
                yield messages.write_to_input(stage.name, access.region, access.span, region.span)
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


def run(program: Program) -> tuple[Program, list[Diagnostic]]:
    """Complete the program (io windows, derived advances), then apply every rule in order."""
    program = derive_advances(size_io_regions(program))
    diagnostics: list[Diagnostic] = []
    for rule in RULES:
        diagnostics.extend(rule(program))
    return program, diagnostics
