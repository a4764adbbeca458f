"""The checked program: every name resolved, every value evaluated, families expanded.

This is what the interpreter's passes consume. All numbers are exact (`int` or `Fraction`);
all records are frozen; positions are kept for diagnostics but out of equality.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import attrs
import networkx as nx

from duplexcadence.dsl.limits import DEFAULT_LIMITS, Limits
from duplexcadence.dsl.source import Span


def _span_field():
    return attrs.field(default=None, eq=False, repr=False, kw_only=True)


@attrs.frozen
class ClockInfo:
    """A clock with its exact rate in Hz."""

    name: str
    rate: Fraction
    uses: tuple[str, ...] = ()
    span: Span | None = _span_field()
    bound: int | None = attrs.field(default=None, kw_only=True)
    """A bounded clock (`clock text = up to 21 per unit`) ticks up to `bound` times at each tick of the clock
    `per`, the count decided at run time; its `rate` is then the rate of `per` (the instants it ticks at)."""
    per: str | None = attrs.field(default=None, kw_only=True)

    @property
    def period(self) -> Fraction:
        return 1 / self.rate

    @property
    def unit_rate(self) -> Fraction:
        """The most units a second of a region on this clock: its rate, times its bound when it has one
        (durations in counts are converted with it)."""
        return self.rate * (self.bound or 1)


@attrs.frozen
class Retention:
    """How much of a region is kept, in units of the region's clock.

    kind is one of: `fixed` (a region without a time axis: the whole tensor, always), `last` (window of `last` newest units, oldest first), `ring` (a ring of `last`
    slots, always handed whole to the module), `first_last` (a pinned head of `first` units plus the
    `last` newest), `all` (everything up to `horizon` units), `scratch` (dead after the instant),
    `slide` (at the end of a cadence that leaves more than `last` units, whole cadences dropped from the front
    until at most `low` remain; the units the session starts with and a pinned head of `first` stay; handed
    whole).
    """

    kind: str
    first: int = 0
    last: int = 0
    horizon: int | None = None
    span: Span | None = _span_field()
    low: int = attrs.field(default=0, kw_only=True)
    """The low mark of a `slide` (its high mark is `last`)."""

    @property
    def keeps(self) -> int | None:
        """The most units kept between firings (None for scratch: nothing survives an instant)."""
        if self.kind in ("last", "ring", "slide"):
            return self.last
        if self.kind == "first_last":
            return self.first + self.last
        if self.kind == "all":
            return self.horizon
        return None

    def trim(self, length: int) -> int:
        """The length kept after a write left `length` units (before the next firing)."""
        if self.kind in ("last", "ring"):
            return min(length, self.last)
        if self.kind == "first_last":
            return min(length, self.first + self.last)
        if self.kind in ("all", "slide"):  # a slide drops whole cadences at run time
            return length
        return 0

    def relocates(self, length: int, advance: int) -> bool:
        """Whether appending `advance` units to `length` kept units moves kept units to new offsets."""
        if self.kind == "last":
            return length > 0 and length + advance > self.last and advance < self.last
        if self.kind == "first_last":
            return length + advance > self.first + self.last and self.last > advance
        return False

    def describe(self) -> str:
        if self.kind == "first_last":
            return f"first {self.first} + last {self.last}"
        if self.kind == "all":
            return f"all horizon {self.horizon}"
        if self.kind == "scratch":
            return "scratch"
        if self.kind == "slide":
            return (f"first {self.first} + " if self.first else "") + f"slide {self.last} to {self.low}"
        return f"{self.kind} {self.last}"


def _sized(dim: int | None) -> int:
    """A dimension other than the time axis: only the time axis is written None."""
    assert dim is not None, "a dimension other than the time axis has no size"
    return dim


@attrs.frozen
class RegionInfo:
    """One region (a family member counts as one region, named `kv[3]`).

    `shape` holds ints with `None` at `time_axis`; a fixed region has no time axis (`time_axis` and
    `clock` are None) and its shape is all ints; `start_length` is the number of units held at
    session start (0 for `start empty`, the retention for `start zeros` on a window, `N` for
    `start given N`). `stock_shape` is the stock runtime's whole allocation, or None if not declared.
    """

    name: str
    family: str | None
    index: int | None
    dtype: str
    itemsize: int
    shape: tuple[int | None, ...]
    time_axis: int | None
    clock: str | None
    retention: Retention
    start: str
    start_length: int
    stock_shape: tuple[int, ...] | None
    bind: str | None
    role: str
    uses: tuple[str, ...] = ()
    span: Span | None = _span_field()
    bind_span: Span | None = _span_field()
    bind_object: str | None = attrs.field(default=None, kw_only=True)
    """The caller-owned object `bind` starts at (`bind caches "layers[0].k"`); None: the model root."""
    start_span: Span | None = _span_field()

    @property
    def unit_elements(self) -> int:
        """Elements per unit of the time axis (the product of the other dims)."""
        count = 1
        for i, dim in enumerate(self.shape):
            if i != self.time_axis:
                count *= _sized(dim)
        return count

    @property
    def fixed(self) -> bool:
        return self.time_axis is None

    def shape_at(self, length: int) -> tuple[int, ...]:
        return tuple(length if i == self.time_axis else _sized(d) for i, d in enumerate(self.shape))

    @property
    def stock_bytes(self) -> int | None:
        if self.stock_shape is None:
            return None
        count = 1
        for dim in self.stock_shape:
            count *= dim
        return count * self.itemsize


@attrs.frozen
class Access:
    """One stage's use of one region per firing.

    kind: `read`, `update` (read-modify-write) or `write`. For reads, `window` is `all` (the whole
    retained content), `last` (the newest `count` units) or `new` (the units that arrived for this
    firing, plus up to `context` older ones). `advance` is the units written per firing (None:
    the module decides, for outputs only); `latency` is held back on the first firing, and released
    by the end of the stream (`Session.finish`) unless `latency_dropped`. `loss` units are missing from
    every firing's output, as from one stock call of the model (`loses L`): a chunked stream loses them
    at every boundary between two firings, one offline call once; `loss_intended` marks that as chosen.
    """

    kind: str
    region: str
    window: str = "all"
    count: int = 0
    context: int = 0
    lookahead: int = 0
    alias: str | None = None
    prev: bool = False
    advance: int | None = None
    latency: int = 0
    latency_dropped: bool = False
    loss: int = 0
    loss_intended: bool = False
    span: Span | None = _span_field()
    up_to: bool = attrs.field(default=False, kw_only=True)
    """`update kv up to 19`: each firing advances the region by a count decided at run time, at most `advance`."""
    field: str | None = attrs.field(default=None, kw_only=True)
    """The field of the record the call returns that holds this update's or write's value (`from FIELD`)."""


@attrs.frozen
class StageInfo:
    """A stage: its clock, what it calls (`module` path or registered `hook`), and its accesses."""

    name: str
    clock: str
    callable_kind: str
    target: str
    accesses: tuple[Access, ...]
    rng: bool
    span: Span | None = _span_field()
    callable_span: Span | None = _span_field()
    passes: tuple[ObjectPass, ...] = attrs.field(default=(), kw_only=True)
    """The caller-owned objects the stage passes (`read caches`, `update caches`), placed among its
    accesses by `ObjectPass.before`."""
    rows: int | None = attrs.field(default=None, kw_only=True)
    """`rows N`: the stage runs on 1 to N conversations at once, each a row of its batch."""
    rows_span: Span | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)
    arguments: tuple[tuple[str, Any], ...] = attrs.field(default=(), kw_only=True)
    """Constant keyword arguments of the call (`with use_cache = true`): name and Python value (an int, a
    float, a str or a bool)."""

    def in_declared_order(self) -> list[Access | ObjectPass]:
        """The stage's accesses and object passes in the order the `.clock` declares them."""
        ordered: list[Access | ObjectPass] = []
        passes = sorted(self.passes, key=lambda p: p.before)
        position = 0
        for index, access in enumerate(self.accesses):
            while position < len(passes) and passes[position].before <= index:
                ordered.append(passes[position])
                position += 1
            ordered.append(access)
        ordered.extend(passes[position:])
        return ordered

    def returns_record(self) -> bool:
        """Whether the call returns a record its returns are taken from by field (`from FIELD`)."""
        return any(a.field for a in self.accesses) or any(p.field for p in self.passes)

    def reads(self) -> list[Access]:
        return [a for a in self.accesses if a.kind in ("read", "update")]

    def writes(self) -> list[Access]:
        return [a for a in self.accesses if a.kind in ("update", "write")]


