"""Pass 2, shape trace: every firing from session start, with the exact view of every region it touches.

The simulation follows the `.clock` semantics, in units of each region's clock:

* at the start of every instant a region holds at most what it retains (its history);
* an input region is fed by `step()` with the units that arrive for its reader's firing k:
  `floor((k+1)q) - floor(kq)`, q = region rate / stage rate (12, 13, 12, ... for 12.5 codes per second);
* `write R +a` appends a new units (reads later in the instant see them), less a declared loss
  (`loses L`) at every firing and a latency at the first; `update R +a` yields a
  new version of `L + a` units as a fresh tensor (returned, or assigned to the bound attribute),
  which the runtime trims at once into the region;
* a read sees `[start, end)` of the region: everything (`all`), the newest `last n`, or the `new`
  units plus up to `context` older ones;
* at the end of the instant each appended region is trimmed back to its retention (the last stage
  that touched it does it);
* every view is contiguous at its exact shape, as the stock code's tensors are; so an append or a
  trim that moves kept units onto memory they overlap, or re-lays them out because the time axis is
  not the outermost one, goes through a double buffer;
* a ring (`retain ring N`) is managed by the module in place: always N units, only its fill grows;
  scratch keeps nothing past its instant; a fixed region (no time axis) is always whole;
* a region whose length is decided at run time (on a bounded clock, or `retain slide`) is handed whole at
  its capacity (`Program.run_time_capacity`) and has no length here; a stage on a bounded clock fires once
  at each of its instants in the trace, standing for its up to N firings there, which all have its shapes;
* an instant whose input carries u units where the plan expects p (a flush of a short input) covers
  u/p of the planned time: every update and write of the instant advances by u/p of its declared
  advance, which must come out whole (a write's latency is not scaled);
* the *last* instant of a stream (`Session.finish`) also consumes what the reads held back as
  lookahead, so it covers (u + lookahead)/p of the planned time, and releases every write's latency.

The planner also traces a last instant at every instant of the warm-up and steady period (only
when the program declares a lookahead or a latency), so the capacities cover the end of a stream
at any point: with a full input, or with the input that covers exactly the planned time when a full
one would advance a region by a fraction of a unit. Those firings are never captured.

The trace runs until the state (region lengths and ring fills, at the same phase of the
hyperperiod) repeats one hyperperiod later: the instants before that are the warm-up, and one
hyperperiod after it is the steady period that repeats forever.
"""

from __future__ import annotations

import math
from fractions import Fraction

import attrs

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.clocks import ClockPlan


@attrs.frozen
class View:
    """One access of one firing.

    `start`/`length`: the units of the region handed to the stage (length None: an output whose
    size the module decides, or a fixed region). For feeds, writes and updates, `offset` is where
    the new units land and `transient` the region's length right after them. When this access is
    the last one to touch the region in its instant, `kept` is the length after the trim (else
    None), `moved` the units the trim relocates and `overlap` whether the relocation's source and
    destination overlap (it then goes through a double buffer); a read that trims (the last reader of
    units written earlier in the instant) carries the region's length before the trim in `transient`.
    """

    region: str
    kind: str
    start: int
    length: int | None
    shape: tuple[int, ...] | None
    offset: int = 0
    transient: int = 0
    kept: int | None = None
    moved: int = 0
    overlap: bool = False
    initial: bool = False
    """The access that makes a data-dependent start: a feed or write of the first units of a `start first`
    region (the units held before them become copies of its first unit), or the update of a `start
    first-firing` region at its stage's first firing (the stage is handed no value)."""

    def key(self) -> tuple:
        key = (self.region, self.kind, self.start, self.length, self.offset, self.transient, self.kept)
        return key + ("initial",) if self.initial else key


