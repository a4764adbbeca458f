"""Pass 8 (declared), off-plan instants: the steps a session may take off the plan, traced from every state
they can start at until the session is back on the plan.

A session leaves the plan when an instant's inputs bring another number of units than planned (a forced
flush of a short input) or when its stream ends (`Session.finish`). The `.clock` plans neither: which of
them happen is the caller's protocol (MiniCPM-o 4.5 may flush a turn's first chunk short, and ends every
turn with a finish of what its token buffer holds). The caller declares them as `OffPlanStep`s; this pass
takes each declared step at every planned instant it may start at, then follows the session through the
planned steps that come after it, taking the declared steps there too, until its state is the planned
state of its instant again (it is back on the plan). Every instant on the way whose firings no planned
instant has, in that order, is an *off-plan instant*: the runtime captures its graph runs ahead of time,
like a planned instant's, so a session that takes only declared steps fires nothing eagerly.

The declaration is data (`OffPlanStep`, or its text for `dsl plan --off-plan`), so a construct of the
language that bounds what a step may bring (an input's units counted at run time) can produce the same
records. A pure function of the plan's passes and the declaration: no torch.

Public: `OffPlanStep`, `OffPlanInstant`, `OffPlanPlan`, `OffPlanError`, `plan_off_plan`, `back_on_plan`,
`over_capacity`.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import attrs

from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.allocation import AllocationSchedule
from duplexcadence.interpreter.plans.capture import CapturePlan
from duplexcadence.interpreter.plans.clocks import ClockPlan
from duplexcadence.interpreter.plans.trace import Firing, Simulator, Trace, View

WHERE = ("start", "any")
"""Where a declared step may be taken: `start`, at a stream's first instant only (after `reset()`);
`any`, at any instant a session can reach."""


class OffPlanError(ValueError):
    """A declared off-plan step that is malformed or that no planned instant can take: the message says why
    and what is legal."""


_STEP_TEXT = re.compile(r"(step|finish)\s+(.+?)(?:\s+at\s+(\w+))?")
_UNITS_TEXT = re.compile(r"([A-Za-z_]\w*)=(\d+)(?:-(\d+))?")


@attrs.frozen
class OffPlanStep:
    """A kind of step a session may take off the plan: its inputs bring the given unit counts (one step per
    count; several inputs: each combination), it is the stream's last instant (`last`: `Session.finish`)
    or not, and it may be taken at a stream's first instant only or anywhere (`at`, one of `WHERE`).
    Build it with `of` (from Python) or `parse` (from its text, `text()`)."""

    units: tuple[tuple[str, tuple[int, ...]], ...]
    last: bool = False
    at: str = "any"

    @classmethod
    def of(cls, units: Mapping[str, Iterable[int]], last: bool = False, at: str = "any") -> OffPlanStep:
        """The step of `units` (input region -> the unit counts a step may bring); OffPlanError (a ValueError)
        for a declaration that says nothing or something impossible."""
        if at not in WHERE:
            raise OffPlanError(f"an off-plan step is taken at {' or '.join(WHERE)}, not {at!r}")
        if not units:
            raise OffPlanError("an off-plan step names at least one input region and the units it brings")
        counts = {}
        for name, values in sorted(units.items()):
            chosen = tuple(sorted(set(values)))
            if not chosen or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in chosen):
                raise OffPlanError(
                    f"input '{name}' of an off-plan step: give the unit counts it may bring as whole numbers "
                    f"of at least 0, not {list(values)!r}"
                )
            counts[name] = chosen
        return cls(tuple(counts.items()), bool(last), at)

    @classmethod
    def parse(cls, text: str) -> OffPlanStep:
        """The step `text()` writes: `step tokens=5-24 at start`, `finish tokens=0`; OffPlanError saying
        what is legal for anything else."""
        match = _STEP_TEXT.fullmatch(text.strip())
        legal = (
            "write 'step NAME=COUNTS [at start|any]' or 'finish NAME=COUNTS [at start|any]', COUNTS a number or "
            "a range LOW-HIGH (inclusive), several inputs separated by spaces: 'step tokens=5-24 at start'"
        )
        if match is None:
            raise OffPlanError(f"off-plan step {text!r}: {legal}")
        kind, body, at = match.groups()
        units: dict[str, list[int]] = {}
        for item in body.split():
            found = _UNITS_TEXT.fullmatch(item)
            if found is None:
                raise OffPlanError(f"off-plan step {text!r}: {item!r} is not NAME=COUNTS; {legal}")
            name, low, high = found.group(1), int(found.group(2)), found.group(3)
            top = low if high is None else int(high)
            if top < low:
                raise OffPlanError(
                    f"off-plan step {text!r}: the range {low}-{top} is empty; write LOW-HIGH with LOW <= HIGH"
                )
            units.setdefault(name, []).extend(range(low, top + 1))
        return cls.of(units, last=kind == "finish", at=at or "any")

    def text(self) -> str:
        """The declaration as `parse` reads it."""
        parts = " ".join(f"{name}={run}" for name, counts in self.units for run in _runs(counts))
        return f"{'finish' if self.last else 'step'} {parts} at {self.at}"

    def choices(self) -> list[dict[str, int]]:
        """Each step the declaration allows: its units by input region."""
        names = [name for name, _ in self.units]
        return [dict(zip(names, combination)) for combination in itertools.product(*(c for _, c in self.units))]


def _runs(counts: Sequence[int]) -> list[str]:
    """Sorted counts as runs: [0, 5, 6, 7] -> ["0", "5-7"]."""
    runs = []
    for _, group in itertools.groupby(enumerate(counts), lambda item: item[1] - item[0]):
        values = [value for _, value in group]
        runs.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return runs


@attrs.frozen
class OffPlanInstant:
    """One instant off the plan, as the runtime captures it: the session's instant (the first it is seen
    at), the regions' lengths at its start (what the stage bodies bind), the units its inputs bring, whether
    it ends the stream, its firings, and whether it starts from a planned state (`from_plan`) or from one
    that an earlier off-plan step led to."""

    instant: int
    lengths: dict[str, int] = attrs.field(eq=False, repr=False)
    units: tuple[tuple[str, int], ...]
    last: bool
    firings: tuple[Firing, ...] = attrs.field(repr=False)
    from_plan: bool

    @property
    def signatures(self) -> tuple[tuple, ...]:
        return tuple(f.signature for f in self.firings)

    def describe(self) -> str:
        """`finish: tokens 0 at instant 2 (planned)`: what the instant is, for the plan's text."""
        units = ", ".join(f"{name} {count}" for name, count in self.units)
        kind = "finish" if self.last else ("step" if units else "planned step")
        where = "planned" if self.from_plan else "off the plan"
        return f"{kind}{': ' + units if units else ''} at instant {self.instant} ({where})"


