"""Pass 1, clock algebra: exact rates, base tick, hyperperiod, firings and in-instant order.

All clocks start together at t = 0. A stage on a clock of period p fires at t = 0, p, 2p, ...;
an *instant* is a time at which at least one stage fires. The hyperperiod is the least common
multiple of the cadence, the stage periods and the periods of fractional arrival patterns: the
firing pattern and the units each firing sees repeat after it.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from duplexcadence.dsl import depgraph, messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import Program, gcd_fractions, lcm_fractions

MAX_FIRINGS_PER_HYPERPERIOD = 100_000
"""The most firings one hyperperiod may hold: the planner enumerates them and traces two periods
(`dsl check` warns with `long-hyperperiod` at the same count)."""


@attrs.frozen
class StageTiming:
    """When one stage fires: its period and how often per cadence and per hyperperiod."""

    stage: str
    clock: str
    rate: Fraction
    period: Fraction
    per_cadence: Fraction
    per_hyperperiod: int


@attrs.frozen
class Instant:
    """One instant of the hyperperiod: its time from the hyperperiod's start and the stages firing,
    in dataflow order."""

    time: Fraction
    stages: tuple[str, ...]


@attrs.frozen
class ClockPlan:
    """The schedule skeleton shared by every later pass."""

    cadence: Fraction
    rates: dict[str, Fraction] = attrs.field(hash=False)
    base_tick: Fraction = Fraction(1)
    hyperperiod: Fraction = Fraction(1)
    stage_order: tuple[str, ...] = ()
    stages: dict[str, StageTiming] = attrs.field(factory=dict, hash=False)
    instants: tuple[Instant, ...] = ()

    @property
    def instants_per_hyperperiod(self) -> int:
        return len(self.instants)

    def instant_time(self, index: int) -> Fraction:
        """Absolute time of instant `index` counted from session start (across hyperperiods)."""
        period, phase = divmod(index, len(self.instants))
        return period * self.hyperperiod + self.instants[phase].time

    def instants_within(self, seconds: Fraction) -> int:
        """Instants in the first `seconds` of a session (those at times before it)."""
        periods, rest = divmod(Fraction(seconds), self.hyperperiod)
        return int(periods) * len(self.instants) + sum(1 for instant in self.instants if instant.time < rest)

    def firings_before(self, index: int) -> dict[str, int]:
        """How many times each stage has fired before instant `index` (from the clocks alone)."""
        periods, phase = divmod(index, len(self.instants))
        counts = {name: periods * timing.per_hyperperiod for name, timing in self.stages.items()}
        for instant in self.instants[:phase]:
            for name in instant.stages:
                counts[name] += 1
        return counts


def plan_clocks(program: Program) -> ClockPlan:
    """Raises ClockError (`cannot-plan`) for a program without stages or with a hyperperiod too long
    to enumerate, before enumerating anything."""
    if not program.stages:
        raise ClockError([messages.nothing_to_plan(str(program.path))])
    rates = {name: clock.rate for name, clock in program.clocks.items()}
    periods = [program.cadence] + [1 / rate for rate in rates.values()]
    base_tick = gcd_fractions(periods)
    stage_periods = [1 / rates[stage.clock] for stage in program.stages.values()]
    # a region advancing a fractional number of units per firing (12.5 codes a second) repeats its
    # arrival pattern only every denominator firings: that stretches the hyperperiod too
    arrival_periods = [
        (1 / rates[stage.clock]) * (program.rate_of_region(access.region) / rates[stage.clock]).denominator
        for stage in program.stages.values()
        for access in stage.accesses
        if not program.regions[access.region].fixed
    ]
    hyperperiod = lcm_fractions([program.cadence] + stage_periods + arrival_periods)
    firings = sum(hyperperiod * rates[stage.clock] for stage in program.stages.values())
    if firings > MAX_FIRINGS_PER_HYPERPERIOD:
        raise ClockError(
            [
                messages.too_many_firings(
                    number_text(hyperperiod), int(firings), MAX_FIRINGS_PER_HYPERPERIOD, program.cadence_span
                )
            ]
        )
    order = tuple(depgraph.stage_order(program))
    stages = {}
    for name in order:
        stage = program.stages[name]
        rate = rates[stage.clock]
        per_hyper = hyperperiod * rate
        assert per_hyper.denominator == 1, "the hyperperiod is a multiple of every stage period"
        stages[name] = StageTiming(name, stage.clock, rate, 1 / rate, program.cadence * rate, per_hyper.numerator)
    times: dict[Fraction, list[str]] = {}
    for name in order:
        timing = stages[name]
        for k in range(timing.per_hyperperiod):
            times.setdefault(k * timing.period, []).append(name)
    instants = tuple(Instant(t, tuple(times[t])) for t in sorted(times))
    return ClockPlan(program.cadence, rates, base_tick, hyperperiod, order, stages, instants)