@attrs.frozen
class Firing:
    """One firing of one stage: `count` is the stage's own firing number (k), `instant` the
    global instant index from session start."""

    stage: str
    count: int
    instant: int
    time: Fraction
    views: tuple[View, ...]
    last: bool = False
    """The last instant of a stream (`Session.finish`): lookahead consumed, latency released."""
    varies: bool = False
    """Its shapes are decided at run time (an advance `up to N`): it runs eagerly, never captured."""
    advances: tuple[str, ...] = ()
    """The counters this firing advances after its call: the last firing of an instant at which each
    counter's clock ticks."""
    counters: dict[str, int] = attrs.field(factory=dict, eq=False, repr=False)
    """Each counter's value at this firing's instant (before the instant's advance), as a Python int."""

    @property
    def signature(self) -> tuple:
        """Everything that fixes the firing's shapes and arena offsets, and whether it ends the stream (a stage
        sees `firing.last`): one graph per distinct value."""
        views = tuple(view.key() for view in self.views)
        advances = (("advances",) + self.advances,) if self.advances else ()
        return (self.stage,) + views + advances + ((("last",),) if self.last else ())


@attrs.frozen
class Trace:
    """Firings from session start through the warm-up and one steady period.

    `warmup_instants`: instants before the state becomes periodic (e.g. Mimi's 125 frames of
    KV-window fill). `shape_warmup_instants`: instants before the *shapes* become periodic (a ring
    has constant shapes from the start). `period_instants`: instants in one hyperperiod.
    When `periodic` is False (a region keeps everything until its horizon), `reason` says why and
    the trace stops when the first such region reaches its horizon (the session's end).
    """

    firings: tuple[Firing, ...]
    warmup_instants: int
    shape_warmup_instants: int
    period_instants: int
    periodic: bool
    reason: str | None = None
    last_instants: tuple[Firing, ...] = ()
    """A last instant (`Session.finish`) traced from the state before every instant of `firings`, for
    the capacities only (never captured); empty when the program declares no lookahead or latency."""
    states: tuple[tuple, ...] = attrs.field(default=(), eq=False, repr=False)  # (lengths, fills) per instant
    pending_states: tuple[frozenset[str], ...] = attrs.field(default=(), eq=False, repr=False)
    """Per instant, the regions whose data-dependent start (`start first`, `first-firing`) is still to come."""

    def pending_at(self, index: int) -> frozenset[str]:
        """The regions whose data-dependent start is still to come at planned instant `index`."""
        return self.pending_states[index] if index < len(self.pending_states) else frozenset()

    @property
    def end_instant(self) -> int:
        return self.warmup_instants + self.period_instants

    def planned_index(self, instant: int) -> int | None:
        """The traced instant that instant `instant` of an on-plan session repeats (None: beyond the trace)."""
        if instant < self.end_instant or (instant < len(self.states) and not self.periodic):
            return instant
        if not self.periodic:
            return None
        return self.warmup_instants + (instant - self.warmup_instants) % self.period_instants

    def by_instant(self) -> list[list[Firing]]:
        """The traced firings grouped by instant."""
        groups: list[list[Firing]] = [[] for _ in range(len(self.states))]
        for firing in self.firings:
            groups[firing.instant].append(firing)
        return groups

    def warmup(self) -> list[Firing]:
        return [f for f in self.firings if f.instant < self.warmup_instants]

    def steady(self) -> list[Firing]:
        return [f for f in self.firings if f.instant >= self.warmup_instants]

    def steady_firing_for(self, instant: int, stage: str) -> Firing:
        """The planned firing that a (possibly much later) instant repeats."""
        if instant >= self.warmup_instants:
            instant = self.warmup_instants + (instant - self.warmup_instants) % self.period_instants
        for firing in self.firings:
            if firing.instant == instant and firing.stage == stage:
                return firing
        raise KeyError((instant, stage))


def arrivals(k: int, per_firing: Fraction) -> int:
    """Units that arrive for firing k when a region advances `per_firing` units per firing on average."""
    return math.floor((k + 1) * per_firing) - math.floor(k * per_firing)