@attrs.frozen
class Program:
    """A checked `.clock` program with its params applied."""

    path: str
    cadence: Fraction
    params: dict[str, Any] = attrs.field(hash=False)
    clocks: dict[str, ClockInfo] = attrs.field(hash=False)
    regions: dict[str, RegionInfo] = attrs.field(hash=False)
    families: dict[str, tuple[str, ...]] = attrs.field(hash=False)
    stages: dict[str, StageInfo] = attrs.field(hash=False)
    graph: nx.DiGraph = attrs.field(eq=False, hash=False, repr=False, default=None)
    cadence_span: Span | None = attrs.field(default=None, eq=False, repr=False)
    incomplete: bool = attrs.field(default=False, eq=False, repr=False)  # some declaration failed to resolve
    stages_left_out: bool = attrs.field(default=False, eq=False, repr=False)  # a stage failed: its accesses unknown
    limits: Limits = attrs.field(default=DEFAULT_LIMITS, eq=False, repr=False)  # checked under; planned under
    counters: dict[str, CounterInfo] = attrs.field(factory=dict, hash=False, kw_only=True)
    objects: dict[str, ObjectInfo] = attrs.field(factory=dict, hash=False, kw_only=True)

    def region(self, name: str) -> RegionInfo:
        return self.regions[name]

    def rate_of_region(self, name: str) -> Fraction:
        """The rate of a region's clock (a fixed region counts one unit per firing of its user)."""
        clock = self.regions[name].clock
        return self.clocks[clock].rate if clock is not None else Fraction(0)

    def holds_back(self) -> bool:
        """Whether the end of a stream has units to release: a read's lookahead, a latency not dropped."""
        return any(
            a.lookahead or (a.latency and not a.latency_dropped)
            for stage in self.stages.values()
            for a in stage.accesses
        )

    def units_per_firing(self, stage: str, region: str) -> Fraction:
        """How many units of `region`'s clock pass per firing of `stage` (may be a fraction)."""
        return self.rate_of_region(region) / self.clocks[self.stages[stage].clock].rate

    # --- lengths decided at run time (bounded clocks, `slide`) -----------------------------------

    def burst(self, stage: str) -> int | None:
        """Up to how many times `stage` fires at each of its instants, for a stage on a bounded clock."""
        return self.clocks[self.stages[stage].clock].bound

    def run_time_count(self) -> tuple[str, str, Span | None] | None:
        """The first declaration whose counts are decided at run time, for what cannot step it: (`bound`, a
        stage on a bounded clock), (`rows`, a batched stage) or (`slide`, a region keeping a slide), with its
        name and position; None when the plan knows every count."""
        for stage in self.stages.values():
            if self.clocks[stage.clock].bound is not None:
                return "bound", stage.name, stage.span
            if stage.rows is not None:
                return "rows", stage.name, stage.rows_span
        for name, region in self.regions.items():
            if region.retention.kind == "slide":
                return "slide", name, region.retention.span
        return None

    def on_bounded_clock(self, name: str) -> bool:
        """Whether region `name` advances on a bounded clock."""
        clock = self.regions[name].clock
        return clock is not None and self.clocks[clock].bound is not None

    def run_time_length(self, name: str) -> bool:
        """Whether the region's length is decided at run time (on a bounded clock, or `retain slide`): it is
        handed to its stages whole, at its capacity, its length a run-time value."""
        return self.on_bounded_clock(name) or self.regions[name].retention.kind == "slide"

    def units_per_instant(self, name: str) -> int:
        """The most units the stages that fire at one instant write into region `name` (each writer's advance
        times up to how often it fires at that instant)."""
        return sum(
            (self.burst(stage.name) or 1) * (access.advance or 0)
            for stage in self.stages.values()
            for access in stage.writes()
            if access.region == name
        )

    def units_per_cadence(self, name: str) -> int:
        """The most units region `name` receives in one cadence: each writer's most per instant times the most
        ticks of its clock one cadence holds (a clock slower than the cadence still ticks once in some)."""
        total = 0
        for stage in self.stages.values():
            advance = sum(a.advance or 0 for a in stage.writes() if a.region == name)
            if advance:
                ticks = math.ceil(self.cadence * self.clocks[stage.clock].rate)
                total += ticks * (self.burst(stage.name) or 1) * advance
        return total

    def run_time_capacity(self, name: str) -> int:
        """The units a region with a run-time length is allocated (`run_time_length`): a slide its high mark
        (or its pinned head or start, when longer) plus a cadence's units; `all` its horizon, or one instant's
        units when they are more; scratch what one instant writes."""
        region = self.regions[name]
        retention = region.retention
        if retention.kind == "slide":
            return max(retention.last, retention.first, region.start_length) + self.units_per_cadence(name)
        if retention.kind == "all" and retention.horizon is not None:
            return max(retention.horizon, self.units_per_instant(name))
        return (retention.keeps or 0) + self.units_per_instant(name)


