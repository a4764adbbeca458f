"""Completion: what a resolved program leaves implicit, filled in before the checks run.

`size_io_regions` gives inputs and outputs without a `retain` clause the window their stages need;
`derive_advances` gives a `write` without an advance the clocks' whole-number advance.
"""

from __future__ import annotations

import math
from fractions import Fraction

import attrs

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import Diagnostic
from duplexcadence.dsl.program import Access, Program, Retention, StageInfo


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
        need, what = (
            new + access.context,
            f"up to {new} new" + (f" + {access.context} context" if access.context else ""),
        )
    else:
        return None
    if access.lookahead:
        what += f", of which {access.lookahead} lookahead"
    return need, what


def size_io_regions(program: Program) -> tuple[Program, list[Diagnostic]]:
    """Inputs and outputs without `retain`: an output keeps nothing between instants (scratch); an
    input keeps the history its readers need beyond the units that arrive for their firing.

    `start zeros` then fills that history with zeros; `start given N` must fit in it.
    """
    regions = dict(program.regions)
    problems: list[Diagnostic] = []
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
                        if access.window == "new":  # the new units always arrive: only the context is history
                            history = max(history, access.context)
                        elif found is not None:
                            history = max(history, found[0] - arriving)
        retention = (
            Retention("last", last=history, span=region.retention.span)
            if history > 0
            else Retention("scratch", span=region.retention.span)
        )
        start_length = region.start_length
        if region.start in ("zeros", "first"):
            start_length = retention.keeps or 0
        elif region.start == "given" and start_length > (retention.keeps or 0):
            keeps = retention.keeps or 0
            problems.append(
                messages.bad_count(
                    "the start length",
                    name,
                    str(start_length),
                    region.span,
                    f"without `retain`, the region keeps the history its readers need, {keeps} units; "
                    f"declare `retain last {start_length}` or start with at most {keeps}",
                )
            )
        regions[name] = attrs.evolve(region, retention=retention, start_length=start_length)
    return attrs.evolve(program, regions=regions), problems


def derive_advances(program: Program) -> Program:
    """`write R` without an advance gets the clocks' advance when it is a whole number per firing; so does
    `update R` of a family whose members advance on several clocks (one `+N` cannot say each one's)."""
    several = {
        family
        for family, members in program.families.items()
        if len({program.regions[m].clock for m in members if m in program.regions}) > 1
    }
    stages = {}
    for name, stage in program.stages.items():
        accesses = []
        for access in stage.accesses:
            region = program.regions[access.region]
            counted_at_run_time = program.burst(name) is not None or program.run_time_length(access.region)
            derived = (access.kind == "write" and region.role != "output") or (
                access.kind == "update" and region.family in several
            )
            if derived and access.advance is None and not region.fixed and not counted_at_run_time:
                per_firing = units_per_firing(program, stage, access.region)
                if per_firing.denominator == 1:
                    access = attrs.evolve(access, advance=per_firing.numerator)
            accesses.append(access)
        stages[name] = attrs.evolve(stage, accesses=tuple(accesses))
    return attrs.evolve(program, stages=stages)


def run(program: Program) -> tuple[Program, list[Diagnostic]]:
    """The completed program (io windows, then derived advances) and the problems found on the way."""
    program, problems = size_io_regions(program)
    return derive_advances(program), problems