class Simulator:
    """The `.clock` state machine: region lengths, ring fills and firing counts of one session.

    The planner runs it from session start to find the trace; the runtime runs one per session to
    know each tick's exact views (also for ticks outside the plan, e.g. a shorter flush input).
    """

    def __init__(self, program: Program, clocks: ClockPlan):
        self.program = program
        self.clocks = clocks
        self.length: dict[str, int] = {}
        self.fill: dict[str, int] = {}
        self.counts = {name: 0 for name in program.stages}
        self.override: dict[str, int] = {}
        self.last = False
        self.scale = Fraction(1)
        self.fed: dict[str, tuple[int, int]] = {}  # input -> (units fed, units planned), at an instant off the plan
        self.pending = {name for name, region in program.regions.items() if region.start in ("first", "first-firing")}
        self.tickers = counter_tickers(program)
        self.whole = {
            name: program.run_time_capacity(name) for name in program.regions if program.run_time_length(name)
        }
        """The regions whose length is decided at run time, each handed whole at its capacity."""
        for name, region in program.regions.items():
            if region.fixed or name in self.whole:
                continue
            if region.retention.kind == "ring":
                self.fill[name] = 0
            else:
                self.length[name] = region.start_length

    def state(self, phase: int) -> tuple:
        """What the next instants depend on: the phase, region lengths, ring fills, whether each stage
        that holds back a latency on its first firing has fired yet, and the regions whose data-dependent
        start (`start first`, `start first-firing`) is still to be made."""
        first = tuple(
            sorted(
                (name, self.counts[name] == 0)
                for name, stage in self.program.stages.items()
                if any(a.kind == "write" and a.latency for a in stage.accesses)
            )
        )
        state = (phase, tuple(sorted(self.length.items())), tuple(sorted(self.fill.items())), first)
        return state + (tuple(sorted(self.pending)),) if self.pending else state

    def per_firing(self, stage: str, region: str) -> Fraction:
        return self.program.rate_of_region(region) / self.clocks.rates[self.program.stages[stage].clock]

    def restore(self, lengths: dict, fills: dict, counts: dict, pending: frozenset[str] = frozenset()) -> None:
        self.length, self.fill, self.counts = dict(lengths), dict(fills), dict(counts)
        self.pending = set(pending)

    def copy(self) -> Simulator:
        other = Simulator.__new__(Simulator)
        other.program, other.clocks = self.program, self.clocks
        other.length, other.fill, other.counts = dict(self.length), dict(self.fill), dict(self.counts)
        other.override, other.last, other.scale = {}, False, Fraction(1)
        other.pending, other.tickers, other.whole = set(self.pending), self.tickers, self.whole
        return other

    def stages_at(self, index: int) -> tuple[str, ...]:
        return self.clocks.instants[index % len(self.clocks.instants)].stages

    def run_instant(
        self, index: int, arrivals_override: dict[str, int] | None = None, last: bool = False
    ) -> list[Firing]:
        """Advance one instant; `arrivals_override` gives the units fed into input regions when they
        differ from the clocks' arrivals (a tick outside the plan); `last` makes it the last instant
        of the stream. Raises ValueError when the input's units do not give whole advances."""
        self.override = arrivals_override or {}
        self.last = last
        phase = index % len(self.clocks.instants)
        instant = self.clocks.instants[phase]
        time = self.clocks.instant_time(index)
        self.scale = self.instant_scale(instant.stages)
        firings = [self.fire(name, index, time) for name in instant.stages]
        ticking = tuple(
            name
            for name, ticker in self.tickers.items()
            if any(self.program.stages[stage].clock == self.program.counters[name].clock for stage in instant.stages)
        )
        if ticking and firings:
            firings[-1] = attrs.evolve(firings[-1], advances=ticking)
        for name in instant.stages:
            self.counts[name] += 1
        return self.trim(firings)

    def instant_scale(self, stages: tuple[str, ...]) -> Fraction:
        """The fraction of the planned time an instant covers: fed units (plus the lookahead the reads
        held back, on the last instant) over the planned arrivals; 1 for a planned instant."""
        scales: dict[str, Fraction] = {}
        self.fed = {}
        for name in stages:
            k = self.counts[name]
            if not self._advances_by_the_clocks(name):
                continue  # its input scales nothing (every advance is whole, fixed or decided at run time)
            for access in self.program.stages[name].accesses:
                region = self.program.regions[access.region]
                if region.role != "input" or access.kind != "read" or access.region in scales:
                    continue
                planned = arrivals(k, self.per_firing(name, access.region))
                units = self.override.get(access.region, planned) + (access.lookahead if self.last else 0)
                if planned == 0:
                    if units:
                        raise ValueError(
                            f"input '{access.region}' gets {messages.units(units)} at an instant that plans none"
                        )
                    continue
                scales[access.region] = Fraction(units, planned)
                self.fed[access.region] = (units, planned)
        if len(set(scales.values())) > 1:
            raise ValueError(
                "the inputs of one instant must cover the same fraction of its planned time, not "
                + ", ".join(f"{name} {value}" for name, value in sorted(scales.items()))
            )
        return next(iter(scales.values()), Fraction(1))

    def _advances_by_the_clocks(self, stage: str) -> bool:
        """Whether the stage writes or updates a region whose advance follows the clocks (so the fraction of
        the planned time an instant covers scales it): not fixed, not handed whole."""
        return any(
            access.kind != "read" and not self.program.regions[access.region].fixed and access.region not in self.whole
            for access in self.program.stages[stage].accesses
        )

    def scaled(self, stage: str, region: str, advance: int) -> int:
        """`advance` scaled to the fraction of the planned time this instant covers."""
        units = advance * self.scale
        if units.denominator != 1:
            raise ValueError(
                f"stage '{stage}' advances region '{region}' by {messages.units(advance)} a planned instant; "
                f"this instant covers {self.scale} of one ({self._fed_text()}), which is not a whole number of units"
            )
        return int(units)

    def _fed_text(self) -> str:
        """What the inputs of an instant off the plan bring: `input 'pcm' brings 15 of the 16 units planned`."""
        return ", ".join(
            f"input '{name}' brings {units} of the {messages.units(planned)} planned"
            for name, (units, planned) in sorted(self.fed.items())
        )

    def fire(self, stage_name: str, instant: int, time: Fraction) -> Firing:
        stage = self.program.stages[stage_name]
        k = self.counts[stage_name]
        views: list[View] = []
        fed: set[str] = set()
        for access in stage.accesses:
            region = self.program.regions[access.region]
            if region.role == "input" and access.kind == "read" and access.region not in fed:
                fed.add(access.region)
                units = self.override.get(access.region)
                if units is None:
                    units = arrivals(k, self.per_firing(stage_name, access.region))
                views.append(self._starting(self._append(access.region, units, "feed")))
        for access in stage.accesses:
            if access.kind == "read":
                views.append(self.read(stage_name, k, access))
        for access in stage.accesses:
            if access.kind == "update":
                views.append(self._starting(self.update(stage_name, access)))
            elif access.kind == "write":
                views.append(self._starting(self.write(stage_name, access, k)))
        counters = {
            name: self.program.counters[name].value(self.counts[ticker]) for name, ticker in self.tickers.items()
        }
        varies = any(access.up_to for access in stage.accesses)
        return Firing(stage_name, k, instant, time, tuple(views), self.last, varies, counters=counters)

    def _whole(self, name: str, kind: str) -> View:
        """A view of a region with a run-time length: the whole region, at its capacity."""
        size = self.whole[name]
        return View(name, kind, 0, size, self._shape(name, size), transient=size, kept=size if kind != "read" else None)

    def _starting(self, view: View) -> View:
        """`view`, marked `initial` when it makes its region's data-dependent start: the first units fed or
        written into a `start first` region, the first update of a `start first-firing` one."""
        if view.region not in self.pending:
            return view
        start = self.program.regions[view.region].start
        if start == "first" and view.kind in ("feed", "write") and view.length:
            self.pending.discard(view.region)
            return attrs.evolve(view, initial=True)
        if start == "first-firing" and view.kind == "update":
            self.pending.discard(view.region)
            return attrs.evolve(view, initial=True)
        return view

    def trim(self, firings: list[Firing]) -> list[Firing]:
        """End of the instant: each region that grew is trimmed by the last access that touched it: its last
        feed or write, or a read by a later firing of the instant (which must see the units it relies on)."""
        last_touch: dict[str, tuple[int, int]] = {}
        for f_index, firing in enumerate(firings):
            for v_index, view in enumerate(firing.views):
                if (view.kind in ("feed", "write") and view.region in self.length) or (
                    view.kind == "read"
                    and view.region in last_touch
                    and last_touch[view.region][0] < f_index
                    and self.program.regions[view.region].retention.kind != "scratch"  # trimmed to nothing: no move
                ):
                    last_touch[view.region] = (f_index, v_index)
        for name, (f_index, v_index) in last_touch.items():
            region = self.program.regions[name]
            retention = region.retention
            transient = self.length[name]
            kept = retention.trim(transient)
            moved, overlap = _trim_relocation(retention, transient, kept)
            if kept and kept != transient and not _time_outermost(region):
                moved, overlap = kept, True
            self.length[name] = kept
            firing = firings[f_index]
            views = list(firing.views)
            view = views[v_index]
            views[v_index] = attrs.evolve(
                view,
                kept=kept,
                moved=max(view.moved, moved),
                overlap=view.overlap or overlap,
                transient=transient if view.kind == "read" else view.transient,
            )
            firings[f_index] = attrs.evolve(firing, views=tuple(views))
        return firings

    # --- accesses ------------------------------------------------------------------------------

    def _shape(self, name: str, length: int | None) -> tuple[int, ...] | None:
        region = self.program.regions[name]
        if region.fixed:
            return tuple(d for d in region.shape if d is not None)  # every dim declared
        return None if length is None else region.shape_at(length)

    def _append(self, name: str, units: int, kind: str) -> View:
        current = self.length[name]
        self.length[name] = current + units
        relayout = current > 0 and not _time_outermost(self.program.regions[name])
        return View(
            name,
            kind,
            current,
            units,
            self._shape(name, units),
            offset=current,
            transient=current + units,
            moved=current if relayout else 0,
            overlap=relayout,
        )

    def read(self, stage: str, k: int, access) -> View:
        name = access.region
        region = self.program.regions[name]
        if region.fixed:
            return View(name, "read", 0, None, self._shape(name, None))
        if name in self.whole:
            return self._whole(name, "read")
        if region.retention.kind == "ring":
            size = region.retention.last
            return View(name, "read", 0, size, self._shape(name, size))
        current = self.length[name]
        if access.window == "last":
            length = min(access.count, current)
        elif access.window == "new":
            planned = self.override.get(name)
            new = min(planned if planned is not None else arrivals(k, self.per_firing(stage, name)), current)
            length = new + min(access.context, current - new)
        else:
            length = current
        return View(name, "read", current - length, length, self._shape(name, length))

    def update(self, stage: str, access) -> View:
        name = access.region
        region = self.program.regions[name]
        if region.fixed:
            return View(name, "update", 0, None, self._shape(name, None))
        if name in self.whole:
            return self._whole(name, "update")
        advance = self.scaled(stage, name, access.advance)
        if region.retention.kind == "ring":
            size = region.retention.last
            self.fill[name] = min(self.fill[name] + advance, size)
            return View(name, "update", 0, size, self._shape(name, size), offset=0, transient=size, kept=size)
        current = self.length[name]
        transient = current + advance
        kept = region.retention.trim(transient)
        self.length[name] = kept
        # the stage's new version is a fresh tensor: the kept part is copied from it, never overlapping
        return View(
            name, "update", 0, current, self._shape(name, current), offset=current, transient=transient, kept=kept
        )

    def write(self, stage: str, access, k: int) -> View:
        name = access.region
        if name in self.whole:
            return self._whole(name, "write")
        if access.advance is None:  # an output whose length the module decides
            return View(name, "write", 0, None, None)
        units = self.scaled(stage, name, access.advance) - (access.latency if k == 0 else 0) - access.loss
        if self.last and not access.latency_dropped:
            units += access.latency  # the end of the stream releases what the latency held back
        if units < 0:
            raise ValueError(
                f"stage '{stage}' would write {messages.units(units)} of region '{name}': this instant covers "
                f"{self.scale} of a planned one, too little for its loss of {access.loss}"
            )
        return self._append(name, units, "write")


