"""What the language server knows about one open `.clock` text: its diagnostics (the front end's, as
`dsl check` prints them), its plan (when it checks and declares a stage), and where every name is
declared, across its `use` imports. Pure: no protocol, no torch.

Positions here are the front end's: 1-based lines and columns, end exclusive.
"""

from __future__ import annotations

import re
from fractions import Fraction

import attrs

from duplexcadence.dsl import syntax
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.frontend import CheckResult, check_file
from duplexcadence.dsl.parse import parse_module
from duplexcadence.dsl.printer import number_text
from duplexcadence.dsl.program import ClockInfo, Program
from duplexcadence.dsl.source import Span
from duplexcadence.interpreter.plans.plan import Plan, make_plan
from duplexcadence.interpreter.plans.plan_text import human_bytes, seconds

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@attrs.frozen
class Definition:
    name: str
    kind: str  # "param", "clock", "region", "stage", "counter", "object"
    span: Span


@attrs.frozen
class Analysis:
    path: str
    text: str
    result: CheckResult = attrs.field(repr=False)
    plan: Plan | None = attrs.field(repr=False)
    plan_problem: str | None
    definitions: dict[str, Definition]

    @property
    def diagnostics(self) -> tuple[Diagnostic, ...]:
        return self.result.diagnostics

    @property
    def program(self) -> Program | None:
        return self.result.program


def _declarations(module: syntax.Module, path: str) -> dict[str, Definition]:
    found: dict[str, Definition] = {}
    for statement in module.statements:
        match statement:
            case syntax.Param():
                kind = "param"
            case syntax.Clock():
                kind = "clock"
            case syntax.Region():
                kind = "region"
            case syntax.Stage():
                kind = "stage"
            case syntax.Counter():
                kind = "counter"
            case syntax.Object():
                kind = "object"
            case _:
                continue
        span = getattr(statement, "name_span", None) or statement.span
        if span is not None:
            found.setdefault(statement.name, Definition(statement.name, kind, span))
    return found


def analyse(path: str, text: str) -> Analysis:
    result = check_file(path, text=text)
    definitions: dict[str, Definition] = {}
    for source_path, source in result.sources.items():
        try:
            module = parse_module(source)
        except ClockError:
            continue
        for name, definition in _declarations(module, source_path).items():
            if source_path == path or name not in definitions:
                definitions[name] = definition
    plan, problem = None, None
    if result.program is not None and result.program.stages:
        try:
            plan = make_plan(result.program)
        except ClockError as error:
            problem = "; ".join(d.message for d in error.diagnostics)
    return Analysis(path, text, result, plan, problem, definitions)