# --- counters and caller-owned objects -----------------------------------------------------------


@attrs.frozen
class CounterInfo:
    """A step count the runtime keeps (`counter step +2 mod N on frame`): at an instant it holds
    `step x ticks` (mod `modulo`), `ticks` the ticks of `clock` before the instant. Its device form is
    the fixed region of the same name (role `counter`, a 0-d i64 scalar), advanced by the runtime after
    the last firing of every instant at which `clock` ticks."""

    name: str
    clock: str
    step: int
    modulo: int | None
    span: Span | None = _span_field()

    def value(self, ticks: int) -> int:
        """The host value after `ticks` ticks of its clock."""
        total = self.step * ticks
        return total % self.modulo if self.modulo is not None else total


@attrs.frozen
class ObjectInfo:
    """A caller-owned object (`object caches from new_caches`): made per session by the hook `factory`;
    made at load by one call of the stage `stage` (`object cache from stage decode`), each session starting
    from a copy; or given at load when both are None."""

    name: str
    factory: str | None
    span: Span | None = _span_field()
    stage: str | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class ObjectPass:
    """A stage's use of an object: `read caches [as ARG]` (passed) or `update caches` (passed, and what
    the call returns in its place becomes the object). `before`: how many of the stage's accesses are
    declared before it (it takes its place among them as an argument, and as a returned value)."""

    object: str
    kind: str
    before: int
    alias: str | None = None
    span: Span | None = _span_field()
    field: str | None = attrs.field(default=None, kw_only=True)
    """The field of the record the call returns that holds the object (`update cache from padding_cache`)."""