def counter_tickers(program: Program) -> dict[str, str]:
    """For each counter, a stage on its clock (the first declared): its firings count the clock's ticks."""
    tickers = {}
    for name, counter in program.counters.items():
        ticker = next((stage.name for stage in program.stages.values() if stage.clock == counter.clock), None)
        if ticker is not None:
            tickers[name] = ticker
    return tickers


def repeating_counters(program: Program, clocks: ClockPlan) -> frozenset[str]:
    """The counters whose value is the same a hyperperiod later (a modulus that the hyperperiod's advance is
    a multiple of): the host value a graph was captured with is then right at every replay of it."""
    found = set()
    for name, ticker in counter_tickers(program).items():
        counter = program.counters[name]
        advance = counter.step * clocks.stages[ticker].per_hyperperiod
        if counter.modulo is not None and advance % counter.modulo == 0:
            found.add(name)
    return frozenset(found)


def counter_values(program: Program, counts: dict[str, int]) -> dict[str, int]:
    """Each counter's value when its ticker stage has fired `counts[ticker]` times (`counts`: firings before
    an instant, by stage)."""
    return {name: program.counters[name].value(counts[ticker]) for name, ticker in counter_tickers(program).items()}


def _time_outermost(region) -> bool:
    """Whether a contiguous view's time positions are contiguous runs (all dims before time are 1)."""
    return all(dim == 1 for dim in region.shape[: region.time_axis])