@attrs.frozen
class OffPlanPlan:
    """The declared steps and what they lead to: the off-plan instants (each distinct sequence of firings
    once), the off-plan states the trace reached, the stage graphs the capture plan does not have (signature
    -> key, numbered after its graphs), and how many declared (state, units) pairs the runtime would refuse
    (a fractional advance, a region over its capacity, an input the instant does not read)."""

    steps: tuple[OffPlanStep, ...] = ()
    instants: tuple[OffPlanInstant, ...] = ()
    states: int = 0
    graphs: dict[tuple, int] = attrs.field(factory=dict, repr=False)
    refused: int = 0

    @property
    def declared(self) -> bool:
        return bool(self.steps)


def over_capacity(schedule: AllocationSchedule, firings: Iterable[Firing]) -> tuple[View, int, int] | None:
    """The first view of `firings` that needs more units than its region's capacity: (view, needed,
    capacity); None when every view fits."""
    for firing in firings:
        for view in firing.views:
            capacity = schedule.regions[view.region].capacity
            needed = max(
                view.transient if view.kind in ("feed", "write") else 0,
                (view.start + view.length) if view.length is not None and view.kind != "update" else 0,
            )
            if capacity is not None and needed > capacity:
                return view, needed, capacity
    return None


def planned_simulator(program: Program, clocks: ClockPlan, trace: Trace, instant: int) -> Simulator | None:
    """A simulator in the planned state of `instant` (None beyond the trace of a plan without a steady state)."""
    index = trace.planned_index(instant)
    if index is None:
        return None
    lengths, fills = trace.states[index]
    simulator = Simulator(program, clocks)
    simulator.restore(lengths, fills, clocks.firings_before(instant), trace.pending_at(index))
    return simulator


