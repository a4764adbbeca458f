"""Per-tick wall times and what they become: duplex seconds, medians and percentiles, the SM clock."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from fractions import Fraction

import attrs
import torch

from duplexcadence.interpreter.bench.subject import Subject


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sm_clock_reader(device: torch.device) -> Callable[[], float] | None:
    """A reader of the device's current SM clock in MHz (`torch.cuda.clock_rate`, through NVML), or None
    where it cannot be read (off CUDA, no nvidia-ml-py). The clock moves with the GPU's boost and power
    state over a run, and with it every kernel's time: it is read after each tick, outside the timed span,
    so that the table can say at what clock each variant was timed."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.clock_rate(device)
    except Exception:
        return None
    return lambda: float(torch.cuda.clock_rate(device))


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def seconds_of(ticks: int, ticks_per_second: Fraction) -> list[range]:
    """Tick ranges of whole duplex seconds: second s holds ticks [floor(s*r), floor((s+1)*r))."""
    ranges = []
    second = 0
    while math.floor((second + 1) * ticks_per_second) <= ticks:
        ranges.append(range(math.floor(second * ticks_per_second), math.floor((second + 1) * ticks_per_second)))
        second += 1
    return ranges


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of `values` (nan when empty)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


@attrs.frozen
class SecondStatistics:
    """Per-tick wall times grouped into duplex seconds: median, p90 and p99 over the seconds after warm-up,
    the median, p90 and p99 steady tick, and every whole second from tick 0 (`warmup_seconds` of them lead)."""

    median: float
    p90: float
    p99: float
    tick_median: float
    every_second: list[float]
    warmup_seconds: int
    sm_clock_mhz_median: float | None = None  # see sm_clock_reader
    tick_p90: float | None = None
    tick_p99: float | None = None


def second_statistics(subject: Subject, tick_ms: list[float]) -> SecondStatistics:
    whole_seconds = seconds_of(len(tick_ms), subject.ticks_per_second)
    every_second = [sum(tick_ms[t] for t in second) for second in whole_seconds]
    warmup_seconds = sum(1 for second in whole_seconds if second.start < subject.warmup_ticks)
    per_second = every_second[warmup_seconds:]
    steady_ticks = tick_ms[subject.warmup_ticks :] or tick_ms
    if not per_second:
        per_second = [statistics.median(steady_ticks) * float(subject.ticks_per_second)]
    return SecondStatistics(
        statistics.median(per_second),
        percentile(per_second, 0.9),
        percentile(per_second, 0.99),
        statistics.median(steady_ticks),
        every_second,
        warmup_seconds,
        tick_p90=percentile(steady_ticks, 0.9),
        tick_p99=percentile(steady_ticks, 0.99),
    )