SESSION_SECONDS = 60
"""The session over which losses at chunk boundaries are counted, unless given (`dsl plan --seconds`)."""


def session_seconds(cadence: Fraction, seconds: Fraction | None = None) -> Fraction:
    """`seconds`, or SESSION_SECONDS rounded up to a whole number of cadences."""
    if seconds is not None:
        return Fraction(seconds)
    return math.ceil(SESSION_SECONDS / cadence) * cadence


def firings_within(rate: Fraction, seconds: Fraction) -> int:
    """Firings of a stage at `rate` Hz in the first `seconds` of a session (at 0, 1/rate, ... < seconds)."""
    return math.ceil(seconds * rate)


def lcm_fractions(values) -> Fraction:
    """The least positive rational that every value divides a whole number of times (a hyperperiod)."""
    numerator, denominator = 0, 0
    for value in map(Fraction, values):
        numerator = value.numerator if numerator == 0 else math.lcm(numerator, value.numerator)
        denominator = value.denominator if denominator == 0 else math.gcd(denominator, value.denominator)
    return Fraction(numerator, denominator)


def gcd_fractions(values) -> Fraction:
    """The greatest rational that divides every value a whole number of times (a base tick)."""
    numerator, denominator = 0, 0
    for value in map(Fraction, values):
        numerator = value.numerator if numerator == 0 else math.gcd(numerator, value.numerator)
        denominator = value.denominator if denominator == 0 else math.lcm(denominator, value.denominator)
    return Fraction(numerator, denominator)
