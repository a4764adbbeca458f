"""A pool's metrics with prometheus-client, in a `CollectorRegistry` of its own (several pools in one process
never share a series). `/metrics` serves `exposition()`.

Tick latency is per session tick, from the tick's arrival at the pool to its outputs on the host; a tick
whose latency passes the tick period is missed. The histogram's buckets are fractions of the period, so
p50 and p99 read off it in periods. The runtime's counters (graph replays, eager firings) and the arena's
bytes come from `Runtime.report()`, taken on the device thread after a round at most once a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PERIOD_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)
"""The latency histograms' bucket bounds, in tick periods."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RuntimeReportCollector(Collector):
    """The runtime's own counters, from the last `RuntimeReport` the pool took (none before the first)."""

    def __init__(self) -> None:
        self.report: Any = None

    def collect(self) -> Iterator[Metric]:
        report = self.report
        if report is None:
            return
        arena = GaugeMetricFamily("duplexcadence_arena_bytes", "Bytes of the runtime's arena (one device allocation)")
        arena.add_metric([], report.arena_bytes)
        yield arena
        session = GaugeMetricFamily("duplexcadence_arena_session_bytes", "Arena bytes per session slot (the plan's)")
        session.add_metric([], report.session_bytes)
        yield session
        replays = CounterMetricFamily("duplexcadence_graph_replays", "Stage firings replayed from CUDA graphs")
        replays.add_metric([], report.replays)
        yield replays
        eager = CounterMetricFamily(
            "duplexcadence_eager_firings",
            "Stage firings run eagerly: planned (over budget, blocked) or off the plan",
            labels=["kind"],
        )
        eager.add_metric(["planned"], report.eager_planned)
        eager.add_metric(["off_plan"], report.eager_off_plan)
        yield eager
        graphs = GaugeMetricFamily("duplexcadence_graphs_captured", "Instant graphs captured (fused stage graphs)")
        graphs.add_metric([], report.graphs_captured)
        yield graphs


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
            "duplexcadence_tick_period_seconds", "The tick period: cadence over instants", registry=registry
        )
        self.tick_period.set(tick_period_s)
        self.predicted_tick = Gauge(
            "duplexcadence_predicted_tick_seconds",
            "The admission model's tick with the active sessions",
            registry=registry,
        )
        self.capacity = Gauge(
            "duplexcadence_capacity_sessions", "Sessions the pool admits (slots, or the tick budget)", registry=registry
        )
        self.slots = Gauge("duplexcadence_session_slots", "Sessions the arena holds", registry=registry)
        self.draining = Gauge("duplexcadence_draining", "1 while the pool admits nothing new", registry=registry)
        self.runtime = RuntimeReportCollector()
        registry.register(self.runtime)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
