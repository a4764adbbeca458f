"""The timed passes of a bench: every variant in turn (sequential), then optionally all at once stepped in
turn each tick (interleaved), then the GPU busy profile (`profile.profile_all`), last."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.bench.budget import error_text, failed_result, recover, time_budget
from duplexcadence.interpreter.bench.memory import (
    cublas_workspace_bytes,
    fresh_peak,
    memory_breakdown,
    reserved_accounting,
)
from duplexcadence.interpreter.bench.profile import profile_all
from duplexcadence.interpreter.bench.subject import Subject, Variant, VariantResult
from duplexcadence.interpreter.bench.timing import (
    SecondStatistics,
    median_or_none,
    second_statistics,
    sm_clock_reader,
    sync,
)
from duplexcadence.interpreter.runtime.verify import compare, deterministic_cudnn

Progress = Callable[[str, int, int], None]


def run_interleaved(
    subject: Subject, variants: list[Variant], ticks: int, progress: Progress | None = None
) -> dict[str, SecondStatistics]:
    """Time `variants` again, all built at once and stepped in turn: tick t of each, each between two
    synchronisations. Every variant is then timed over the same stretch of wall-clock time, so drift of the
    machine over a run (clocks, neighbours) is shared, where the sequential pass gives each variant its own
    stretch. The order rotates by one each tick (tick t starts with variant t mod n), so each variant
    follows each other one equally often: a tick right after a fully eager one (thousands of launches) is
    slower than one after a graph replay. Needs the memory of every variant at once."""
    runners = []
    try:
        for variant in variants:
            runners.append((variant.name, variant.make()))
            runners[-1][1].reset()
        tick_ms: dict[str, list[float]] = {name: [] for name, _ in runners}
        clocks: dict[str, list[float]] = {name: [] for name, _ in runners}
        device = subject.device
        read_clock = sm_clock_reader(device)
        with torch.no_grad():
            for tick in range(ticks):
                inputs = subject.inputs(tick)
                turn = tick % len(runners)
                for name, runner in runners[turn:] + runners[:turn]:
                    sync(device)
                    begin = time.perf_counter()
                    runner.step(**inputs)
                    sync(device)
                    tick_ms[name].append((time.perf_counter() - begin) * 1000)
                    if read_clock is not None and tick >= subject.warmup_ticks:
                        clocks[name].append(read_clock())
                if progress is not None:
                    progress("interleaved", tick + 1, ticks)
    finally:
        for _, runner in runners:
            close = getattr(runner, "close", None)
            if callable(close):
                close()
        del runners
    return {
        name: attrs.evolve(second_statistics(subject, times), sm_clock_mhz_median=median_or_none(clocks[name]))
        for name, times in tick_ms.items()
    }


def run_variant(
    subject: Subject,
    variant: Variant,
    ticks: int,
    reference: list | None,
    progress: Progress | None = None,
) -> tuple[VariantResult, list]:
    """Build `variant`, step it `ticks` times with a synchronisation around each tick, and compare every
    output with `reference` (the reference variant's outputs, which this returns when `variant` is it)."""
    device = subject.device
    base_allocated = fresh_peak(device)
    base_reserved = torch.cuda.memory_reserved(device) if device.type == "cuda" else None
    started = time.perf_counter()
    runner = variant.make()
    try:
        runner.reset()
        sync(device)
        setup_seconds = time.perf_counter() - started
        state_bytes = (torch.cuda.memory_allocated(device) - base_allocated) if device.type == "cuda" else None
        outputs: list = []
        tick_ms: list[float] = []
        host_ms: list[float] = []
        clocks: list[float] = []
        read_clock = sm_clock_reader(device)
        mismatch = None
        identical = True if reference is not None and variant.compare else None
        largest_difference = None
        with torch.no_grad():
            for tick in range(ticks):
                inputs = subject.inputs(tick)
                sync(device)
                begin = time.perf_counter()
                result = runner.step(**inputs)
                returned = time.perf_counter()
                sync(device)
                tick_ms.append((time.perf_counter() - begin) * 1000)
                host_ms.append((returned - begin) * 1000)
                if read_clock is not None and tick >= subject.warmup_ticks:
                    clocks.append(read_clock())
                result = result if isinstance(result, Mapping) else {"output": result}
                if reference is None and variant.reference:
                    outputs.append({k: v.detach().clone() for k, v in result.items()})
                elif reference is not None and variant.difference is not None:  # outside the timed span
                    tick_difference = float(variant.difference(tick, reference[tick], result))
                    largest_difference = (
                        tick_difference if largest_difference is None else max(largest_difference, tick_difference)
                    )
                if identical and reference is not None:  # identical starts None without a reference
                    for name, expected in reference[tick].items():
                        if variant.outputs is not None and name not in variant.outputs:
                            continue
                        found = compare(tick, name, expected, result.get(name))
                        if found is not None:
                            identical, mismatch = False, f"tick {tick}, {name}: {found.detail}"
                            break
                if progress is not None:
                    progress(variant.name, tick + 1, ticks)
        peak_allocated = peak_reserved = None
        if device.type == "cuda":
            peak_allocated = torch.cuda.max_memory_allocated(device) - base_allocated  # weights and state included
            peak_reserved = torch.cuda.max_memory_reserved(device)
        timing = second_statistics(subject, tick_ms)
        info = variant.info(runner)
        blocked = capture_findings(runner)
        if blocked:
            info = {**info, "capture_blocked": blocked}
        if variant.outputs is not None:
            info = {**info, "compared_outputs": list(variant.outputs)}
        if largest_difference is not None:
            info = {**info, "max_abs_diff_vs_reference": largest_difference}
        reserved = reserved_accounting(runner, base_reserved, peak_reserved)
        if reserved is not None:
            info = {**info, "reserved": reserved}
        memory = memory_breakdown(subject, runner, info, peak_allocated, state_bytes)
        result = VariantResult(
            variant.name,
            timing.median,
            timing.p90,
            timing.p99,
            timing.tick_median,
            None,
            None,
            peak_allocated,
            peak_reserved,
            state_bytes,
            setup_seconds,
            identical,
            mismatch,
            ticks,
            info,
            timing.every_second,
            timing.warmup_seconds,
            memory,
            host_ms_median=statistics.median(host_ms[subject.warmup_ticks :] or host_ms),
            sm_clock_mhz_median=median_or_none(clocks),
            tick_ms_p90=timing.tick_p90,
            tick_ms_p99=timing.tick_p99,
        )
    finally:
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    del runner
    return result, outputs


def run_guarded(
    subject: Subject, variant: Variant, ticks: int, reference: list | None, progress: Progress | None
) -> tuple[VariantResult, list]:
    """run_variant; a `may_fail` variant's exception (or its budget running out) becomes a failed result."""
    if not variant.may_fail:
        return run_variant(subject, variant, ticks, reference, progress)
    try:
        with time_budget(variant.budget_s, f"variant {variant.name!r}"):
            return run_variant(subject, variant, ticks, reference, progress)
    except Exception as error:
        recover(subject.device)
        return failed_result(variant, error), []


def capture_findings(runner: Any) -> list[str]:
    """What kept a DuplexCadence variant's stages out of CUDA graphs (its runtime's `capture-blocked`
    diagnostics, located in the `.clock`), for a runner that is a session of a runtime; else nothing."""
    runtime = getattr(runner, "runtime", None)
    report = getattr(runtime, "report", None)
    if report is None:
        return []
    found = []
    for diagnostic in report().blocked:
        where = diagnostic.span
        located = f"{where.path}:{where.line}:{where.column}: " if where is not None else ""
        found.append(f"{located}{diagnostic.message}")
    return found


def interleaved_info(timed: SecondStatistics) -> dict:
    """What the interleaved pass adds to a result's `info["interleaved"]`."""
    return {
        "ms_per_s_median": timed.median,
        "ms_per_s_p90": timed.p90,
        "ms_per_s_p99": timed.p99,
        "tick_ms_median": timed.tick_median,
        "tick_ms_p90": timed.tick_p90,
        "tick_ms_p99": timed.tick_p99,
        "sm_clock_mhz_median": timed.sm_clock_mhz_median,
    }


class _ProgressBar:
    """A rich progress bar with one task per pass and variant (nothing when `enabled` is False)."""

    def __init__(self, subject_name: str, enabled: bool):
        self.subject_name = subject_name
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        if enabled:
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(transient=True)
            self.bar.start()

    def __call__(self, name: str, done: int, total: int) -> None:
        if self.bar is None:
            return
        if name not in self.tasks:
            self.tasks[name] = self.bar.add_task(f"{self.subject_name}: {name}", total=total)
        self.bar.update(self.tasks[name], completed=done)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(
    subject: Subject,
    ticks: int,
    progress: bool = True,
    compile: bool = False,
    compile_budget_s: float | None = None,
    interleave: bool = False,
    profile: bool = True,
    trace_dir: str | Path | None = None,
) -> list[VariantResult]:
    """Every variant of `subject`, reference first, under deterministic cuDNN; with `compile`, the
    subject's compile variants last (a failed compile cannot disturb the others). With `interleave`, the
    subject's own variants that ran are then timed again by `run_interleaved`, into each result's
    `info["interleaved"]` (median, p90, p99 ms per second and per tick). On CUDA every variant
    that ran is finally built once more for its GPU busy profile (`profile_busy`), after all timing;
    with `profile=False` it is not, and a caller that times more afterwards (several subjects in one
    process) calls `profile_all` once it has timed everything. With `trace_dir`, that profile is also
    written per variant as a Chrome trace there (on CPU too, where it holds the host's operations).
    On CUDA each result's `memory` also holds `cublas_workspace_bytes`, the size of one cuBLAS workspace
    (measured first, on the caller's stream), to read a peak over stock's against."""
    results = []
    reference_outputs = None
    bar = _ProgressBar(subject.name, progress)
    try:
        workspace = cublas_workspace_bytes(subject.device)
        with deterministic_cudnn():
            ordered = sorted(subject.variants, key=lambda v: not v.reference)
            if compile:
                ordered += [
                    v if compile_budget_s is None else attrs.evolve(v, budget_s=compile_budget_s)
                    for v in subject.compile_variants
                ]
            for variant in ordered:
                result, outputs = run_guarded(subject, variant, ticks, reference_outputs, bar)
                if variant.reference:
                    reference_outputs = outputs
                    result = attrs.evolve(result, bit_identical=True)
                if workspace is not None and result.memory is not None:
                    result = attrs.evolve(result, memory={**result.memory, "cublas_workspace_bytes": workspace})
                results.append(result)
            if interleave:
                ran = {r.name for r in results if r.error is None}
                again = [v for v in ordered if v.name in ran and v in subject.variants]
                del reference_outputs
                fresh_peak(subject.device)
                try:
                    timed = run_interleaved(subject, again, ticks, bar)
                except Exception as error:  # e.g. every variant at once does not fit: keep the sequential results
                    names = {v.name for v in again}
                    results = [
                        attrs.evolve(r, info={**r.info, "interleaved": {"error": error_text(error)}})
                        if r.name in names
                        else r
                        for r in results
                    ]
                else:
                    results = [
                        attrs.evolve(r, info={**r.info, "interleaved": interleaved_info(timed[r.name])})
                        if r.name in timed
                        else r
                        for r in results
                    ]
            if profile:  # last: see profile.py
                results = profile_all(subject, results, ticks, bar, variants=ordered, trace_dir=trace_dir)
    finally:
        bar.stop()
    return results
