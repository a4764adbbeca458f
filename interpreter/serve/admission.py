"""Admission from the plan: a linear model of the tick's device time, the capacity it allows, the refusal.

A pool steps its sessions in rounds: one `Runtime.step_many` over every session with a queued tick (in
lockstep, over every group whose members all have one). A round's time is modelled as

    tick(n) = fixed + per_unit x units(n)

where `units(n)` is `n` sessions, or `ceil(n / rows)` lockstep groups (a group costs the same whatever its
rows hold). `fixed` and `per_unit` come from a calibration at start-up (rounds timed with 1 and with
several units, a least-squares line through their medians) or are given. A session is admitted while a slot
is free and `tick(n + 1) <= period x (1 - headroom)`, the period being the plan's time per instant (the
cadence over its instants: 1000 ms for a 1 s chunk, 80 ms for a 12.5 Hz frame).

The model predicts the device's round, not the time around it (a websocket front's receive, decode, encode
and send, the wait for the round before). So admission also watches the ticks themselves: while the p99
latency of the ticks the pool answered in the last `LATENCY_GUARD_PERIODS` tick periods is over the budget, it
admits nothing new, whatever the model says, and it admits again once that p99 is back under the budget.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import attrs

from duplexcadence.interpreter.serve import messages

LATENCY_GUARD_PERIODS = 5
"""How many tick periods of answered ticks the observed-latency guard looks back over."""


@attrs.frozen
class TickModel:
    """tick(units) = `fixed_s` + `per_unit_s` x units (seconds); `unit` says what a unit is."""

    fixed_s: float
    per_unit_s: float
    unit: str = "session"
    points: tuple[tuple[int, float], ...] = ()
    """The calibration's (units, median round seconds); empty for a model given at start."""

    def predict(self, units: int) -> float:
        return 0.0 if units <= 0 else self.fixed_s + self.per_unit_s * units

    def describe(self) -> str:
        points = ", ".join(f"{units} {self.unit}(s): {messages.milliseconds(s)}" for units, s in self.points)
        return messages.calibration_line(self.fixed_s, self.per_unit_s, self.unit, points or "given, not timed")


def fit(points: Sequence[tuple[int, float]], unit: str = "session") -> TickModel:
    """The least-squares line through (units, seconds) points, clamped to non-negative terms.

    One distinct unit count gives a line through the origin."""
    if not points:
        raise ValueError("a tick model needs at least one timed point")
    xs = [float(units) for units, _ in points]
    ys = [seconds for _, seconds in points]
    if len(set(xs)) == 1:
        per_unit = statistics.fmean(ys) / xs[0]
        return TickModel(0.0, per_unit, unit, tuple(points))
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    slope = max(slope, 0.0)
    fixed = max(mean_y - slope * mean_x, 0.0)
    if slope == 0.0:  # a flat (or falling) line: every point costs at most the largest measured round
        fixed = max(ys)
    return TickModel(fixed, slope, unit, tuple(points))


@attrs.frozen
class Capacity:
    """A pool's capacity now (a record a router reads: place a new session where `free` is largest).

    `sessions`: active sessions; `slots`: the most sessions the arena holds (session slots, or groups x rows);
    `capacity`: the most the pool admits (`slots`, or fewer where the tick budget binds); `free`: how many
    more it admits now (0 while draining); `predicted_tick_s`: the model's tick with `sessions` active;
    `budget_s` = `tick_period_s` x (1 - `headroom`).
    """

    sessions: int
    slots: int
    capacity: int
    free: int
    predicted_tick_s: float
    predicted_tick_at_capacity_s: float
    tick_period_s: float
    headroom: float
    budget_s: float
    draining: bool
    lanes: int
    lockstep_rows: int | None
    model: TickModel
    observed_tick_p99_s: float | None = None
    """The p99 latency of the ticks answered in the guard's window (None: none answered there); over
    `budget_s`, the pool admits nothing new."""

    def to_json(self) -> dict:
        data = attrs.asdict(self, recurse=False)
        data["model"] = {
            "fixed_s": self.model.fixed_s,
            "per_unit_s": self.model.per_unit_s,
            "unit": self.model.unit,
            "points": [list(point) for point in self.model.points],
        }
        return data

    def __str__(self) -> str:
        return messages.capacity_line(
            self.capacity,
            self.sessions,
            self.slots,
            self.predicted_tick_at_capacity_s,
            self.tick_period_s,
            self.headroom,
        )


