"""GPU busy time: each variant built afresh after every timed pass and its last ticks run under torch.profiler.

A torch.profiler with CUDA activity leaves CUPTI attached to the process when it stops (kineto finalises
CUPTI only with TEARDOWN_CUPTI=1, which torch turns off around CUDA graphs), and every kernel or graph
launched afterwards pays CUPTI's callbacks: on the H200 a Mimi frame's host time rises by about 85 us and its
wall time by about 80 us after one profile, on moshi's graph and DuplexCadence's alike. So nothing is timed
after a profile: `run` profiles last, and a caller that times several subjects in one process calls
`profile_all` once everything is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import attrs
import torch

from duplexcadence.interpreter.bench.budget import error_text, recover, time_budget
from duplexcadence.interpreter.bench.subject import Subject, Variant, VariantResult
from duplexcadence.interpreter.bench.timing import sync
from duplexcadence.interpreter.bench.trace import trace_file, write_trace

Progress = Callable[[str, int, int], None]


@attrs.frozen
class BusyProfile:
    """What one profiled stretch of ticks gave: kernel ms per duplex second and the busy fraction of the wall
    time (None where kernel times are not measurable), and the trace summary where a trace was asked for."""

    gpu_busy_ms_per_s: float | None
    busy_fraction: float | None
    trace: dict | None = None


def kernel_time_measurable(device: torch.device) -> bool:
    """Whether torch.profiler reports kernel times on `device` (CUDA only)."""
    return device.type == "cuda"


def profiled_ticks(subject: Subject, ticks: int) -> int:
    """How many of a run's last ticks the GPU-busy profile covers: two duplex seconds, at least 8."""
    return min(ticks, max(8, int(subject.ticks_per_second * 2)))


def kernel_busy(runner, subject: Subject, first: int, count: int, trace_path: Path | None = None) -> BusyProfile:
    """Kernel time per duplex second and the busy fraction of the wall time of ticks [first, first + count)
    stepped back to back, by torch.profiler; with `trace_path`, the profile (CPU operations too) is written
    there as a Chrome trace."""
    measurable = kernel_time_measurable(subject.device)
    activities = [torch.profiler.ProfilerActivity.CUDA] if measurable else []
    if trace_path is not None:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    if not activities:
        return BusyProfile(None, None)
    sync(subject.device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profile:
        for tick in range(first, first + count):
            runner.step(**subject.inputs(tick))
        sync(subject.device)
    wall = time.perf_counter() - start
    summary = write_trace(profile, trace_path, count) if trace_path is not None else None
    if not measurable:
        return BusyProfile(None, None, summary)
    # device_time_total of the top-level averages counts every kernel once
    busy_s = sum(event.device_time_total for event in profile.key_averages()) / 1e6
    per_tick_ms = busy_s * 1000 / count
    return BusyProfile(
        per_tick_ms * float(subject.ticks_per_second), min(1.0, busy_s / wall) if wall > 0 else None, summary
    )


def profile_busy(
    subject: Subject,
    variant: Variant,
    ticks: int,
    progress: Progress | None = None,
    trace_path: Path | None = None,
) -> BusyProfile:
    """GPU busy ms per duplex second and busy fraction of `variant`, built afresh: its first ticks are
    stepped unprofiled (no synchronisation between them), the last `profiled_ticks` under torch.profiler,
    so the profile covers the same ticks, inputs and state as the end of the timed run."""
    profiled = profiled_ticks(subject, ticks)
    runner = variant.make()
    try:
        runner.reset()
        with torch.no_grad():
            for tick in range(ticks - profiled):
                runner.step(**subject.inputs(tick))
                if progress is not None:
                    progress(f"{variant.name} (GPU busy profile)", tick + 1, ticks)
            busy = kernel_busy(runner, subject, ticks - profiled, profiled, trace_path)
            if progress is not None:
                progress(f"{variant.name} (GPU busy profile)", ticks, ticks)
    finally:
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    del runner
    return busy


def profile_all(
    subject: Subject,
    results: list[VariantResult],
    ticks: int,
    progress: Progress | None = None,
    variants: list[Variant] | None = None,
    trace_dir: str | Path | None = None,
) -> list[VariantResult]:
    """`results` (of `run(subject, ticks, ...)`), each that ran with its GPU busy time from `profile_busy`
    (nothing off CUDA, unless `trace_dir` asks for traces). A `may_fail` variant that fails here (or runs out
    of its budget) keeps its timings, with the reason in `info["busy_error"]`. Call it after the process's
    last timed tick. `variants`: those the results came from, by name (default: the subject's, compile
    variants included). With `trace_dir`, each profile is written there as a Chrome trace
    (`trace_file`) and summarised in `info["trace"]`."""
    if not kernel_time_measurable(subject.device) and trace_dir is None:
        return results
    variants = subject.variants + subject.compile_variants if variants is None else variants
    by_name = {variant.name: variant for variant in variants}
    profiled = []
    for result in results:
        variant = by_name.get(result.name)
        if result.error is None and variant is not None:
            path = None if trace_dir is None else trace_file(trace_dir, subject.name, variant.name)
            try:
                with time_budget(
                    variant.budget_s if variant.may_fail else None, f"variant {variant.name!r} (GPU busy profile)"
                ):
                    busy = profile_busy(subject, variant, ticks, progress, path)
            except Exception as error:
                if not variant.may_fail:
                    raise
                recover(subject.device)
                result = attrs.evolve(result, info={**result.info, "busy_error": error_text(error)})
            else:
                info = result.info if busy.trace is None else {**result.info, "trace": busy.trace}
                result = attrs.evolve(
                    result, gpu_busy_ms_per_s=busy.gpu_busy_ms_per_s, busy_fraction=busy.busy_fraction, info=info
                )
        profiled.append(result)
    return profiled