def _trim_relocation(retention, transient: int, kept: int) -> tuple[int, bool]:
    """Units the trim moves down, and whether source and destination overlap."""
    if transient <= kept or kept == 0:
        return 0, False
    if retention.kind == "last":
        source = transient - kept
        return kept, source < kept
    if retention.kind == "first_last":
        destination, source = retention.first, transient - retention.last
        return retention.last, source < destination + retention.last
    return 0, False


def _last_instant(simulator: Simulator, index: int) -> list[Firing]:
    """The last instant a stream could end with at `index`: with the full planned input, or, when that
    advances some region by a fraction of a unit, with the input that covers exactly the planned time."""
    planned = {
        v.region: v.length
        for f in simulator.copy().run_instant(index)
        for v in f.views
        if v.kind == "feed" and v.length is not None  # a feed's length is its units: always known
    }
    lookahead = {
        a.region: a.lookahead
        for name in simulator.stages_at(index)
        for a in simulator.program.stages[name].accesses
        if a.region in planned and a.kind == "read"
    }
    exact = {name: units - lookahead.get(name, 0) for name, units in planned.items()}
    for override in (None, exact):
        if override is not None and any(units < 0 for units in override.values()):
            continue
        try:
            return simulator.copy().run_instant(index, override, last=True)
        except ValueError:
            continue
    return []


