"""What a program's plan will cost, bounded before it is built: the clock algebra, the warm-up, the
trace and the arena, against the program's `Limits` (dsl/limits.py).

`dsl check` runs `check` as a rule; the planner runs it before its first pass and then holds the
exact counts to the same limits as it goes (plans/clocks.py, plans/trace.py, plans/plan.py). The
numbers here are cheap to compute and never larger than the plan's: the hyperperiod and the firings
of one are exact; the warm-up is the time the slowest window takes to fill at its clock's rate (the
state cannot repeat before), so the warm-up, firings and views estimated from it are lower bounds;
the bytes count each region at its retention at least.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from fractions import Fraction

import attrs

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import Diagnostic
from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import Program, RegionInfo
from duplexcadence.dsl.source import Span


@attrs.frozen
class ClockSpan:
    """The base tick and the hyperperiod of a program's clocks (both exact)."""

    base_tick: Fraction
    hyperperiod: Fraction

    @property
    def ticks(self) -> int:
        return int(self.hyperperiod / self.base_tick)


def _lcm(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(math.lcm(a.numerator, b.numerator), math.gcd(a.denominator, b.denominator))


def _gcd(a: Fraction, b: Fraction) -> Fraction:
    return Fraction(math.gcd(a.numerator, b.numerator), math.lcm(a.denominator, b.denominator))


def arrival_periods(program: Program) -> Iterator[tuple[Fraction, Span | None]]:
    """Periods that stretch the hyperperiod beyond the stages' own: a region advancing a fractional
    number of units per firing (12.5 codes a second) repeats its arrivals only every denominator
    firings. With the access each comes from."""
    for stage in program.stages.values():
        rate = program.clocks[stage.clock].rate
        for access in stage.accesses:
            if not program.regions[access.region].fixed:
                per_firing = program.rate_of_region(access.region) / rate
                yield (1 / rate) * per_firing.denominator, access.span


def clock_span(program: Program) -> tuple[ClockSpan | None, Diagnostic | None]:
    """The base tick and hyperperiod, or the `hyperperiod-too-long` diagnostic: both are built one
    period at a time and given up as soon as the count of base ticks passes the limit, so a program
    of thousands of clocks with coprime rates never makes a number of thousands of digits. The
    diagnostic points at the clock whose period passed it (at the access, for a fractional advance)."""
    limit = program.limits.hyperperiod
    base = program.cadence
    for name, clock in program.clocks.items():
        base = _gcd(base, 1 / clock.rate)
        if program.cadence / base > limit:
            return None, messages.hyperperiod_too_long(
                messages.base_tick_cause(name, number_text(clock.rate)),
                math.ceil(program.cadence / base),
                number_text(base),
                limit,
                clock.span,
            )
    periods: list[tuple[Fraction, Span | None, str | None]] = []
    for stage in program.stages.values():
        clock = program.clocks[stage.clock]
        periods.append((clock.period, clock.span or stage.span, stage.name))
    periods += [(period, span, None) for period, span in arrival_periods(program)]
    hyper = program.cadence
    for period, span, stage_name in periods:
        hyper = _lcm(hyper, period)
        if hyper / base > limit:
            if stage_name is not None:
                stage = program.stages[stage_name]
                cause = messages.stage_clock_cause(
                    stage.clock, number_text(program.clocks[stage.clock].rate), stage_name, number_text(hyper)
                )
            else:
                cause = messages.arrivals_cause(number_text(hyper))
            return None, messages.hyperperiod_too_long(cause, math.ceil(hyper / base), number_text(base), limit, span)
    return ClockSpan(base, hyper), None


def firings_per_hyperperiod(program: Program, hyperperiod: Fraction) -> dict[str, int]:
    return {name: int(hyperperiod * program.clocks[stage.clock].rate) for name, stage in program.stages.items()}


@attrs.frozen
class Fill:
    """The region whose history takes longest to fill (the warm-up cannot end before it is full)."""

    region: RegionInfo
    units: int  # units to fill from the start
    seconds: Fraction
    horizon: bool  # the region keeps everything: the session ends when it is full


def slowest_fill(program: Program) -> Fill | None:
    """The region whose filling decides how long the planner traces (every write and update advances
    a region at its clock's rate on average): the slowest window to fill, or, when a region keeps
    everything up to a horizon, the first such region to reach it (the state never repeats while it
    grows: the session ends there). None when no region has history to fill."""
    grown = {a.region for stage in program.stages.values() for a in stage.accesses if a.kind != "read"}
    grown |= {
        a.region
        for stage in program.stages.values()
        for a in stage.accesses
        if a.kind == "read" and program.regions[a.region].role == "input"
    }
    windows: list[Fill] = []
    horizons: list[Fill] = []
    for name in sorted(grown):
        region = program.regions[name]
        if region.clock is None or region.retention.keeps is None:  # fixed, or scratch
            continue
        if program.run_time_length(name):  # handed whole at its capacity: no length the planner traces
            continue
        start = 0 if region.retention.kind == "ring" else region.start_length  # a ring's fill starts at 0
        units = region.retention.keeps - start
        if units <= 0:
            continue
        seconds = Fraction(units) / program.clocks[region.clock].rate
        if region.retention.kind == "all":
            horizons.append(Fill(region, units, seconds, True))
        else:
            windows.append(Fill(region, units, seconds, False))
    if horizons:
        return min(horizons, key=lambda fill: fill.seconds)
    return max(windows, key=lambda fill: fill.seconds, default=None)


def _instant_times(program: Program, hyperperiod: Fraction) -> list[Fraction]:
    """The sorted instants of one hyperperiod (the planner's count: every stage's firing times)."""
    times: set[Fraction] = set()
    for rate in {program.clocks[stage.clock].rate for stage in program.stages.values()}:
        period = 1 / rate
        times.update(k * period for k in range(int(hyperperiod * rate)))
    return sorted(times)


def _firings_before(program: Program, seconds: Fraction) -> dict[str, int]:
    """Each stage's firings at times before `seconds` (a stage on rate r fires at k / r)."""
    return {name: math.ceil(seconds * program.clocks[stage.clock].rate) for name, stage in program.stages.items()}


def _views_per_firing(program: Program, stage_name: str) -> int:
    stage = program.stages[stage_name]
    feeds = {a.region for a in stage.accesses if a.kind == "read" and program.regions[a.region].role == "input"}
    return len(stage.accesses) + len(feeds)


def _releases(program: Program) -> bool:
    """Whether the planner also traces a last instant (`Session.finish`) at every instant."""
    return any(
        a.lookahead or (a.latency and not a.latency_dropped)
        for stage in program.stages.values()
        for a in stage.accesses
    )


PRODUCT_CAP = 2**256
"""Past this a product of dims stops growing (thousands of dims of 10^15 would be a number of
tens of thousands of digits); every byte limit is far below it."""


def _capped_product(values) -> int:
    """The product of positive `values`, or PRODUCT_CAP + 1 once it passes PRODUCT_CAP."""
    product = 1
    for value in values:
        product *= value
        if product > PRODUCT_CAP:
            return PRODUCT_CAP + 1
    return product


def units_per_firing_at_least(program: Program) -> dict[str, int]:
    """The most units any one firing writes into, or feeds to, each region (0 when none does)."""
    units: dict[str, int] = {}
    for stage in program.stages.values():
        for access in stage.accesses:
            region = program.regions[access.region]
            if access.kind != "read" and access.advance is not None:
                units[access.region] = max(units.get(access.region, 0), access.advance)
            elif access.kind == "read" and region.role == "input" and not region.fixed:
                arriving = math.ceil(program.units_per_firing(stage.name, access.region))
                units[access.region] = max(units.get(access.region, 0), arriving)
    return units


def region_bytes_at_least(region: RegionInfo, per_firing: int) -> int:
    """The fewest bytes `region` can take in the plan (capped, see PRODUCT_CAP): its whole shape, or
    the units it keeps, starts with, or takes in at one firing (`per_firing`), whichever is most."""
    if region.fixed:
        return _capped_product([*region.shape, region.itemsize])
    units = max(region.retention.keeps or 0, region.start_length, per_firing)
    elements = [dim for axis, dim in enumerate(region.shape) if axis != region.time_axis]
    return _capped_product([*elements, units, region.itemsize])


def period_firings_problem(program: Program, span: ClockSpan) -> Diagnostic | None:
    """`too-many-firings` when the two hyperperiods the planner traces alone are over the limit
    (before the planner enumerates one)."""
    firings = sum(firings_per_hyperperiod(program, span.hyperperiod).values())
    traced = 2 * firings * (2 if _releases(program) else 1)
    if traced <= program.limits.firings:
        return None
    return messages.too_many_firings(
        traced, 0, traced, number_text(span.hyperperiod), program.limits.firings, program.cadence_span
    )


def check(program: Program) -> list[Diagnostic]:
    """The limits of the plan (hyperperiod, warm-up, firings, views, states, bytes), in that order; the
    first one a program is over stops the rest (they would measure what that one already refused)."""
    if not program.stages:
        return []
    limits = program.limits
    span, problem = clock_span(program)
    if problem is not None:
        return [problem]
    assert span is not None
    problem = period_firings_problem(program, span)
    if problem is not None:
        return [problem]
    per_period = firings_per_hyperperiod(program, span.hyperperiod)
    period_firings = sum(per_period.values())
    doubled = 2 if _releases(program) else 1
    fill = slowest_fill(program)
    seconds = fill.seconds if fill is not None else Fraction(0)
    times = _instant_times(program, span.hyperperiod)
    whole, rest = divmod(seconds, span.hyperperiod)
    instants = int(whole) * len(times) + bisect.bisect_left(times, rest)
    if fill is not None and instants > limits.warmup:
        region = fill.region
        assert region.clock is not None, "a region that fills has a clock"
        return [
            messages.warmup_too_long(
                region.name,
                region.retention.keeps or 0,
                fill.horizon,
                number_text(program.clocks[region.clock].rate),
                number_text(seconds),
                instants,
                limits.warmup,
                region.retention.span or region.span,
            )
        ]
    before = _firings_before(program, seconds)
    periods = 0 if fill is not None and fill.horizon else 2  # a session that ends at a horizon never repeats
    firings = {name: (before[name] + periods * per_period[name]) * doubled for name in program.stages}
    total = sum(firings.values())
    if total > limits.firings:
        where = (
            fill.region.retention.span or fill.region.span
            if fill is not None and sum(before.values()) > periods * period_firings
            else program.cadence_span
        )
        return [
            messages.too_many_firings(
                total,
                sum(before.values()) * doubled,
                periods * period_firings * doubled,
                number_text(span.hyperperiod),
                limits.firings,
                where,
            )
        ]
    views = {name: firings[name] * _views_per_firing(program, name) for name in program.stages}
    if sum(views.values()) > limits.views:
        busiest = max(sorted(views), key=lambda name: views[name])
        return [
            messages.too_many_views(
                sum(views.values()),
                busiest,
                _views_per_firing(program, busiest),
                firings[busiest],
                limits.views,
                program.stages[busiest].span,
            )
        ]
    timed = sum(not region.fixed for region in program.regions.values())
    traced_instants = instants + periods * len(times)
    if traced_instants * timed * doubled > limits.states:
        return [
            messages.too_many_states(
                traced_instants * timed * doubled, traced_instants, timed, limits.states, program.cadence_span
            )
        ]
    return check_bytes(program)


def check_bytes(program: Program) -> list[Diagnostic]:
    """The arena of one session, at least: every pinned region at its fewest bytes, and the largest
    scratch region (scratch shares one block)."""
    limit = program.limits.bytes
    per_firing = units_per_firing_at_least(program)
    sizes = {name: region_bytes_at_least(region, per_firing.get(name, 0)) for name, region in program.regions.items()}
    pinned = sum(size for name, size in sizes.items() if program.regions[name].retention.kind != "scratch")
    scratch = max(
        (size for name, size in sizes.items() if program.regions[name].retention.kind == "scratch"), default=0
    )
    need = pinned + scratch
    if need <= limit:
        return []
    largest = max(sorted(sizes), key=lambda name: sizes[name])
    region = program.regions[largest]
    return [messages.arena_too_large(need, largest, sizes[largest], limit, True, region.span)]
