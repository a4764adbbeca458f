"""`dsl plan` as text: deterministic tables of clocks, stages, warm-up, regions and graphs.

Condensed by default: the members of a family that are alike share one row (`kv[0..7] ×8`), a graph is
one line, firings are ranges (`0..149`). `verbose` lists every member and the views of every graph.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Iterator, Sequence
from fractions import Fraction

import attrs
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from duplexcadence.dsl.messages import duration_text, rate_text, units_text
from duplexcadence.dsl.printer import number_text
from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.samples import OutputSamples, SampleAccount, TickSamples


def human_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def seconds(value: Fraction) -> str:
    if value >= 1:
        return f"{number_text(value) if (value * 1000).denominator == 1 else f'{float(value):.4g}'} s"
    ms = value * 1000
    if ms.denominator == 1 or (ms * 1000).denominator == 1:
        return f"{number_text(ms)} ms"
    return f"{float(ms):.4g} ms"


class _Dashes:
    """The rule under a table's header: as wide as its column, however far rich narrows that."""

    def __init__(self, width: int):
        self.width = width

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, self.width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        yield Text("-" * min(self.width, options.max_width))


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = (), width: int | None = None
) -> list[str]:
    """A table indented by two spaces: the headers, a rule of dashes under each, the rows; the columns in `right`
    aligned right. At its natural width unless `width` (a terminal's) is narrower: then rich wraps the cells so
    that every line fits, between words where it can."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    natural = sum(widths) + 2 * (len(widths) - 1)
    grid = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style=None)
    for i, header in enumerate(cells[0]):
        grid.add_column(Text(header), justify="right" if i in right else "left", overflow="fold")
    grid.add_row(*(_Dashes(w) for w in widths))
    for row in cells[1:]:
        grid.add_row(*map(Text, row))  # as text: `kv[layer]` is no markup
    text = io.StringIO()
    Console(file=text, width=natural if width is None else max(width - 2, 1), color_system=None).print(grid)
    return ["  " + line.rstrip() for line in text.getvalue().splitlines()]


def _params(plan: Plan) -> str:
    def show(value):
        if isinstance(value, list):
            return "[" + ", ".join(show(v) for v in value) + "]"
        return number_text(value) if isinstance(value, Fraction) else str(value)

    return ", ".join(f"{k}={show(v)}" for k, v in sorted(plan.program.params.items()) if "." not in k) or "none"


WIDTH = 100
"""Prose lines (the eager rule, the views of a graph) wrap at this width."""


def plural(count: int, noun: str) -> str:
    """`1 instant`, `25 instants`."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def member_range(members: Sequence[str]) -> str:
    """`kv[0..7]` for members 0 to 7 of a family, `kv[0, 2, 5]` for others; a lone name as it is."""
    if len(members) == 1:
        return members[0]
    family = members[0].partition("[")[0]
    indices = [int(m[len(family) + 1 : -1]) for m in members]
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return f"{family}[{indices[0]}..{indices[-1]}]"
    return f"{family}[{', '.join(map(str, indices))}]"


def family_label(members: Sequence[str]) -> str:
    """`kv[0..7] ×8` for several members, the name for one."""
    return member_range(members) + (f" ×{len(members)}" if len(members) > 1 else "")


