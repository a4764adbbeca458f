"""Pass 6, sample accounting: where every unit of every output goes over a session of T seconds.

A session is the instants of its first T seconds, stepped as planned, then, when the program holds
units back (a read's lookahead, a latency that is not dropped), the end of the stream: the next
instant, with no new input (`Session.finish`), which releases them. For each output region, per
firing of the stage that writes it and over the session:

* **input**: the units of the input that drives it (the one input region upstream of it in the
  dataflow), fed since the writer's previous firing; what the input is given at session start
  (`start given N`: priming units) counts too;
* **emitted**: the units the firing returns (the trace's write; for an output whose length the module
  decides, the input's units times the rate ratio, less the loss);
* **held back**: units the stream owes after the firing, which the end of the stream releases: a
  latency that is not dropped, and the input's lookahead, times the rate ratio;
* **dropped**: units lost at the boundary before the firing (`loses L`: L at each boundary);
* **flushed**: what the end of the stream emits.

The session's total (emitted + flushed) is set against one **offline** call over the same input,
from the declared rates alone: input units times the rate ratio, less what the clock declares the
whole-utterance output loses (a dropped latency, a per-firing loss: one call loses it once). A clock
that accounts for every unit has `short` = `dropped` (`unaccounted` 0).

Per-firing values repeat with the trace's steady period, so a session of any length is summed from
the firings of the warm-up and one period (`ticks`); the end of the stream is traced apart.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import networkx as nx

from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import Access, Program, session_seconds
from duplexcadence.interpreter.plans.clocks import ClockPlan
from duplexcadence.interpreter.plans.trace import Firing, Simulator, Trace

MAX_SESSION_INSTANTS = 10_000_000
"""The longest session the accounting sums (instants); `dsl plan --seconds` is refused beyond it."""


class SessionLengthError(ValueError):
    """A session to account that is not positive, or longer than MAX_SESSION_INSTANTS instants."""


@attrs.frozen
class TickSamples:
    """One firing of an output's writer: `firing` its number, `instant` the traced instant it repeats."""

    firing: int
    instant: int
    time: Fraction
    input: int
    emitted: int
    held_back: int
    dropped: int

    def values(self) -> tuple[int, int, int, int]:
        return (self.input, self.emitted, self.held_back, self.dropped)


@attrs.frozen
class OutputSamples:
    """The accounting of one output region over the session."""

    region: str
    clock: str
    rate: Fraction
    stage: str
    input: str
    ratio: Fraction
    """Output units per input unit: rate(output) / rate(input)."""
    loss: int
    loss_intended: bool
    latency: int
    latency_dropped: bool
    ticks: tuple[TickSamples, ...]
    """The writer's firings over the warm-up and one steady period, as regular steps."""
    steady_from: int | None
    """The index in `ticks` from which they repeat (None without a steady state)."""
    last: TickSamples
    """The session's last firing: the end of the stream's, or the last regular one when nothing is held
    back (`time` is then its time in the session)."""
    firings: int
    input_units: int
    emitted: int
    flushed: int
    held_back: int
    """The most the stream owes at once (released by the end of the stream)."""

    @property
    def boundaries(self) -> int:
        return max(self.firings - 1, 0)

    @property
    def dropped(self) -> int:
        return self.loss * self.boundaries

    @property
    def total(self) -> int:
        return self.emitted + self.flushed

    @property
    def whole_loss(self) -> int:
        """Units one offline call loses too: a dropped latency and one firing's loss."""
        return self.loss + (self.latency if self.latency_dropped else 0)

    @property
    def offline(self) -> int:
        return int(self.input_units * self.ratio) - self.whole_loss

    @property
    def short(self) -> int:
        return self.offline - self.total

    @property
    def unaccounted(self) -> int:
        """Units missing from the total that no declaration explains (0 for a clock that adds up)."""
        return self.short - self.dropped


@attrs.frozen
class SampleAccount:
    """Every output's accounting over a session of `seconds`: `instants` regular instants, then, when the
    program holds units back (a lookahead, a latency that is not dropped), the end of the stream
    (`Session.finish` with no new input) at the next instant; `skipped`: outputs that cannot be
    accounted, and why; `clamped`: why the session is shorter than asked (a region reached its
    horizon), else None."""

    seconds: Fraction
    instants: int
    outputs: dict[str, OutputSamples] = attrs.field(hash=False)
    skipped: dict[str, str] = attrs.field(factory=dict, hash=False)
    clamped: str | None = None
    flush: bool = False
    """Whether the session ends with an instant of its own that releases what was held back."""
    unflushed: str | None = None
    """Why the program holds units back but the end of the stream cannot be traced (else None)."""


def _writer(program: Program, region: str) -> tuple[str, Access] | None:
    for stage in program.stages.values():
        for access in stage.accesses:
            if access.kind == "write" and access.region == region:
                return stage.name, access
    return None


