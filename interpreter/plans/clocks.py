"""Pass 1, clock algebra: exact rates, base tick, hyperperiod, firings and in-instant order.

All clocks start together at t = 0. A stage on a clock of period p fires at t = 0, p, 2p, ...;
an *instant* is a time at which at least one stage fires. A stage on a bounded clock (`up to N per unit`)
fires at the instants of the clock it counts per, up to N times at each (the count decided at run time). The hyperperiod is the least common
multiple of the cadence, the stage periods and the periods of fractional arrival patterns: the
firing pattern and the units each firing sees repeat after it.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from duplexcadence.dsl import bounds, depgraph, messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.program import Program


@attrs.frozen
class StageTiming:
    """When one stage fires: its period and how often per cadence and per hyperperiod."""

    stage: str
    clock: str
    rate: Fraction
    period: Fraction
    per_cadence: Fraction
    per_hyperperiod: int
    burst: int | None = None
    """On a bounded clock: up to this many firings at each of its instants, the count decided at run time
    (`per_cadence` and `per_hyperperiod` count its instants)."""


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
    """Raises ClockError before enumerating anything for a program without stages (`cannot-plan`),
    whose clocks repeat only after more base ticks than its `hyperperiod` limit, or whose two traced
    hyperperiods hold more firings than its `firings` limit."""
    if not program.stages:
        raise ClockError([messages.nothing_to_plan(str(program.path))])
    span, problem = bounds.clock_span(program)
    if problem is not None:
        raise ClockError([problem])
    assert span is not None
    problem = bounds.period_firings_problem(program, span)
    if problem is not None:
        raise ClockError([problem])
    rates = {name: clock.rate for name, clock in program.clocks.items()}
    base_tick, hyperperiod = span.base_tick, span.hyperperiod
    order = tuple(depgraph.stage_order(program))
    stages = {}
    for name in order:
        stage = program.stages[name]
        rate = rates[stage.clock]
        per_hyper = hyperperiod * rate
        assert per_hyper.denominator == 1, "the hyperperiod is a multiple of every stage period"
        stages[name] = StageTiming(
            name, stage.clock, rate, 1 / rate, program.cadence * rate, per_hyper.numerator, program.burst(name)
        )
    times: dict[Fraction, list[str]] = {}
    for name in order:
        timing = stages[name]
        for k in range(timing.per_hyperperiod):
            times.setdefault(k * timing.period, []).append(name)
    instants = tuple(Instant(t, tuple(times[t])) for t in sorted(times))
    return ClockPlan(program.cadence, rates, base_tick, hyperperiod, order, stages, instants)