def number_ranges(numbers: Sequence[int], limit: int | None = None) -> str:
    """`0..149` for a run of consecutive numbers, runs joined by `, `; past `limit` runs, the first
    `limit` and the count (`0, 2, 4, ... (40 firings)`)."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    texts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}..{b}" for a, b in runs]
    if limit is not None and len(texts) > limit:
        return ", ".join(texts[:limit]) + f", ... ({len(numbers)} firings)"
    return ", ".join(texts)


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def _wrap_parts(parts: Sequence[str], first: str, rest: str) -> list[str]:
    """`parts` joined by `; `, a line broken only between two parts once it would pass WIDTH."""
    lines: list[str] = []
    line, empty = first, True
    for index, part in enumerate(parts):
        piece = part + (";" if index < len(parts) - 1 else "")
        if not empty and len(line) + 1 + len(piece) > WIDTH:
            lines.append(line)
            line, empty = rest, True
        line += piece if empty else " " + piece
        empty = False
    return [*lines, line]


def _family_runs(plan: Plan, rows: Sequence[tuple[str, tuple, list]]) -> list[tuple[list[str], list[list]]]:
    """Rows `(name, key, cells)`, consecutive members of one family with the same key (every cell but
    the name and the offset) grouped: [(member names, their cells)]."""
    groups: list[tuple[list[str], list[list]]] = []
    previous = None
    for name, key, cells in rows:
        family = plan.program.regions[name].family
        if family is not None and previous == (family, key):
            groups[-1][0].append(name)
            groups[-1][1].append(cells)
        else:
            groups.append(([name], [cells]))
        previous = (family, key) if family is not None else None
    return groups


def _views_parts(plan: Plan, signature: tuple) -> list[str]:
    """The time-axis views of one graph's signature, e.g. `tokens 28`, `cache 150 +50 = 200 -> 150`."""
    parts = []
    for part in signature[1:]:
        if part[0] == "advances":  # the counters the firing advances
            parts.append("advances " + ", ".join(part[1:]))
            continue
        region, kind, start, length, _offset, transient, kept = part[:7]
        if plan.program.regions[region].fixed or length is None:
            continue
        start_made = " (start)" if part[7:] == ("initial",) else ""
        if kind == "update":
            parts.append(f"{region} {length} +{transient - length} = {transient} -> {kept}{start_made}")
        elif kind in ("feed", "write"):
            parts.append(f"{region} +{length}{start_made}")
        else:
            parts.append(f"{region} {length}" if start == 0 else f"{region} [{start}:{start + length}]")
    return parts


def _counters(plan: Plan, heading, width: int | None = None) -> list[str]:
    """The counters' section: each counter's clock, step and modulus, how its device scalar reaches the
    stages, and whether its host value is the same at every replay of a steady graph."""
    program = plan.program
    if not program.counters:
        return []
    repeating = plan.repeating_counters
    rows = []
    for counter in program.counters.values():
        region = program.regions[counter.name]
        readers = [s.name for s in program.stages.values() if any(a.region == counter.name for a in s.accesses)]
        device = []
        if region.bind is not None:
            device.append(f'bind {region.bind_object + " " if region.bind_object else ""}"{region.bind}"')
        if readers:
            device.append("read by " + ", ".join(readers))
        repeats = counter.name in repeating
        rows.append(
            [
                counter.name,
                counter.clock,
                f"+{counter.step}",
                "-" if counter.modulo is None else counter.modulo,
                "; ".join(device) or "-",
                "repeats" if repeats else "changes",
            ]
        )
    lines = [heading("Counters (advanced after the last firing of each instant their clock ticks at)")]
    lines += table(
        ["counter", "clock", "step", "mod", "bound or read", "host value per steady replay"], rows, (2, 3), width
    )
    lines += _wrap(
        "hooks get the host value as firing.counters[NAME], a bound attribute that holds a Python int gets it too; "
        "`read` and a bound tensor get the device scalar (0-d i64); a captured graph replays at instants a "
        "hyperperiod apart, so where the host value changes, captured code reads the device scalar",
        "  ",
        "  ",
    )
    return lines + [""]


def _region_groups_text(names: Sequence[str], program) -> list[str]:
    """Region names with the members of a family joined (`other_kv[0..7]`), in the given order."""
    parts: list[str] = []
    groups: dict[str, list[str]] = {}
    for name in names:
        family = program.regions[name].family
        if family is None:
            parts.append(name)
            continue
        if family not in groups:
            groups[family] = []
            parts.append(family)
        groups[family].append(name)
    return [member_range(groups[part]) if part in groups else part for part in parts]


def _pruning_lines(plan: Plan, heading, width: int | None = None) -> list[str]:
    """The stages no output sees: pruned (with the regions left out), or run when pruning is off; and an
    unobserved stage kept anyway. Nothing when every stage is observed."""
    pruning = plan.pruning
    out: list[str] = []
    if pruning.stages:
        out.append(heading("Pruned (no output sees their work; --no-prune runs them)"))
        out += table(["stage", "why"], [[s.name, s.reason] for s in pruning.stages], width=width)
        regions = _region_groups_text([r.name for r in pruning.regions], pruning.source)
        if regions:
            out += _wrap_parts(
                [f"{plural(len(pruning.regions), 'region')} left out (only pruned stages touch them): " + regions[0]]
                + regions[1:],
                "  ",
                "    ",
            )
        out.append("")
    elif pruning.unobserved:
        out.append(heading("Unobserved (no output sees their work; they run: pruning is off)"))
        out += table(["stage", "why"], [[s.name, s.reason] for s in pruning.unobserved], width=width)
        out.append("")
    if pruning.kept:
        out.append(heading("Kept although no output sees them"))
        out += table(["stage", "why"], [[s.name, s.reason] for s in pruning.kept], width=width)
        out.append("")
    return out