def trace_shapes(program: Program, clocks: ClockPlan) -> Trace:
    """Pass 2: every firing's exact views from session start through the warm-up and one steady period,
    held to the program's limits as it grows: ClockError (`warmup-too-long`, `too-many-firings`,
    `too-many-views`, `too-many-states`) as soon as one is passed, so no program traces for long."""
    limits = program.limits
    period = clocks.instants_per_hyperperiod
    simulator = Simulator(program, clocks)
    releases = any(
        a.lookahead or (a.latency and not a.latency_dropped)
        for stage in program.stages.values()
        for a in stage.accesses
    )
    states: list[tuple] = []
    snapshots: list[tuple] = []
    pending: list[frozenset[str]] = []
    by_instant: list[list[Firing]] = []
    last_by_instant: list[list[Firing]] = []
    warmup = None
    index = 0
    limit = limits.warmup + period  # the state must repeat by then; the limit is raised once it does
    horizons = {
        name: region.retention.horizon
        for name, region in program.regions.items()
        if region.retention.kind == "all" and region.retention.horizon is not None  # checked: `all` has one
    }
    ended_at = None
    traced_firings = traced_views = traced_states = 0
    while index < limit or warmup is None:
        if warmup is None and index >= limit:
            raise ClockError([_not_repeating(program, snapshots, period, limits.warmup)])
        traced_states += (len(simulator.length) + len(simulator.fill)) * (2 if releases else 1)
        if traced_states > limits.states:  # before the copies this instant would keep
            raise ClockError([_too_many_states(program, index + 1, traced_states)])
        states.append(simulator.state(index % period))
        snapshots.append((dict(simulator.length), dict(simulator.fill)))
        pending.append(frozenset(simulator.pending))
        if releases:
            last_by_instant.append(_last_instant(simulator, index))
        by_instant.append(simulator.run_instant(index))
        for firing in by_instant[-1] + (last_by_instant[-1] if releases else []):
            traced_firings += 1
            traced_views += len(firing.views)
        if traced_firings > limits.firings:
            raise ClockError([_too_many_firings(program, clocks, by_instant, last_by_instant, traced_firings)])
        if traced_views > limits.views:
            raise ClockError([_too_many_views(program, by_instant, last_by_instant, traced_views)])
        full = sorted(name for name, horizon in horizons.items() if simulator.length.get(name, 0) >= horizon)
        if full and warmup is None:
            ended_at = (index + 1, full)
            break
        if index >= period and states[index - period] == states[index] and warmup is None:
            # the state repeats: find the earliest instant from which it always does
            warmup = index - period
            while warmup > 0 and states[warmup - 1] == states[warmup - 1 + period]:
                warmup -= 1
            limit = max(index + 1, warmup + 2 * period)
        index += 1
    periodic = warmup is not None
    reason = None
    if warmup is None:  # not periodic
        assert ended_at is not None, "a trace ends when its state repeats or a region reaches its horizon"
        reason = f"{', '.join(ended_at[1])} reached its horizon at instant {ended_at[0]}: the session cannot go further"
        warmup = len(by_instant)
        shape_warmup = warmup
        end = len(by_instant)
    else:
        end = warmup + period
        signatures = [tuple(f.signature for f in firings) for firings in by_instant]
        shape_warmup = warmup
        while shape_warmup > 0 and signatures[shape_warmup - 1] == signatures[shape_warmup - 1 + period]:
            shape_warmup -= 1
    firings = tuple(f for firings in by_instant[:end] for f in firings)
    last_instants = tuple(f for firings in last_by_instant[:end] for f in firings)
    return Trace(
        firings,
        warmup,
        shape_warmup,
        period if periodic else 0,
        periodic,
        reason,
        last_instants,
        states=tuple(snapshots[:end]),
        pending_states=tuple(pending[:end]),
    )