def back_on_plan(program: Program, clocks: ClockPlan, trace: Trace, simulator: Simulator, instant: int) -> bool:
    """Whether `simulator`, a session's state before `instant`, is the planned state of `instant`: every later
    step with the planned inputs then repeats the plan."""
    planned = planned_simulator(program, clocks, trace, instant)
    phase = instant % clocks.instants_per_hyperperiod
    return planned is not None and planned.state(phase) == simulator.state(phase)


def plan_off_plan(
    program: Program,
    clocks: ClockPlan,
    trace: Trace,
    schedule: AllocationSchedule,
    capture: CapturePlan,
    steps: Sequence[OffPlanStep],
) -> OffPlanPlan:
    """Trace the declared `steps` (see the module docstring). ValueError for a step that names a region that
    is not an input, that no planned instant can take, or a declaration whose trace passes the program's
    `firings` limit (OffPlanError, a ValueError)."""
    steps = tuple(steps)
    if not steps:
        return OffPlanPlan()
    inputs = sorted(name for name, region in program.regions.items() if region.role == "input")
    for step in steps:
        for name, _ in step.units:
            if name not in inputs:
                raise OffPlanError(
                    f"off-plan step '{step.text()}': '{name}' is not an input region; the inputs are "
                    f"{', '.join(inputs) or 'none'}"
                )
    planned_instants = {tuple(f.signature for f in firings) for firings in trace.by_instant()}
    planned_signatures = {f.signature for f in trace.firings}
    period = clocks.instants_per_hyperperiod
    found: dict[tuple, OffPlanInstant] = {}
    seen: set[tuple] = set()
    taken = refused = traced = 0
    queue: deque[tuple[Simulator, int, bool]] = deque()
    for index in range(len(trace.states)):
        simulator = planned_simulator(program, clocks, trace, index)
        assert simulator is not None, "a traced instant has a planned state"
        queue.append((simulator, index, True))
    while queue:
        simulator, instant, from_plan = queue.popleft()
        moves: list[tuple[dict[str, int], bool]] = []
        if not from_plan:
            key = simulator.state(instant % period)
            if key in seen or back_on_plan(program, clocks, trace, simulator, instant):
                continue
            seen.add(key)
            moves.append(({}, False))
        for step in steps:
            if step.at == "any" or instant == 0:
                moves += [(units, step.last) for units in step.choices()]
        fed = _fed_inputs(simulator, instant)
        for units, last in moves:
            if (units and set(units) != fed) or (not last and any(count == 0 for count in units.values())):
                refused += 1
                continue
            after = simulator.copy()
            try:
                firings = after.run_instant(instant, units or None, last=last)
            except ValueError:
                refused += 1
                continue
            if over_capacity(schedule, firings) is not None:
                refused += 1
                continue
            taken += 1
            traced += len(firings)
            if traced > program.limits.firings:
                raise OffPlanError(
                    f"the declared off-plan steps ({'; '.join(s.text() for s in steps)}) reach more than "
                    f"{program.limits.firings} firings (the `firings` limit) before every session is back on the "
                    "plan: declare fewer unit counts, or take them at the start only"
                )
            signatures = tuple(f.signature for f in firings)
            if signatures not in planned_instants and signatures not in found:
                found[signatures] = OffPlanInstant(
                    instant, dict(simulator.length), tuple(sorted(units.items())), last, tuple(firings), from_plan
                )
            if not last:
                queue.append((after, instant + 1, False))
    if not taken:
        raise OffPlanError(
            f"no planned instant can take the declared off-plan steps ({'; '.join(s.text() for s in steps)}): "
            "each would advance a region by a fraction of a unit, over its capacity, or feed an input the "
            "instant does not read"
        )
    graphs: dict[tuple, int] = {}
    for instant_found in found.values():
        for signature in instant_found.signatures:
            if signature not in planned_signatures and signature not in graphs:
                graphs[signature] = len(capture.graphs) + len(graphs)
    return OffPlanPlan(steps, tuple(found.values()), len(seen), graphs, refused)


def _fed_inputs(simulator: Simulator, instant: int) -> set[str]:
    """The input regions the planned step at `instant` feeds."""
    return {view.region for f in simulator.copy().run_instant(instant) for view in f.views if view.kind == "feed"}
