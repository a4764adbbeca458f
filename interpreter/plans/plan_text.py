"""`dsl plan` as text: deterministic tables of clocks, stages, warm-up, regions and graphs."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from duplexcadence.dsl.printer import number_text
from duplexcadence.interpreter.plans.plan import Plan


def human_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def seconds(value: Fraction) -> str:
    if value >= 1:
        return f"{number_text(value) if (value * 1000).denominator == 1 else f'{float(value):.4g}'} s"
    ms = value * 1000
    if ms.denominator == 1 or (ms * 1000).denominator == 1:
        return f"{number_text(ms)} ms"
    return f"{float(ms):.4g} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> list[str]:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row):
        return "  " + "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return [line(cells[0]).rstrip(), "  " + "  ".join("-" * w for w in widths)] + [line(r).rstrip() for r in cells[1:]]


def _params(plan: Plan) -> str:
    def show(value):
        if isinstance(value, list):
            return "[" + ", ".join(show(v) for v in value) + "]"
        return number_text(value) if isinstance(value, Fraction) else str(value)

    return ", ".join(f"{k}={show(v)}" for k, v in sorted(plan.program.params.items()) if "." not in k) or "none"


def _views_text(plan: Plan, signature: tuple) -> str:
    """The time-axis views of one graph's signature, e.g. `tokens 28; cache 150 +50 = 200 -> 150`."""
    parts = []
    for region, kind, start, length, offset, transient, kept in signature[1:]:
        if plan.program.regions[region].fixed or length is None:
            continue
        if kind == "update":
            parts.append(f"{region} {length} +{transient - length} = {transient} -> {kept}")
        elif kind in ("feed", "write"):
            parts.append(f"{region} +{length}")
        else:
            parts.append(f"{region} {length}" if start == 0 else f"{region} [{start}:{start + length}]")
    return "; ".join(parts) or "fixed shapes only"


def format_plan(plan: Plan) -> str:
    clocks, trace_, capture = plan.clocks, plan.trace, plan.capture
    out = [f"Plan for {plan.path}", f"params: {_params(plan)}", ""]

    out.append("Clocks")
    out += table(
        ["clock", "rate (Hz)", "period"],
        [[n, number_text(r), seconds(1 / r)] for n, r in sorted(clocks.rates.items(), key=lambda x: -x[1])],
        right=(1, 2),
    )
    out.append(
        f"  cadence {seconds(clocks.cadence)}; base tick {seconds(clocks.base_tick)}; hyperperiod "
        f"{seconds(clocks.hyperperiod)} = {clocks.instants_per_hyperperiod} instants"
    )
    out.append("")

    out.append("Stages (dataflow order within an instant)")
    out += table(
        ["stage", "clock", "per cadence", "per hyperperiod", "calls"],
        [
            [
                t.stage,
                t.clock,
                number_text(t.per_cadence),
                t.per_hyperperiod,
                f"{plan.program.stages[t.stage].callable_kind} {plan.program.stages[t.stage].target or '(root)'}",
            ]
            for t in clocks.stages.values()
        ],
        right=(2, 3),
    )
    out.append("")

    out.append("Warm-up and steady state")
    if trace_.periodic:
        warm_time = clocks.instant_time(trace_.warmup_instants) if trace_.warmup_instants else Fraction(0)
        out.append(f"  warm-up: {trace_.warmup_instants} instants ({seconds(warm_time)}) until the state repeats")
        out.append(f"  shapes periodic from instant {trace_.shape_warmup_instants}")
        out.append(
            f"  steady period: {trace_.period_instants} instants ({seconds(clocks.hyperperiod)}), repeated forever"
        )
    else:
        out.append(f"  no steady state: {trace_.reason}; traced {trace_.warmup_instants} instants")
    out.append("")

    out.append("Regions (capacity in units of the region's clock)")
    rows = []
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
        rows.append(
            [
                region.name,
                region.dtype,
                "x".join(map(str, region.shape)),
                kind,
                "-" if region.capacity is None else region.capacity,
                human_bytes(region.bytes),
                ("" if region.persistent else "scratch@") + str(allocation.offset),
                human_bytes(region.double_buffer_bytes) if region.double_buffer_bytes else "-",
                human_bytes(region.stock_bytes),
                saving,
            ]
        )
    out += table(
        ["region", "dtype", "shape", "retention", "capacity", "bytes", "offset", "double buf", "stock", "saving"],
        rows,
        right=(4, 5, 6, 7, 8),
    )
    schedule = plan.schedule
    out.append(
        f"  per session: {human_bytes(plan.arena.session_bytes)} pinned; shared scratch "
        f"{human_bytes(plan.arena.scratch_bytes)} (one copy per lane); arena for 1 session "
        f"{human_bytes(plan.arena.total_bytes(1))}"
    )
    if schedule.stock_bytes:
        saved = schedule.stock_bytes - schedule.compared_demand_bytes
        out.append(
            f"  regions with a stock allocation: stock {human_bytes(schedule.stock_bytes)}, demand "
            f"{human_bytes(schedule.compared_demand_bytes)}, saving {human_bytes(saved)} "
            f"({saved / schedule.stock_bytes:.1%})"
        )
    out.append("")

    out.append("Capture plan (one graph per stage and exact-shape signature)")
    rows = []
    for graph in capture.graphs:
        firings = graph.firings
        shown = ", ".join(map(str, firings[:6])) + (f", ... ({len(firings)} firings)" if len(firings) > 6 else "")
        rows.append(
            [
                graph.key,
                graph.stage,
                "steady" if graph.steady else "warm-up",
                "yes" if graph.captured else "no (eager)",
                shown,
            ]
        )
    out += table(["graph", "stage", "used in", "captured", "stage firings"], rows, right=(0,))
    out.append("  views of each graph (units of the region's clock; update: held +advance = in flight -> kept):")
    for graph in capture.graphs:
        out.append(f"    {graph.key} {graph.stage}: {_views_text(plan, graph.signature)}")
    budget = "no budget" if capture.max_graphs is None else f"budget {capture.max_graphs}"
    out.append(
        f"  {len(capture.captured)} graphs captured of {len(capture.graphs)} ({budget}); eager firings in "
        f"warm-up + one period: {capture.eager_firings}"
    )
    out.append(f"  rule: {capture.eager_rule}")
    return "\n".join(out) + "\n"