def _not_repeating(program: Program, snapshots: list[tuple], period: int, limit: int):
    """`warmup-too-long` at the region that still changes: its length (or ring fill) a hyperperiod
    ago and now differ."""
    (old_lengths, old_fills), (lengths, fills) = snapshots[-1 - period], snapshots[-1]
    changing = sorted(
        [(name, old_lengths[name], lengths[name]) for name in lengths if lengths[name] != old_lengths[name]]
        + [(name, old_fills[name], fills[name]) for name in fills if fills[name] != old_fills[name]]
    )
    name, before, after = changing[0] if changing else (next(iter(sorted(lengths or fills))), 0, 0)
    region = program.regions[name]
    return messages.warmup_not_repeating(
        name, before, after, len(snapshots), limit, region.retention.span or region.span
    )


def _too_many_firings(program, clocks: ClockPlan, by_instant, last_by_instant, traced: int):
    repeating = 2 * sum(timing.per_hyperperiod for timing in clocks.stages.values())
    repeating *= 2 if last_by_instant else 1
    return messages.too_many_firings(
        traced,
        max(traced - repeating, 0),
        min(repeating, traced),
        number_text(clocks.hyperperiod),
        program.limits.firings,
        program.cadence_span,
    )


def _too_many_views(program, by_instant, last_by_instant, traced: int):
    views: dict[str, int] = {}
    counts: dict[str, int] = {}
    for firing in [f for firings in by_instant + last_by_instant for f in firings]:
        views[firing.stage] = views.get(firing.stage, 0) + len(firing.views)
        counts[firing.stage] = counts.get(firing.stage, 0) + 1
    busiest = max(sorted(views), key=lambda name: views[name])
    per_firing = views[busiest] // counts[busiest]
    return messages.too_many_views(
        traced, busiest, per_firing, counts[busiest], program.limits.views, program.stages[busiest].span
    )


def _too_many_states(program, instants: int, traced: int):
    timed = sum(not region.fixed for region in program.regions.values())
    return messages.too_many_states(traced, instants, timed, program.limits.states, program.cadence_span)
