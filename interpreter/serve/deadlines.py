"""Deadline accounting of a round scheduler: each client's ticks, misses and latencies, the scheduler's
windows of recent latencies and rounds, and the observed p99 admission's latency guard reads.

A tick's latency runs from its arrival at the scheduler to its result on the host; over the tick period it
is missed. `LatencyBook` keeps the scheduler's numbers; `SessionStats` and `DeadlineReport` are what
`/v1/sessions` and the `closed` frame say.
"""

from __future__ import annotations

import collections
import math
import time

import attrs

LATENCY_WINDOW = 65536
"""Ticks (and rounds) whose latency the scheduler keeps for its quantiles."""


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile of `values` (nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(round(q * len(ordered), 9)) - 1))
    return ordered[rank]


@attrs.frozen
class SessionStats:
    """One session's deadline accounting: ticks stepped, ticks missed (latency over the period), ticks answered
    with an error, and the latency quantiles of its recent ticks (seconds; None before the first)."""

    id: int
    seed: int
    ticks: int
    missed: int
    errors: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None


@attrs.frozen
class DeadlineReport:
    """The scheduler's deadline accounting: session ticks stepped and missed since start, their latency
    quantiles over the last ticks (seconds), and every open session's own numbers."""

    ticks: int
    missed: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None
    tick_period_s: float
    sessions: tuple[SessionStats, ...]

    def to_json(self) -> dict:
        data = attrs.asdict(self, recurse=False)
        data["sessions"] = [attrs.asdict(stats) for stats in self.sessions]
        return data


class LatencyBook:
    """The latencies a scheduler answered: the last ticks' and rounds' (for quantiles and benchmarks), those
    in admission's guard window (for the observed p99), and those not yet in the metrics' histograms."""

    def __init__(self, tick_period_s: float, guard_window_s: float):
        self.tick_period_s = tick_period_s
        self.guard_window_s = guard_window_s
        self.ticks = 0
        self.missed = 0
        self.tick_latencies: collections.deque[float] = collections.deque(maxlen=LATENCY_WINDOW)
        """The latency of the last session ticks (seconds), oldest first."""
        self.round_log: collections.deque[tuple[int, float]] = collections.deque(maxlen=LATENCY_WINDOW)
        """(units stepped, seconds) of the last rounds on the device, oldest first."""
        self.answered: collections.deque[tuple[float, float]] = collections.deque(maxlen=LATENCY_WINDOW)
        """(answered at, latency) of the ticks answered in the guard window (perf_counter seconds)."""
        self.version = 0
        self.cached_p99: tuple[int, float, float | None] = (-1, 0.0, None)
        """`observed_p99()` as last taken: (answered's version, until when it holds, the p99)."""
        self.unobserved: list[tuple[float, float, int]] = []
        """(latency, wait, session ticks) answered but not yet in the latency histograms: observing each
        session tick costs the event loop about a microsecond, so it is done off the answers' path."""

    def record(self, latency: float, wait: float, count: int, answered_at: float) -> bool:
        """`count` session ticks answered at `answered_at` after `latency` (of which `wait` before their round);
        whether they missed the period."""
        missed = latency > self.tick_period_s
        self.ticks += count
        self.missed += missed * count
        for _ in range(count):
            self.tick_latencies.append(latency)
            self.answered.append((answered_at, latency))
        self.version += 1
        self.unobserved.append((latency, wait, count))
        return missed

    def forget(self, now: float) -> None:
        """Drop the answered ticks older than the guard window. (Their p99 is taken where it is read, not here:
        sorting the window every round costs the event loop a millisecond a round at 512 sessions.)"""
        since = now - self.guard_window_s
        while self.answered and self.answered[0][0] < since:
            self.answered.popleft()

    def clear_window(self) -> None:
        """Forget the guard window's ticks: the last client closed, and they measured clients that left."""
        self.answered.clear()
        self.version += 1

    def observed_p99(self) -> float | None:
        """The p99 latency of the ticks answered in the guard window (None: none answered there)."""
        now = time.perf_counter()
        version, valid_until, value = self.cached_p99
        if version == self.version and now < valid_until:
            return value  # no tick answered, none left the window
        since = now - self.guard_window_s
        recent = [(at, latency) for at, latency in list(self.answered) if at >= since]
        value = quantile([latency for _, latency in recent], 0.99)
        valid_until = recent[0][0] + self.guard_window_s if recent else math.inf
        self.cached_p99 = (self.version, valid_until, value)
        return value

    def take_unobserved(self) -> list[tuple[float, float, int]]:
        taken, self.unobserved = self.unobserved, []
        return taken

    def report(self, sessions: tuple[SessionStats, ...]) -> DeadlineReport:
        recent = list(self.tick_latencies)
        return DeadlineReport(
            self.ticks,
            self.missed,
            quantile(recent, 0.5),
            quantile(recent, 0.99),
            max(recent) if recent else None,
            self.tick_period_s,
            sessions,
        )