def format_plan(
    plan: Plan, verbose: bool = False, color: bool = False, width: int | None = None, memory: Memory | None = None
) -> str:
    """The plan as `dsl plan` prints it: condensed, or with `verbose` every family member and the
    views of every graph; `color` makes the section headings bold; `width` (a terminal's) narrows the
    tables to fit it. The section on conversations is printed for a program with batched stages (`rows N`),
    or with `memory` (the bytes to fit them in)."""
    clocks, trace_, capture = plan.clocks, plan.trace, plan.capture

    def heading(text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if color else text

    out = [heading(f"Plan for {plan.path}"), *_wrap(f"params: {_params(plan)}", "", "  "), ""]

    out.append(heading("Clocks"))
    out += table(
        ["clock", "rate (Hz)", "period"],
        [[n, _rate_cell(plan, n, r), seconds(1 / r)] for n, r in sorted(clocks.rates.items(), key=lambda x: -x[1])],
        right=(1, 2),
        width=width,
    )
    out.append(
        f"  cadence {seconds(clocks.cadence)}; base tick {seconds(clocks.base_tick)}; hyperperiod "
        f"{seconds(clocks.hyperperiod)} = {plural(clocks.instants_per_hyperperiod, 'instant')}"
    )
    out.append("")

    out.append(heading("Stages (dataflow order within an instant)"))
    out += table(
        ["stage", "clock", "per cadence", "per hyperperiod", "calls"],
        [
            [
                t.stage,
                t.clock,
                _up_to(t.burst, t.per_cadence),
                _up_to(t.burst, t.per_hyperperiod),
                f"{plan.program.stages[t.stage].callable_kind} {plan.program.stages[t.stage].target or '(root)'}",
            ]
            for t in clocks.stages.values()
        ],
        right=(2, 3),
        width=width,
    )
    out.append("")

    out += _counters(plan, heading, width)
    out += _pruning_lines(plan, heading, width)

    out.append(heading("Warm-up and steady state"))
    if trace_.periodic:
        warm_time = clocks.instant_time(trace_.warmup_instants) if trace_.warmup_instants else Fraction(0)
        out.append(
            f"  warm-up: {plural(trace_.warmup_instants, 'instant')} ({seconds(warm_time)}) until the state repeats"
        )
        out.append(f"  shapes periodic from instant {trace_.shape_warmup_instants}")
        out.append(
            f"  steady period: {plural(trace_.period_instants, 'instant')} ({seconds(clocks.hyperperiod)}), "
            "repeated forever"
        )
    else:
        out.append(f"  no steady state: {trace_.reason}; traced {plural(trace_.warmup_instants, 'instant')}")
    out.append("")

    out.append(heading("Regions (capacity in units of the region's clock)"))
    rows: list[tuple[str, tuple, list]] = []
    for allocation in plan.arena.allocations:
        if allocation.name.endswith("~double"):
            continue
        region = plan.schedule.regions[allocation.name]
        saving = "-"
        if region.saving_fraction is not None:
            saving = f"{human_bytes(region.saving_bytes)} ({region.saving_fraction:.1%})"
        kind = (
            plan.program.regions[region.name].retention.describe()
            if not plan.program.regions[region.name].fixed
            else "fixed"
        )
        cells = [
            region.dtype,
            "x".join(map(str, region.shape)) if region.shape else "scalar",
            kind,
            "-" if region.capacity is None else region.capacity,
            human_bytes(region.bytes),
            ("" if region.persistent else "scratch@") + str(allocation.offset),
            human_bytes(region.double_buffer_bytes) if region.double_buffer_bytes else "-",
            human_bytes(region.stock_bytes),
            saving,
        ]
        key = (region.persistent, *(str(c) for i, c in enumerate(cells) if i != 5))
        rows.append((region.name, key, [region.name, *cells]))
    grouped = [([name], [row]) for name, _, row in rows] if verbose else _family_runs(plan, rows)
    table_rows = []
    for names, members in grouped:
        first, last = members[0], members[-1]
        offset = first[6] if len(members) == 1 else f"{first[6]}..{str(last[6]).removeprefix('scratch@')}"
        table_rows.append([family_label(names), *first[1:6], offset, *first[7:]])
    out += table(
        ["region", "dtype", "shape", "retention", "capacity", "bytes", "offset", "double buf", "stock", "saving"],
        table_rows,
        right=(4, 5, 6, 7, 8),
        width=width,
    )
    if any(len(names) > 1 for names, _ in grouped):
        out += _wrap(
            "a row `name[i..j] ×n` stands for n family members alike: bytes, stock and saving are each "
            "member's; offset is the first's..the last's",
            "  ",
            "  ",
        )
    schedule = plan.schedule
    out.append(
        f"  per session: {human_bytes(plan.arena.session_bytes)} pinned; shared scratch "
        f"{human_bytes(plan.arena.scratch_bytes)} (one copy per lane); arena for 1 session "
        f"{human_bytes(plan.arena.total_bytes(1))}"
    )
    out += _wrap(
        f"reserved on a GPU: {human_bytes(plan.arena.reserved_bytes(1))} for 1 session (the arena's one "
        f"allocation as PyTorch's caching allocator rounds it), each further session "
        f"{human_bytes(plan.arena.session_bytes)} and lane {human_bytes(plan.arena.scratch_bytes)}; each lane's "
        "graphs reserve a memory pool besides (the model's working memory, measured at load: runtime.report())",
        "  ",
        "    ",
    )
    if schedule.stock_bytes:
        saved = schedule.stock_bytes - schedule.compared_demand_bytes
        out.append(
            f"  regions with a stock allocation: stock {human_bytes(schedule.stock_bytes)}, demand "
            f"{human_bytes(schedule.compared_demand_bytes)}, saving {human_bytes(saved)} "
            f"({saved / schedule.stock_bytes:.1%})"
        )
    out.append("")

    out.append(heading("Capture plan (one graph per stage and exact-shape signature)"))
    graph_rows = [
        [
            graph.key,
            graph.stage,
            "steady" if graph.steady else "warm-up",
            "yes" if graph.captured else "no (eager)",
            number_ranges(graph.firings, None if verbose else 4),
        ]
        for graph in capture.graphs
    ]
    out += table(["graph", "stage", "used in", "captured", "stage firings"], graph_rows, right=(0,), width=width)
    if verbose:
        out.append("  views of each graph (units of the region's clock; update: held +advance = in flight -> kept):")
        for graph in capture.graphs:
            parts = _views_parts(plan, graph.signature) or ["fixed shapes only"]
            out += _wrap_parts(parts, f"    {graph.key} {graph.stage}: ", "        ")
    budget = "no budget" if capture.max_graphs is None else f"budget {capture.max_graphs}"
    out.append(
        f"  {len(capture.captured)} of {plural(len(capture.graphs), 'graph')} captured ({budget}); eager firings "
        f"in warm-up + one period: {capture.eager_firings}"
    )
    out += _wrap(capture.eager_rule, "  rule: ", "        ")
    out.append("")

    if memory is not None or plan.conversations.batched:
        out += conversations_section(plan, memory, heading)
    out += _off_plan_section(plan, verbose, heading)
    out += _samples_section(plan.samples, clocks.hyperperiod, verbose, heading, width)
    if not verbose:
        out.append("  dsl plan --verbose: every family member, the views of every graph, the units of every firing")
    return "\n".join(out) + "\n"


def _off_plan_section(plan: Plan, verbose: bool, heading) -> list[str]:
    """The declared off-plan steps and the instants they lead to (interpreter/plans/off_plan.py); nothing
    when none are declared."""
    off = plan.off_plan
    if not off.declared:
        return []
    keys = {g.signature: g.key for g in plan.capture.graphs if g.captured} | off.graphs
    out = [heading("Off-plan instants (declared steps, captured like planned instants)")]
    out += _wrap_parts([step.text() for step in off.steps], "  declared: ", "            ")
    groups: dict[tuple, list] = {}
    for found in off.instants:
        kind = "finish" if found.last else ("step" if found.units else "planned inputs")
        groups.setdefault((kind, found.from_plan), []).append(found)
    rows = []
    for (kind, from_plan), members in groups.items():
        counts: dict[str, set[int]] = {}
        for found in members:
            for name, count in found.units:
                counts.setdefault(name, set()).add(count)
        units = ", ".join(f"{name} {number_ranges(sorted(values))}" for name, values in sorted(counts.items()))
        rows.append(
            [
                kind,
                "the plan" if from_plan else "off the plan",
                len(members),
                units or "as planned",
                number_ranges(sorted({found.instant for found in members})),
            ]
        )
    out += table(["instant", "starts from", "instants", "units", "at instants"], rows, right=(2,))
    if verbose:
        out.append("  every off-plan instant and the graph of each of its firings:")
        for found in off.instants:
            graphs = ", ".join(f"{f.stage} {keys.get(f.signature, 'eager')}" for f in found.firings)
            out += _wrap(f"{found.describe()}: {graphs}", "    ", "        ")
    out += _wrap(
        f"{plural(len(off.instants), 'instant')} off the plan ({plural(off.states, 'state')} off the plan "
        f"reached); {plural(len(off.graphs), 'stage graph')} more than the capture plan's; "
        f"{off.refused} declared steps the runtime would refuse where they were tried",
        "  ",
        "  ",
    )
    out += _wrap(
        "each off-plan instant is captured as a planned one is, per session slot, and a session that takes only "
        "declared steps fires nothing eagerly; an undeclared step runs eagerly",
        "  ",
        "  ",
    )
    out.append("")
    return out


# --- the duplex unit: bounded clocks, conversations -----------------------------------------------


@attrs.frozen
class Memory:
    """Bytes to fit conversations in, and where the number comes from (`--memory 80GiB`, a device)."""

    bytes: int
    source: str


def _up_to(burst: int | None, count: Fraction | int) -> str:
    """A firing count, `up to N` times as many for a stage on a bounded clock."""
    return f"up to {number_text(burst * Fraction(count))}" if burst is not None else number_text(Fraction(count))


def _rate_cell(plan: Plan, name: str, rate: Fraction) -> str:
    clock = plan.program.clocks.get(name)
    if clock is not None and clock.bound is not None:
        return f"up to {clock.bound} per {clock.per}"
    return number_text(rate)


def conversations_section(plan: Plan, memory: Memory | None, heading) -> list[str]:
    """Each conversation's bytes by region, the graphs of the batched stages per row count, and how many
    conversations fit in `memory`."""
    conversations = plan.conversations
    out = [heading("Conversations (each conversation's own state; graphs of the stages batched over rows)")]
    rows = [
        [
            r.name,
            r.retention + (", a row each" if r.batched else ""),
            "-" if r.capacity is None else r.capacity,
            human_bytes(r.bytes),
        ]
        for r in conversations.regions
    ]
    out += table(["region", "retention", "capacity", "bytes"], rows, right=(2, 3))
    out += _wrap(
        f"per conversation: {human_bytes(conversations.bytes_per_conversation)} (its session block, and its row of "
        f"the batched stages' scratch); shared: {human_bytes(conversations.shared_bytes)} of scratch, one per lane",
        "  ",
        "  ",
    )
    if conversations.batched:
        parts = [
            f"{g.stage} (graph {g.key}{f', up to {g.burst} replays an instant' if g.burst else ''}) at rows 1..{g.rows}"
            for g in conversations.batched
        ]
        out += _wrap_parts(
            [f"batched graphs, {conversations.batched_graph_count} in all: {parts[0]}", *parts[1:]], "  ", "    "
        )
    if conversations.per_conversation_graphs:
        keys = ", ".join(str(key) for key in conversations.per_conversation_graphs)
        out.append(f"  graphs captured for each conversation's slot: {keys}")
    if memory is not None:
        fit = conversations.fits(memory.bytes)
        said = "any number (a conversation holds no device bytes)" if fit is None else str(fit)
        out.append(f"  conversations that fit in {human_bytes(memory.bytes)} ({memory.source}): {said}")
    out.append("")
    return out


def _output_notes(o: OutputSamples, session: Fraction, hyperperiod: Fraction) -> list[str]:
    """What tells an output's units apart: losses at boundaries, units held back, units unaccounted for."""
    at = f"at {rate_text(o.rate)}"
    notes = []
    if o.dropped:
        mark = f"`loses {o.loss}` intended" if o.loss_intended else "boundary-loss"
        notes.append(
            f"{o.region}: {units_text(o.loss, o.clock)} ({duration_text(Fraction(o.loss) / o.rate)} {at}) lost at each "
            f"of {o.boundaries} boundaries, {units_text(o.dropped, o.clock)} ({duration_text(o.dropped / o.rate)}) "
            f"in all ({mark})"
        )
    elif not o.unaccounted:
        notes.append(
            f"{o.region}: total = offline: the stream emits every unit one offline call over the same input would"
        )
    if o.whole_loss:
        notes.append(
            f"{o.region}: one offline call loses {units_text(o.whole_loss, o.clock)} too: "
            f"{o.input_units} {o.input} x {number_text(o.ratio)} - {o.whole_loss} = {o.offline}"
        )
    if o.held_back:
        notes.append(
            f"{o.region}: up to {units_text(o.held_back, o.clock)} ({duration_text(o.held_back / o.rate)}) held back "
            "while streaming, released by the end of the stream"
        )
    if o.unaccounted:
        why = (
            f"the session is not a whole number of hyperperiods ({seconds(hyperperiod)}), and the input's units "
            "per firing agree with the writes only over whole ones"
            if (session / hyperperiod).denominator != 1
            else "the writes do not add up to what the input is worth: check their advances"
        )
        notes.append(
            f"{o.region}: {units_text(abs(o.unaccounted), o.clock)} {'fewer' if o.unaccounted > 0 else 'more'} "
            f"than the input's units times {number_text(o.ratio)}, with no declared loss: {why}"
        )
    return notes


def _tick_rows(o: OutputSamples) -> list[list[object]]:
    """The firings of the warm-up and one steady period, alike neighbours in one row, then the last."""
    rows: list[list[object]] = []
    runs: list[list[TickSamples]] = []
    for tick in o.ticks:
        if runs and runs[-1][-1].values() == tick.values():
            runs[-1].append(tick)
        else:
            runs.append([tick])
    for run in runs:
        first = run[0]
        rows.append([number_ranges([t.firing for t in run]), seconds(first.time), *first.values()])
    last = o.last
    rows.append([f"{last.firing} (last)", seconds(last.time), *last.values()])
    return rows


def _samples_section(
    account: SampleAccount, hyperperiod: Fraction, verbose: bool, heading, width: int | None = None
) -> list[str]:
    out = [
        heading(
            f"Samples over {seconds(account.seconds)} ({plural(account.instants, 'instant')}"
            f"{', then the end of the stream' if account.flush else ''}; units of each output's clock)"
        )
    ]
    if account.outputs:
        out += table(
            ["output", "clock", "input", "firings", "emitted", "flushed", "dropped", "total", "offline", "short"],
            [
                [
                    o.region,
                    o.clock,
                    f"{o.input_units} {o.input} x{number_text(o.ratio)}",
                    o.firings,
                    o.emitted,
                    o.flushed,
                    o.dropped,
                    o.total,
                    o.offline,
                    o.short,
                ]
                for o in account.outputs.values()
            ],
            right=(3, 4, 5, 6, 7, 8, 9),
            width=width,
        )
    for o in account.outputs.values():
        for note in _output_notes(o, account.seconds, hyperperiod):
            out += _wrap(note, "  ", "      ")
    for name, why in account.skipped.items():
        out += _wrap(f"{name}: not accounted: {why}", "  ", "      ")
    if account.clamped:
        out += _wrap(f"session shortened: {account.clamped}", "  ", "      ")
    if account.unflushed:
        out += _wrap(f"not flushed: {account.unflushed}", "  ", "      ")
    if verbose:
        for o in account.outputs.values():
            out.append(f"  {o.region} per firing of '{o.stage}' (warm-up, one steady period that repeats, the last):")
            out += [
                "  " + line
                for line in table(
                    ["firings", "time", "input", "emitted", "held back", "dropped"],
                    _tick_rows(o),
                    (2, 3, 4, 5),
                    None if width is None else width - 2,
                )
            ]
    return out