def _driving_input(program: Program, region: str) -> tuple[str | None, str | None]:
    """The one input region upstream of `region` in the dataflow, or (None, why not)."""
    graph = program.graph
    upstream = sorted(
        name
        for kind, name in nx.ancestors(graph, ("region", region))
        if kind == "region" and program.regions[name].role == "input"
    )
    if len(upstream) == 1:
        return upstream[0], None
    if not upstream:
        return None, "no input feeds it"
    return None, f"several inputs feed it ({', '.join(upstream)}): no single rate ratio"


@attrs.frozen
class _Instant:
    """What one traced instant contributes: input units fed, whether the writer fires, what it writes."""

    fed: int
    fires: bool
    written: int | None


def _instant_parts(firings: list[Firing], stage: str, region: str, source: str) -> _Instant:
    fed, fires, written = 0, False, None
    for firing in firings:
        for view in firing.views:
            if view.kind == "feed" and view.region == source:
                fed += view.length or 0
            if firing.stage == stage and view.kind == "write" and view.region == region:
                fires, written = True, view.length
    return _Instant(fed, fires, written)


def _emitted(part: _Instant, fed_since: int, ratio: Fraction, access: Access) -> int | None:
    if part.written is not None:
        return part.written
    units = fed_since * ratio
    return int(units) - access.loss if units.denominator == 1 else None


def _cadences_within(clocks: ClockPlan, cadence: Fraction, seconds: Fraction, most: int) -> int:
    """The most whole cadences, up to `seconds`, whose session has at most `most` instants."""
    low, high = 0, int(seconds / cadence)
    while low < high:
        middle = (low + high + 1) // 2
        if clocks.instants_within(middle * cadence) <= most:
            low = middle
        else:
            high = middle - 1
    return low


def account_samples(
    program: Program, clocks: ClockPlan, trace: Trace, seconds: Fraction | None = None
) -> SampleAccount:
    """Pass 6: every output's units over a session of `seconds` (default: 60 s, whole cadences, shortened to
    the whole cadences of MAX_SESSION_INSTANTS instants where 60 s holds more). Raises SessionLengthError for
    a session given that is not positive or longer than MAX_SESSION_INSTANTS."""
    asked = seconds
    seconds = session_seconds(program.cadence, seconds)
    if seconds <= 0:
        raise SessionLengthError(f"a session lasts a positive number of seconds, not {number_text(seconds)}")
    instants = clocks.instants_within(seconds)
    clamped = None
    if instants > MAX_SESSION_INSTANTS:
        too_long = f"a session of {number_text(seconds)} s has {instants} instants; the sample accounting sums at most {MAX_SESSION_INSTANTS}"
        fitting = _cadences_within(clocks, program.cadence, seconds, MAX_SESSION_INSTANTS)
        if asked is not None or fitting == 0:
            raise SessionLengthError(too_long)
        seconds = fitting * program.cadence
        instants = clocks.instants_within(seconds)
        clamped = f"{too_long}: accounted over the first {number_text(seconds)} s"
    traced = len(trace.states)
    if not trace.periodic and instants > traced:
        horizon = f"{trace.reason}: accounted over the {traced} instants traced"
        clamped = horizon if clamped is None else f"{clamped}; {horizon}"
        instants = traced
    by_instant = trace.by_instant()
    flush, unflushed = _flush_instant(program, clocks, trace, instants)
    outputs: dict[str, OutputSamples] = {}
    skipped: dict[str, str] = {}
    for name, region in sorted(program.regions.items()):
        if region.role != "output" or region.clock is None:
            continue
        if program.on_bounded_clock(name):
            skipped[name] = f"its clock '{region.clock}' counts its units at run time"
            continue
        writer = _writer(program, name)
        source, why = _driving_input(program, name)
        if writer is None or source is None:
            skipped[name] = why or "no stage writes it"
            continue
        stage, access = writer
        ratio = program.rate_of_region(name) / program.rate_of_region(source)
        parts = [_instant_parts(by_instant[i], stage, name, source) for i in range(traced)]
        account = _account(program, clocks, trace, name, stage, access, source, ratio, parts, instants, flush)
        if isinstance(account, str):
            skipped[name] = account
        else:
            outputs[name] = account
    return SampleAccount(seconds, instants, outputs, skipped, clamped, flush is not None, unflushed)


def _flush_instant(
    program: Program, clocks: ClockPlan, trace: Trace, instants: int
) -> tuple[list[Firing] | None, str | None]:
    """The end of the stream after `instants` regular ones: the next instant with no new input units, which
    releases what the stream held back; (None, None) when nothing is held back, (None, why) when it
    cannot be traced."""
    if not program.holds_back():
        return None, None
    planned = trace.planned_index(instants)
    if planned is None or planned >= len(trace.states):
        return None, "the session ends at its horizon: no instant after it"
    simulator = Simulator(program, clocks)
    lengths, fills = trace.states[planned]
    simulator.restore(lengths, fills, clocks.firings_before(instants), trace.pending_at(planned))
    empty = {
        a.region: 0
        for name in simulator.stages_at(instants)
        for a in program.stages[name].accesses
        if a.kind == "read" and program.regions[a.region].role == "input"
    }
    try:
        return simulator.run_instant(instants, empty, last=True), None
    except ValueError as error:
        return None, f"the end of the stream with no new input cannot be traced: {error}"