class AdmissionRefused(Exception):
    """A session the pool does not admit. `reason`: "at-capacity", "draining" or "shutting-down";
    the numbers as attributes."""

    def __init__(
        self,
        reason: str,
        message: str,
        sessions: int,
        capacity: int,
        slots: int,
        predicted_tick_s: float,
        tick_period_s: float,
        headroom: float,
    ):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.sessions = sessions
        self.capacity = capacity
        self.slots = slots
        self.predicted_tick_s = predicted_tick_s
        self.tick_period_s = tick_period_s
        self.headroom = headroom


@attrs.frozen
class AdmissionRule:
    """The rule of one pool: its slots, how sessions make units, the model, the period and the headroom."""

    slots: int
    rows: int | None
    model: TickModel
    tick_period_s: float
    headroom: float
    enforce_budget: bool = True
    latency_guard: bool = True
    """Also refuse while the observed p99 tick latency is over the budget (`latency_over_budget`)."""
    client: str = "session"
    """What the pool admits, as its refusals name it ("session", "conversation")."""

    @property
    def budget_s(self) -> float:
        return self.tick_period_s * (1.0 - self.headroom)

    @property
    def guard_window_s(self) -> float:
        """How far back the observed-latency guard looks: `LATENCY_GUARD_PERIODS` tick periods."""
        return self.tick_period_s * LATENCY_GUARD_PERIODS

    def latency_over_budget(self, observed_p99_s: float | None, sessions: int) -> bool:
        """Whether the observed p99 tick latency (None: no tick answered in the window) is over the budget
        while `sessions` are open. With none open it never is: the ticks it measured were of sessions that
        have left, and a new session alone meets only the device's round."""
        guarded = self.enforce_budget and self.latency_guard and sessions > 0
        return guarded and observed_p99_s is not None and observed_p99_s > self.budget_s

    def units(self, sessions: int) -> int:
        return sessions if self.rows is None else math.ceil(sessions / self.rows)

    def predict(self, sessions: int) -> float:
        """The tick with `sessions` open."""
        own = self.units(sessions)
        return self.model.predict(own) if own else 0.0

    def capacity(self) -> int:
        """The most sessions admitted: every slot, unless the budget binds first."""
        if not self.enforce_budget:
            return self.slots
        best = 0
        for count in range(1, self.slots + 1):
            if self.predict(count) > self.budget_s:
                break
            best = count
        return best

    def snapshot(
        self,
        sessions: int,
        draining: bool,
        lanes: int,
        observed_p99_s: float | None = None,
    ) -> Capacity:
        capacity = self.capacity()
        if self.latency_over_budget(observed_p99_s, sessions):
            capacity = min(capacity, sessions)
        return Capacity(
            sessions=sessions,
            slots=self.slots,
            capacity=capacity,
            free=0 if draining else max(capacity - sessions, 0),
            predicted_tick_s=self.predict(sessions),
            predicted_tick_at_capacity_s=self.predict(capacity),
            tick_period_s=self.tick_period_s,
            headroom=self.headroom,
            budget_s=self.budget_s,
            draining=draining,
            lanes=lanes,
            lockstep_rows=self.rows,
            model=self.model,
            observed_tick_p99_s=observed_p99_s,
        )

    def refusal(self, sessions: int, draining: bool, observed_p99_s: float | None = None) -> AdmissionRefused | None:
        """Why one more session is not admitted (None: it is), with `observed_p99_s` the p99 latency of the
        ticks answered in the guard's window."""
        capacity = self.capacity()
        predicted = self.predict(sessions + 1)
        numbers = (sessions, capacity, self.slots, predicted, self.tick_period_s, self.headroom)
        if draining:
            return AdmissionRefused(messages.DRAINING, messages.draining(sessions, self.client), *numbers)
        if sessions < capacity:
            if not self.latency_over_budget(observed_p99_s, sessions):
                return None
            assert observed_p99_s is not None
            message = messages.latency_over_budget(
                sessions,
                observed_p99_s,
                self.guard_window_s,
                self.tick_period_s,
                self.headroom,
                self.budget_s,
                self.client,
            )
            return AdmissionRefused(messages.AT_CAPACITY, message, *numbers)
        message = messages.at_capacity(
            sessions,
            capacity,
            predicted,
            self.tick_period_s,
            self.headroom,
            sessions >= self.slots,
            self.slots,
            self.budget_s,
            self.client,
        )
        return AdmissionRefused(messages.AT_CAPACITY, message, *numbers)
