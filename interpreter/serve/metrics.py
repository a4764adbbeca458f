"""A pool's metrics with prometheus-client, in a `CollectorRegistry` of its own (several pools in one process
do not share a series). `/metrics` serves `exposition()`.

Tick latency is per session tick, from the tick's arrival at the pool to its outputs on the host; a tick
whose latency passes the tick period is missed. Its wait is the part before its round starts on the device.
The histograms' buckets are fractions of the period, so p50 and p99 read off them in periods. The pool puts
its answered ticks in them every 100 ms and when its own `exposition()` is read, not on the answers' path. The
runtime's counters (graph replays, eager firings) and
the arena's bytes come from `Runtime.report()`, taken on the device thread after a round at most once a second
(`take_report`).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PERIOD_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)
"""The latency histograms' bucket bounds, in tick periods."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PoolMetrics:
    """Every series of one pool."""

    def __init__(self, tick_period_s: float):
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        buckets = tuple(round(fraction * tick_period_s, 9) for fraction in PERIOD_FRACTIONS)
        self.sessions_active = Gauge("duplexcadence_sessions_active", "Sessions open in the pool", registry=registry)
        self.admitted = Counter("duplexcadence_sessions_admitted", "Sessions admitted", registry=registry)
        self.refused = Counter(
            "duplexcadence_sessions_refused", "Sessions refused, by reason", ["reason"], registry=registry
        )
        self.closed = Counter(
            "duplexcadence_sessions_closed", "Sessions closed, by reason", ["reason"], registry=registry
        )
        self.ticks = Counter("duplexcadence_ticks", "Session ticks stepped", registry=registry)
        self.whole_group_ticks = Counter(
            "duplexcadence_whole_group_ticks",
            "Lockstep groups stepped whole: a bundle's group as one tick, its inputs batched by the client",
            registry=registry,
        )
        self.missed = Counter(
            "duplexcadence_ticks_missed", "Session ticks whose latency passed the tick period", registry=registry
        )
        self.tick_errors = Counter(
            "duplexcadence_tick_errors", "Ticks answered with an error, by code", ["code"], registry=registry
        )
        self.tick_latency = Histogram(
            "duplexcadence_tick_latency_seconds",
            "Per session tick: arrival at the pool to outputs on the host",
            buckets=buckets,
            registry=registry,
        )
        self.tick_wait = Histogram(
            "duplexcadence_tick_wait_seconds",
            "Per session tick: arrival at the pool to the start of its round on the device (the gather, the rest"
            " of its lockstep group, the round before it)",
            buckets=buckets,
            registry=registry,
        )
        self.round_seconds = Histogram(
            "duplexcadence_round_seconds",
            "One round on the device: step_many over the ticking sessions (or groups), outputs to the host",
            buckets=buckets,
            registry=registry,
        )
        self.round_units = Histogram(
            "duplexcadence_round_units",
            "Sessions (or lockstep groups) stepped in one round",
            buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024),
            registry=registry,
        )
        self.tick_period = Gauge(
            "duplexcadence_tick_period_seconds",
            "The tick period: cadence over instants",
            registry=registry,
        )
        self.tick_period.set(tick_period_s)
        self.predicted_tick = Gauge(
            "duplexcadence_predicted_tick_seconds",
            "The admission model's tick with the active sessions",
            registry=registry,
        )
        self.observed_tick_p99 = Gauge(
            "duplexcadence_observed_tick_p99_seconds",
            "p99 latency of the ticks answered in admission's guard window, 0 with none",
            registry=registry,
        )
        self.capacity = Gauge(
            "duplexcadence_capacity_sessions",
            "Sessions the pool admits (slots, or the tick budget)",
            registry=registry,
        )
        self.slots = Gauge("duplexcadence_session_slots", "Sessions the arena holds", registry=registry)
        self.draining = Gauge(
            "duplexcadence_draining",
            "1 while the pool admits nothing new",
            registry=registry,
        )
        self.arena_bytes = Gauge(
            "duplexcadence_arena_bytes",
            "Bytes of the runtime's arena (one device allocation)",
            registry=registry,
        )
        self.arena_session_bytes = Gauge(
            "duplexcadence_arena_session_bytes",
            "Arena bytes per session slot (the plan's)",
            registry=registry,
        )
        self.graph_replays = Counter(
            "duplexcadence_graph_replays", "Stage firings replayed from CUDA graphs", registry=registry
        )
        self.eager_firings = Counter(
            "duplexcadence_eager_firings",
            "Stage firings run eagerly: planned (over budget, blocked) or off the plan",
            ["kind"],
            registry=registry,
        )
        self.graphs_captured = Gauge(
            "duplexcadence_graphs_captured",
            "Instant graphs captured (fused stage graphs)",
            registry=registry,
        )
        self.report: Any = None
        """The last `RuntimeReport` taken (None before the first)."""

    def take_report(self, report: Any) -> None:
        """The runtime's numbers from `report` (a `RuntimeReport`): its counters advance by what they gained
        since the last one."""
        last = self.report
        self.report = report
        self.arena_bytes.set(report.arena_bytes)
        self.arena_session_bytes.set(report.session_bytes)
        self.graphs_captured.set(report.graphs_captured)
        self.graph_replays.inc(max(0, report.replays - (last.replays if last is not None else 0)))
        for kind, now, before in (
            ("planned", report.eager_planned, last.eager_planned if last is not None else 0),
            ("off_plan", report.eager_off_plan, last.eager_off_plan if last is not None else 0),
        ):
            self.eager_firings.labels(kind).inc(max(0, now - before))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