def _lookahead_at(program: Program, firings: list[Firing], source: str) -> int:
    """The lookahead of the reads of `source` among `firings` (what the end of the stream consumes)."""
    return max(
        (
            a.lookahead
            for f in firings
            for a in program.stages[f.stage].accesses
            if a.region == source and a.kind == "read"
        ),
        default=0,
    )


def _account(
    program: Program,
    clocks: ClockPlan,
    trace: Trace,
    name: str,
    stage: str,
    access: Access,
    source: str,
    ratio: Fraction,
    parts: list[_Instant],
    instants: int,
    flush: list[Firing] | None,
) -> OutputSamples | str:
    """The accounting of output `name`, or why it cannot be done."""
    input_region = program.regions[source]
    given = input_region.start_length if input_region.start == "given" else 0
    lookahead = max(
        (a.lookahead for s in program.stages.values() for a in s.accesses if a.region == source and a.kind == "read"),
        default=0,
    )
    pending = 0 if access.latency_dropped else access.latency

    # the traced firings, as regular steps
    ticks: list[TickSamples] = []
    input_so_far, fed_since = given, 0
    steady_from = None
    for index, part in enumerate(parts):
        input_so_far += part.fed
        fed_since += part.fed
        if not part.fires:
            continue
        emitted = _emitted(part, fed_since, ratio, access)
        if emitted is None:
            return f"its module decides its length, and {fed_since} input units times {ratio} is no whole number"
        if steady_from is None and trace.periodic and index >= trace.warmup_instants:
            steady_from = len(ticks)
        held = pending + int(min(lookahead, input_so_far) * ratio)
        dropped = access.loss if ticks else 0
        ticks.append(TickSamples(len(ticks), index, clocks.instant_time(index), fed_since, emitted, held, dropped))
        fed_since = 0
    if not ticks:
        return f"its stage '{stage}' never fires in the trace"
    per_instant = {tick.instant: tick for tick in ticks}

    # every instant of the session, as the traced instant it repeats; past the trace, all hyperperiods but the
    # last are summed whole (each repeats every traced instant of one period once)
    fed, emitted_total, firings, most_held = given, 0, 0, 0
    last = ticks[0]

    def visit(instants_visited: range) -> None:
        nonlocal fed, emitted_total, firings, most_held, last
        for instant in instants_visited:
            repeated = trace.planned_index(instant)
            assert repeated is not None, "instants are clamped to the trace"
            fed += parts[repeated].fed
            tick = per_instant.get(repeated)
            if tick is not None:
                last = attrs.evolve(tick, firing=firings, time=clocks.instant_time(instant))
                firings += 1
                emitted_total += tick.emitted
                most_held = max(most_held, tick.held_back)

    traced_end = min(instants, trace.end_instant)
    visit(range(traced_end))
    whole = (instants - traced_end) // trace.period_instants - 1 if trace.periodic else 0
    if whole > 0:
        period = range(trace.warmup_instants, trace.end_instant)
        repeated_ticks = [per_instant[i] for i in period if i in per_instant]
        fed += whole * sum(parts[i].fed for i in period)
        firings += whole * len(repeated_ticks)
        emitted_total += whole * sum(tick.emitted for tick in repeated_ticks)
        traced_end += whole * trace.period_instants
    visit(range(traced_end, instants))

    # the end of the stream: an instant of its own with no new input, which releases what was held back
    flushed = 0
    if flush is not None:
        ending = _instant_parts(flush, stage, name, source)
        if ending.fires:
            if ending.written is not None:
                flushed = ending.written
            else:  # the module decides: the lookahead the end of the stream consumes
                flushed = int((ending.fed + _lookahead_at(program, flush, source)) * ratio) - access.loss
            planned = trace.planned_index(instants)
            assert planned is not None, "the flush instant was traced from a planned state"
            last = TickSamples(
                firings, planned, clocks.instant_time(instants), ending.fed, flushed, 0, access.loss if firings else 0
            )
            firings += 1
            fed += ending.fed
    return OutputSamples(
        name,
        program.regions[name].clock or "",
        program.rate_of_region(name),
        stage,
        source,
        ratio,
        access.loss,
        access.loss_intended,
        access.latency,
        access.latency_dropped,
        tuple(ticks),
        steady_from,
        last,
        firings,
        fed,
        emitted_total,
        flushed,
        most_held,
    )
