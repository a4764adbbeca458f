"""The plan driver: a checked program -> pruning -> clocks -> shape trace -> allocation schedule ->
arena -> capture plan -> sample accounting -> conversations (-> the declared off-plan instants), composed in that order. Each pass is a pure function of
what came before; the result is one frozen `Plan`, printable (`dsl plan`) and JSON-serialisable (`dsl plan --json`).

`Plan.program` is the program the passes planned: the checked one without the stages the pruning left
out and the regions only they touch (`Plan.pruning`, with the checked program as `pruning.source`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import attrs

from duplexcadence.dsl import bounds, messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.limits import Limits
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.allocation import AllocationSchedule, schedule_allocations
from duplexcadence.interpreter.plans.arena import ArenaPlan, plan_arena
from duplexcadence.interpreter.plans.capture import CapturePlan, plan_capture
from duplexcadence.interpreter.plans.clocks import ClockPlan, plan_clocks
from duplexcadence.interpreter.plans.conversations import ConversationPlan, plan_conversations
from duplexcadence.interpreter.plans.off_plan import OffPlanPlan, OffPlanStep, plan_off_plan
from duplexcadence.interpreter.plans.prune import Pruning, prune_unobserved
from duplexcadence.interpreter.plans.samples import SampleAccount, TickSamples, account_samples
from duplexcadence.interpreter.plans.trace import Trace, repeating_counters, trace_shapes

PLAN_SCHEMA_VERSION = 1


@attrs.frozen
class Plan:
    program: Program = attrs.field(repr=False)
    clocks: ClockPlan
    trace: Trace = attrs.field(repr=False)
    schedule: AllocationSchedule
    arena: ArenaPlan
    capture: CapturePlan
    pruning: Pruning
    samples: SampleAccount
    conversations: ConversationPlan
    off_plan: OffPlanPlan = attrs.field(factory=OffPlanPlan)
    """The declared off-plan steps and the instants they lead to (off_plan.py); empty when none are declared."""

    @property
    def path(self) -> str:
        return self.program.path

    @property
    def repeating_counters(self) -> frozenset[str]:
        """The counters whose host value is the same at every replay of a graph (trace.repeating_counters)."""
        return repeating_counters(self.program, self.clocks)


def make_plan(
    program: Program,
    max_graphs: int | None = None,
    max_arena_bytes: int | None = None,
    sessions: int = 1,
    limits: Limits | Mapping[str, int] | None = None,
    prune: bool = True,
    seconds: Fraction | None = None,
    off_plan: Sequence[OffPlanStep] = (),
) -> Plan:
    """Run every pass under the program's limits (or `limits`, a `Limits` or a mapping that raises
    some of the defaults); raises ClockError when the plan would pass one (checked before the pass
    that would cost it), or when the arena exceeds `max_arena_bytes` (over-budget), and ValueError for
    a `seconds` the sample accounting refuses (default: a 60 s session) or `off_plan` steps it cannot
    take. `prune`: leave out the stages no output sees (interpreter/plans/prune.py). `off_plan`: the
    steps off the plan a session may take (interpreter/plans/off_plan.py)."""
    if limits is not None:
        program = attrs.evolve(program, limits=Limits.of(limits))
    pruning = prune_unobserved(program, prune)
    program = pruning.program
    problems = bounds.check(program)
    if problems:
        raise ClockError(problems)
    clock_plan = plan_clocks(program)
    shape_trace = trace_shapes(program, clock_plan)
    allocation = schedule_allocations(program, shape_trace, clock_plan.stage_order)
    arena = plan_arena(allocation)
    if arena.total_bytes(1) > program.limits.bytes:
        largest = max(sorted(allocation.regions), key=lambda name: allocation.regions[name].bytes)
        raise ClockError(
            [
                messages.arena_too_large(
                    arena.total_bytes(1),
                    largest,
                    allocation.regions[largest].bytes,
                    program.limits.bytes,
                    False,
                    program.regions[largest].span,
                )
            ]
        )
    if max_arena_bytes is not None and arena.total_bytes(sessions) > max_arena_bytes:
        largest_region = max(allocation.regions.values(), key=lambda r: r.bytes)
        span = program.regions[largest_region.name].span
        raise ClockError([messages.over_arena_budget(arena.total_bytes(sessions), max_arena_bytes, span)])
    capture = plan_capture(shape_trace, max_graphs)
    samples = account_samples(program, clock_plan, shape_trace, seconds)
    conversations = plan_conversations(program, allocation, arena, capture)
    off = plan_off_plan(program, clock_plan, shape_trace, allocation, capture, off_plan)
    return Plan(program, clock_plan, shape_trace, allocation, arena, capture, pruning, samples, conversations, off)


def plan_file(
    path: str | Path,
    params: Mapping[str, str] | None = None,
    limits: Limits | Mapping[str, int] | None = None,
    **options,
) -> Plan:
    return make_plan(load_program(path, params, limits=limits), **options)


def conversation_plan(
    path: str | Path, params: Mapping[str, str] | None = None, limits: Limits | Mapping[str, int] | None = None
) -> ConversationPlan:
    """What a conversation engine reads from a `.clock` file (no torch): each conversation's bytes by region,
    the batched stages' graphs per row count, and `fits(memory_bytes)` (interpreter/plans/conversations.py).
    `params` as `--param` takes them, `{"llm_layers": "2"}`; a stdlib module's path is
    `duplexcadence.dsl.loader.stdlib_path("models.minicpmo45_duplex")`."""
    return plan_file(path, params, limits).conversations


# --- JSON ---------------------------------------------------------------------------------------


def _rational(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _param_json(value):
    if isinstance(value, list):
        return [_param_json(v) for v in value]
    if isinstance(value, Fraction):
        return _rational(value)
    return value


def to_json(plan: Plan) -> dict:
    """The plan as plain JSON data (schema: docs/plan-json.md). Deterministic: sorted, exact rationals
    as "n/d" strings."""
    program = plan.program
    clocks = plan.clocks
    return {
        "schema": PLAN_SCHEMA_VERSION,
        "file": str(program.path),
        "params": {k: _param_json(v) for k, v in sorted(program.params.items())},
        "clocks": {
            "cadence_s": _rational(clocks.cadence),
            "base_tick_s": _rational(clocks.base_tick),
            "hyperperiod_s": _rational(clocks.hyperperiod),
            "instants_per_hyperperiod": clocks.instants_per_hyperperiod,
            "rates_hz": {name: _rational(rate) for name, rate in sorted(clocks.rates.items())},
            "bounds": {
                name: {"up_to": clock.bound, "per": clock.per}
                for name, clock in sorted(program.clocks.items())
                if clock.bound is not None
            },
            "stage_order": list(clocks.stage_order),
            "stages": {
                name: {
                    "clock": t.clock,
                    "rate_hz": _rational(t.rate),
                    "per_cadence": _rational(t.per_cadence),
                    "per_hyperperiod": t.per_hyperperiod,
                    "burst": t.burst,
                }
                for name, t in clocks.stages.items()
            },
        },
        "trace": {
            "periodic": plan.trace.periodic,
            "reason": plan.trace.reason,
            "warmup_instants": plan.trace.warmup_instants,
            "shape_warmup_instants": plan.trace.shape_warmup_instants,
            "period_instants": plan.trace.period_instants,
            "firings": [
                {
                    "instant": f.instant,
                    "time_s": _rational(f.time),
                    "stage": f.stage,
                    "count": f.count,
                    "views": [
                        {
                            "region": v.region,
                            "kind": v.kind,
                            "start": v.start,
                            "length": v.length,
                            "shape": list(v.shape) if v.shape is not None else None,
                            "transient": v.transient,
                            "kept": v.kept,
                            "moved": v.moved,
                            "double_buffer": v.overlap,
                            "initial": v.initial,
                        }
                        for v in f.views
                    ],
                    "advances": list(f.advances),
                }
                for f in plan.trace.firings
            ],
        },
        "counters": {
            name: {
                "clock": c.clock,
                "step": c.step,
                "modulo": c.modulo,
                "bind": program.regions[name].bind,
                "bind_object": program.regions[name].bind_object,
            }
            for name, c in sorted(program.counters.items())
        },
        "regions": {
            name: {
                "family": r.family,
                "dtype": r.dtype,
                "capacity": r.capacity,
                "shape": list(r.shape),
                "bytes": r.bytes,
                "persistent": r.persistent,
                "kept": r.kept,
                "double_buffer_bytes": r.double_buffer_bytes,
                "stock_shape": list(r.stock_shape) if r.stock_shape is not None else None,
                "stock_bytes": r.stock_bytes,
                "saving_bytes": r.saving_bytes,
                "live": list(r.live) if r.live is not None else None,
            }
            for name, r in sorted(plan.schedule.regions.items())
        },
        "arena": {
            "alignment": plan.arena.alignment,
            "session_bytes": plan.arena.session_bytes,
            "scratch_bytes": plan.arena.scratch_bytes,
            "allocations": [
                {
                    "name": a.name,
                    "offset": a.offset,
                    "bytes": a.bytes,
                    "persistent": a.persistent,
                    "live": list(a.live) if a.live is not None else None,
                }
                for a in plan.arena.allocations
            ],
        },
        "memory": {
            "demand_bytes": plan.schedule.demand_bytes,
            "stock_bytes": plan.schedule.stock_bytes,
            "compared_demand_bytes": plan.schedule.compared_demand_bytes,
        },
        "pruning": {
            "enabled": plan.pruning.enabled,
            "note": plan.pruning.note,
            "unobserved": [{"stage": s.name, "reason": s.reason} for s in plan.pruning.unobserved],
            "stages": [{"stage": s.name, "reason": s.reason} for s in plan.pruning.stages],
            "regions": [
                {"region": r.name, "stages": list(r.stages), "input": r.input, "reason": r.reason}
                for r in plan.pruning.regions
            ],
            "kept": [{"stage": s.name, "reason": s.reason} for s in plan.pruning.kept],
        },
        "capture": {
            "max_graphs": plan.capture.max_graphs,
            "eager_rule": plan.capture.eager_rule,
            "graphs": [
                {"key": g.key, "stage": g.stage, "firings": list(g.firings), "steady": g.steady, "captured": g.captured}
                for g in plan.capture.graphs
            ],
            "warmup": [[r.instant, r.stage, r.key] for r in plan.capture.warmup],
            "steady": [[r.instant, r.stage, r.key] for r in plan.capture.steady],
            "eager_firings": plan.capture.eager_firings,
        },
        "samples": _samples_json(plan.samples),
        "conversations": _conversations_json(plan.conversations),
        **({"off_plan": _off_plan_json(plan)} if plan.off_plan.declared else {}),
    }


def _off_plan_json(plan: Plan) -> dict:
    off = plan.off_plan
    keys = {g.signature: g.key for g in plan.capture.graphs if g.captured} | off.graphs
    return {
        "steps": [step.text() for step in off.steps],
        "states": off.states,
        "refused": off.refused,
        "graphs": sorted(off.graphs.values()),
        "instants": [
            {
                "instant": i.instant,
                "units": dict(i.units),
                "last": i.last,
                "from_plan": i.from_plan,
                "stages": [f.stage for f in i.firings],
                "graphs": [keys.get(f.signature) for f in i.firings],
            }
            for i in off.instants
        ],
    }


def _conversations_json(conversations: ConversationPlan) -> dict:
    return {
        "bytes_per_conversation": conversations.bytes_per_conversation,
        "shared_bytes": conversations.shared_bytes,
        "regions": [
            {
                "region": r.name,
                "family": r.family,
                "retention": r.retention,
                "capacity": r.capacity,
                "bytes": r.bytes,
                "batched": r.batched,
            }
            for r in conversations.regions
        ],
        "rows": conversations.rows,
        "batched_graphs": [
            {"key": g.key, "stage": g.stage, "rows": g.rows, "burst": g.burst} for g in conversations.batched
        ],
        "per_conversation_graphs": list(conversations.per_conversation_graphs),
    }


def _tick_json(tick: TickSamples) -> dict:
    return {
        "firing": tick.firing,
        "instant": tick.instant,
        "time_s": _rational(tick.time),
        "input": tick.input,
        "emitted": tick.emitted,
        "held_back": tick.held_back,
        "dropped": tick.dropped,
    }


def _samples_json(account: SampleAccount) -> dict:
    return {
        "seconds": _rational(account.seconds),
        "instants": account.instants,
        "clamped": account.clamped,
        "flush": account.flush,
        "unflushed": account.unflushed,
        "skipped": dict(sorted(account.skipped.items())),
        "outputs": {
            name: {
                "clock": o.clock,
                "rate_hz": _rational(o.rate),
                "stage": o.stage,
                "input": o.input,
                "units_per_input_unit": _rational(o.ratio),
                "loss_per_firing": o.loss,
                "loss_intended": o.loss_intended,
                "latency": o.latency,
                "latency_dropped": o.latency_dropped,
                "firings": o.firings,
                "boundaries": o.boundaries,
                "input_units": o.input_units,
                "emitted": o.emitted,
                "flushed": o.flushed,
                "total": o.total,
                "held_back": o.held_back,
                "dropped": o.dropped,
                "whole_loss": o.whole_loss,
                "offline": o.offline,
                "short": o.short,
                "unaccounted": o.unaccounted,
                "ticks": [_tick_json(t) for t in o.ticks],
                "steady_from": o.steady_from,
                "last": _tick_json(o.last),
            }
            for name, o in sorted(account.outputs.items())
        },
    }