def word_at(text: str, line: int, column: int) -> str | None:
    """The name under 1-based (line, column), or None."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    for match in _WORD.finditer(lines[line - 1]):
        if match.start() < column <= match.end() + 1:
            return match.group(0)
    return None


def definition_of(analysis: Analysis, name: str) -> Definition | None:
    return analysis.definitions.get(name)


# --- hover ---------------------------------------------------------------------------------------


def _rate(value: Fraction) -> str:
    return f"{number_text(value)} Hz"


def _clock_rate(clock: ClockInfo) -> str:
    """`50 Hz`, or `up to 21 per unit` for a bounded clock."""
    return f"up to {clock.bound} per {clock.per}" if clock.bound is not None else _rate(clock.rate)


def _members(program: Program, name: str) -> tuple[str, ...]:
    if name in program.families:
        return program.families[name]
    return (name,) if name in program.regions else ()


def _region_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    members = _members(program, name)
    if not members:
        return None
    region = program.regions[members[0]]
    shape = ", ".join("time" if d is None else str(d) for d in region.shape)
    title = f"region {name}" + (f" ({len(members)} members, {members[0]} shown)" if len(members) > 1 else "")
    lines = [f"**{title}**: {region.dtype}[{shape}]"]
    if region.clock is not None:
        lines.append(f"- clock `{region.clock}` at {_clock_rate(program.clocks[region.clock])}")
    if program.run_time_length(members[0]):
        lines.append("- its length is decided at run time: handed whole, at its capacity")
    lines.append(
        f"- retain {region.retention.describe()}, start {region.start}"
        + (f" {region.start_length}" if region.start == "given" and region.start_length else "")
    )
    if region.role != "state":
        lines.append(f"- {region.role} of `step()`")
    if region.bind:
        lines.append(f"- bind `{region.bind}`")
    plan = analysis.plan
    if plan is not None:
        planned = [plan.schedule.regions[m] for m in members if m in plan.schedule.regions]
        pruned = plan.pruning.reason_for(members[0])
        if pruned is not None and not planned:
            lines.append(f"- pruned: {pruned}; no bytes (`dsl plan --no-prune` keeps it)")
        if planned:
            first = planned[0]
            capacity = "" if first.capacity is None else f"capacity {first.capacity} units, "
            total = sum(p.bytes for p in planned)
            each = f"{human_bytes(first.bytes)}" + (f" each, {human_bytes(total)} in all" if len(planned) > 1 else "")
            lines.append(f"- plan: {capacity}shape [{', '.join(map(str, first.shape))}], {each}")
            stock = [p.stock_bytes for p in planned if p.stock_bytes is not None]
            if len(stock) == len(planned):
                saved = sum(stock) - total
                lines.append(
                    f"- stock: {human_bytes(sum(stock))} ({human_bytes(saved)} saved)"
                    if saved >= 0
                    else f"- stock: {human_bytes(sum(stock))}"
                )
    elif analysis.plan_problem:
        lines.append(f"- no plan: {analysis.plan_problem}")
    return "\n".join(lines)


def _clock_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    clock = program.clocks.get(name)
    if clock is None:
        return None
    stages = [s.name for s in program.stages.values() if s.clock == name]
    if clock.bound is not None:
        lines = [
            f"**clock {name}**: up to {clock.bound} ticks at each tick of `{clock.per}` "
            f"({_rate(clock.rate)}), the count decided at run time"
        ]
    else:
        lines = [f"**clock {name}**: {_rate(clock.rate)}, one tick every {seconds(clock.period)}"]
    if stages:
        lines.append(f"- stages on it: {', '.join(stages)}")
    return "\n".join(lines)


def _stage_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    stage = program.stages.get(name)
    if stage is None:
        return None
    lines = [
        f"**stage {name}** on `{stage.clock}` ({_clock_rate(program.clocks[stage.clock])}): "
        f"{stage.callable_kind} `{stage.target}`"
    ]
    if stage.rows is not None:
        lines.append(f"- batched: runs on 1 to {stage.rows} conversations at once, a graph per row count")
    plan = analysis.plan
    pruned = None if plan is None else plan.pruning.reason_for(name)
    if plan is not None and pruned is not None:
        lines.append(f"- pruned: {pruned}; it never fires (`dsl plan --no-prune` keeps it)")
    elif plan is not None:
        timing = plan.clocks.stages[name]
        if timing.burst is not None:
            lines.append(
                f"- fires up to {timing.burst} times at each of its instants, the count decided at run time "
                f"({number_text(timing.per_cadence)} per cadence of {seconds(plan.clocks.cadence)})"
            )
        else:
            lines.append(
                f"- fires {number_text(timing.per_cadence)} times per cadence ({seconds(plan.clocks.cadence)}), "
                f"{timing.per_hyperperiod} per hyperperiod ({seconds(plan.clocks.hyperperiod)})"
            )
        graphs = [g for g in plan.capture.graphs if g.stage == name]
        steady = sum(1 for g in graphs if g.steady)
        captured = sum(1 for g in graphs if g.captured)
        lines.append(f"- graphs: {len(graphs)} ({steady} steady, {captured} captured)")
    elif analysis.plan_problem:
        lines.append(f"- no plan: {analysis.plan_problem}")
    return "\n".join(lines)


def _param_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    if name not in program.params:
        return None
    value = program.params[name]
    text = (
        "[" + ", ".join(number_text(Fraction(v)) if isinstance(v, (int, Fraction)) else str(v) for v in value) + "]"
        if isinstance(value, list)
        else number_text(Fraction(value))
        if isinstance(value, (int, Fraction))
        else str(value)
    )
    return f"**param {name}** = {text}"


def _counter_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    counter = program.counters.get(name)
    if counter is None:
        return None
    modulo = f" mod {counter.modulo}" if counter.modulo is not None else ""
    lines = [f"**counter {name}**: +{counter.step}{modulo} per tick of `{counter.clock}`"]
    lines.append("- hooks: `firing.counters['" + name + "']` (a Python int); stages: a 0-d i64 device scalar")
    region = program.regions[name]
    if region.bind:
        owner = f"object `{region.bind_object}`, " if region.bind_object else ""
        lines.append(f"- bind {owner}`{region.bind}`")
    return "\n".join(lines)


def _object_hover(analysis: Analysis, program: Program, name: str) -> str | None:
    info = program.objects.get(name)
    if info is None:
        return None
    made = f"made by hook `{info.factory}` per session" if info.factory else "given at load (`objects=`)"
    bound = sorted(r.name for r in program.regions.values() if r.bind_object == name)
    stages = sorted(s.name for s in program.stages.values() if any(p.object == name for p in s.passes))
    lines = [f"**object {name}**: caller-owned, {made}"]
    if bound:
        lines.append(f"- regions bound into it: {', '.join(bound)}")
    if stages:
        lines.append(f"- passed by: {', '.join(stages)}")
    return "\n".join(lines)


def hover_text(analysis: Analysis, name: str) -> str | None:
    """Markdown for the name: a region's plan numbers, a clock's rate, a stage's firings and graphs, a
    param's value. None when the program does not check (the diagnostics say why) or the name is unknown."""
    program = analysis.program
    if program is None:
        return None
    for describe in (_counter_hover, _object_hover, _region_hover, _stage_hover, _clock_hover, _param_hover):
        text = describe(analysis, program, name)
        if text is not None:
            return text
    return None
