"""One benchmark for every tail: ms per duplex second, GPU busy time, peak memory, bit-identity.

A *subject* (one per example model, `examples/<model>/bench.py: subject(**options)`) says how to
build the model, which stock variants exist (stock eager first: it is the reference for
bit-identity), how to load the DuplexCadence runtime, and the inputs of each tick. The harness runs
every variant in one process on one device, side by side, with the same inputs:

* ms per duplex second: per-tick wall time with a synchronisation around each tick (CUDA events
  agree within noise), grouped into duplex seconds by the clock (12 or 13 Mimi frames a second);
  median, p90 and p99 over seconds, warm-up ticks excluded;
* GPU busy vs wall: kernel time from torch.profiler over the last two seconds of ticks, against their wall
  time, in a pass of its own after every timed pass (`profile_busy`): a profiler with CUDA activity leaves
  CUPTI attached to the process when it stops, which slows every later launch;
* peak memory allocated while the variant is built and run (its weights, state, graph pools and
  activations: every variant builds its own model) and the allocator's reserved high-water;
* bit-identity: every output of every tick `torch.equal` to stock eager's, under deterministic cuDNN;
* per second: every whole second's ms (warm-up included, `warmup_seconds` says how many lead), and
  peak memory split into weights, state and the rest (graph pools, activations, workspaces).

Opt-in (`run(..., compile=True)`, `dsl bench MODEL --compile`): the subject's `compile_variants`,
built with `compiled_variant`: the stock step under `torch.compile(mode="reduce-overhead")`, with
its compile time, compilations after the first call, graph breaks and cudagraph skips reported.
Such a variant may fail (it is run last, in a time budget): it is then reported as failed with the
reason instead of stopping the bench.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import signal
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.runtime.verify import compare, deterministic_cudnn


@attrs.define
class Variant:
    """A way of running the tail: `make()` returns an object with `reset()` and `step(**inputs)`.

    `reference`: stock eager, against which every other variant's outputs are compared.
    `info` collects what the variant wants reported (graphs captured, capture seconds...).
    """

    name: str
    make: Callable[[], Any]
    reference: bool = False
    info: Callable[[Any], dict] = lambda runner: {}
    compare: bool = True  # False for a variant with another op set (e.g. moshi without its compiled rope)
    may_fail: bool = False  # a failure is reported (VariantResult.error) instead of raised
    budget_s: float | None = None  # wall-clock budget of the whole variant (main thread only)
    # For a variant that is not meant to be bit-identical (compare=False): the max abs difference of one
    # tick's outputs from the reference's, as the variant defines it (e.g. on the samples both emit).
    # The harness reports the largest over the ticks in `info["max_abs_diff_vs_reference"]`.
    difference: Callable[[int, Mapping, Mapping], float] | None = None


@attrs.define
class Subject:
    """A benchmarked tail: its variants, its inputs, and how many ticks make a duplex second."""

    name: str
    ticks_per_second: Fraction
    inputs: Callable[[int], Mapping[str, torch.Tensor]]
    variants: list[Variant]
    device: torch.device
    description: str = ""
    warmup_ticks: int = 0
    weights_bytes: int = 0  # weights built once outside the variants (so outside every variant's peak)
    extra: dict = attrs.field(factory=dict)
    compile_variants: list[Variant] = attrs.field(factory=list)  # run only with `run(..., compile=True)`


@attrs.frozen
class VariantResult:
    name: str
    ms_per_s_median: float | None  # None only for a failed variant
    ms_per_s_p90: float | None
    ms_per_s_p99: float | None
    tick_ms_median: float | None
    gpu_busy_ms_per_s: float | None
    busy_fraction: float | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    state_bytes: int | None
    setup_seconds: float
    bit_identical: bool | None
    first_mismatch: str | None
    ticks: int
    info: dict
    per_second_ms: list[float] = attrs.field(factory=list)  # every whole second from tick 0
    warmup_seconds: int = 0  # leading entries of per_second_ms that hold warm-up ticks (not in the statistics)
    memory: dict | None = None  # see memory_breakdown
    error: str | None = None  # why a `may_fail` variant failed (its numbers are then None)
    host_ms_median: float | None = None  # a steady tick's time until `step` returns, before the synchronisation
    sm_clock_mhz_median: float | None = None  # the SM clock read after each steady tick (NVML; None off CUDA)

    def to_json(self) -> dict:
        return attrs.asdict(self)


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


def _median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def option_flag(value) -> bool:
    """An on/off `--option KEY=VALUE` of `dsl bench` (1, true, yes, on) as a bool."""
    return str(value).lower() in ("1", "true", "yes", "on")


def fresh_peak(device: torch.device) -> int:
    """Collect garbage and restart the device's peak-memory statistics; returns the bytes allocated
    now (0 off CUDA), the base that a later `max_memory_allocated` is measured from.

    cuBLAS keeps a workspace per stream (32 MiB on this GPU) for the life of the process. They are
    dropped here, so that each variant pays for the workspaces of the streams it uses, as it would alone
    in a process, rather than reusing those an earlier variant allocated (moshi's `CUDAGraphed` and
    DuplexCadence capture on different side streams)."""
    gc.collect()
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        clear_workspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def seconds_of(ticks: int, ticks_per_second: Fraction) -> list[range]:
    """Tick ranges of whole duplex seconds: second s holds ticks [floor(s*r), floor((s+1)*r))."""
    ranges = []
    second = 0
    while math.floor((second + 1) * ticks_per_second) <= ticks:
        ranges.append(range(math.floor(second * ticks_per_second), math.floor((second + 1) * ticks_per_second)))
        second += 1
    return ranges


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def _busy(runner, subject: Subject, first: int, count: int) -> tuple[float | None, float | None]:
    """Kernel time per duplex second and the busy fraction of the wall time of ticks [first, first + count)
    stepped back to back, by torch.profiler."""
    if not kernel_time_measurable(subject.device):
        return None, None
    activities = [torch.profiler.ProfilerActivity.CUDA]
    sync(subject.device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profile:
        for tick in range(first, first + count):
            runner.step(**subject.inputs(tick))
        sync(subject.device)
    wall = time.perf_counter() - start
    kernel_us = sum(event.device_time_total for event in profile.key_averages())
    # device_time_total of the top-level averages counts every kernel once
    busy_s = kernel_us / 1e6
    per_tick_ms = busy_s * 1000 / count
    return per_tick_ms * float(subject.ticks_per_second), min(1.0, busy_s / wall) if wall > 0 else None


def kernel_time_measurable(device: torch.device) -> bool:
    """Whether torch.profiler reports kernel times on `device` (CUDA only)."""
    return device.type == "cuda"


def profiled_ticks(subject: Subject, ticks: int) -> int:
    """How many of a run's last ticks the GPU-busy profile covers: two duplex seconds, at least 8."""
    return min(ticks, max(8, int(subject.ticks_per_second * 2)))


def profile_busy(
    subject: Subject, variant: Variant, ticks: int, progress: Callable[[str, int, int], None] | None = None
) -> tuple[float | None, float | None]:
    """GPU busy ms per duplex second and busy fraction of `variant`, built afresh: its first ticks are
    stepped unprofiled (no synchronisation between them), the last `profiled_ticks` under torch.profiler,
    so the profile covers the same ticks, inputs and state as the end of the timed run.

    This runs after every timed pass of a bench. A torch.profiler with CUDA activity leaves CUPTI attached
    to the process when it stops (kineto finalises CUPTI only with TEARDOWN_CUPTI=1, which torch turns off
    around CUDA graphs), and every kernel or graph launched afterwards pays CUPTI's callbacks: on the H200
    a Mimi frame's host time rose by about 85 us and its wall time by about 80 us after one profile
    (`scripts/mimi_step_conditions.py --profiler-aftereffect`), on moshi's graph and ours alike."""
    profiled = profiled_ticks(subject, ticks)
    runner = variant.make()
    try:
        runner.reset()
        with torch.no_grad():
            for tick in range(ticks - profiled):
                runner.step(**subject.inputs(tick))
                if progress is not None:
                    progress(f"{variant.name} (GPU busy profile)", tick + 1, ticks)
            busy = _busy(runner, subject, ticks - profiled, profiled)
            if progress is not None:
                progress(f"{variant.name} (GPU busy profile)", ticks, ticks)
    finally:
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    del runner
    return busy


def _module_bytes(root: Any, device: torch.device, depth: int = 4) -> int:
    """Bytes of the parameters and buffers of every nn.Module reachable from `root` (attributes,
    dicts, lists; `depth` levels), each storage counted once, on `device` only."""
    seen_objects: set[int] = set()
    storages: dict[int, int] = {}

    def visit(value: Any, level: int) -> None:
        if level < 0 or id(value) in seen_objects or isinstance(value, (torch.Tensor, str, bytes, int, float)):
            return
        seen_objects.add(id(value))
        if isinstance(value, torch.nn.Module):
            for tensor in list(value.parameters()) + list(value.buffers()):
                if tensor.device.type == device.type and tensor.numel():
                    storage = tensor.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
            return
        if isinstance(value, Mapping):
            children = list(value.values())
        elif isinstance(value, (list, tuple)):
            children = list(value)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            children = list(vars(value).values())
        else:
            return
        for child in children:
            visit(child, level - 1)

    visit(root, depth)
    return sum(storages.values())


def memory_breakdown(subject: Subject, runner: Any, info: dict, peak: int | None, setup: int | None) -> dict | None:
    """Peak allocated memory split into regions where measurable.

    weights: `subject.weights_bytes` when the subject builds them outside the variants (then not part of
    the peak), else the parameters and buffers of the modules the variant holds; state: the runtime's
    arena (`info["arena_bytes"]`) for DuplexCadence, else what the variant's set-up allocated beyond its
    weights (the model's streaming state / cache buffers); other: the rest of the peak (graph pools,
    activations, workspaces, allocator rounding).
    """
    if peak is None:
        return None
    if subject.weights_bytes:
        weights, weights_in_peak, weights_source = subject.weights_bytes, False, "subject"
    else:
        weights, weights_in_peak, weights_source = _module_bytes(runner, subject.device), True, "modules"
    if info.get("arena_bytes") is not None:
        state, state_source = int(info["arena_bytes"]), "arena"
    elif setup is not None:
        state, state_source = max(0, setup - (weights if weights_in_peak else 0)), "set-up"
    else:
        state, state_source = None, None
    other = peak - (weights if weights_in_peak else 0) - (state or 0)
    return {
        "peak_bytes": peak,
        "weights_bytes": weights,
        "weights_in_peak": weights_in_peak,
        "weights_source": weights_source,
        "state_bytes": state,
        "state_source": state_source,
        "other_bytes": other,
    }


class VariantBudgetExceeded(Exception):
    pass


@contextlib.contextmanager
def time_budget(seconds: float | None, what: str, error: type[BaseException] = VariantBudgetExceeded):
    """Raise `error` in the main thread after `seconds` (no limit elsewhere or without one)."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    leaving = False

    def expire(signum, frame):
        if not leaving:
            raise error(f"{what} exceeded its budget of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    # The alarm repeats every 50 ms after the budget: one raised inside a finaliser (a `__del__` run by
    # `gc.collect()`) is printed and dropped by Python, and the next one gets out.
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        leaving = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def failed_result(variant: Variant, error: BaseException, ticks_done: int = 0) -> VariantResult:
    text = f"{type(error).__name__}: {error}".strip()
    if len(text) > 600:
        text = text[:600] + " ..."
    return VariantResult(
        variant.name, None, None, None, None, None, None, None, None, None, 0.0, None, None, ticks_done, {}, error=text
    )


@attrs.frozen
class SecondStatistics:
    """Per-tick wall times grouped into duplex seconds: median, p90 and p99 over the seconds after warm-up,
    the median steady tick, and every whole second from tick 0 (`warmup_seconds` of them lead)."""

    median: float
    p90: float
    p99: float
    tick_median: float
    every_second: list[float]
    warmup_seconds: int
    sm_clock_mhz_median: float | None = None  # see sm_clock_reader


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
        _percentile(per_second, 0.9),
        _percentile(per_second, 0.99),
        statistics.median(steady_ticks),
        every_second,
        warmup_seconds,
    )


def run_interleaved(
    subject: Subject, variants: list[Variant], ticks: int, progress: Callable[[str, int, int], None] | None = None
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
        name: attrs.evolve(second_statistics(subject, times), sm_clock_mhz_median=_median_or_none(clocks[name]))
        for name, times in tick_ms.items()
    }


def run_variant(
    subject: Subject,
    variant: Variant,
    ticks: int,
    reference: list | None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[VariantResult, list]:
    device = subject.device
    base_allocated = fresh_peak(device)
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
                    found = float(variant.difference(tick, reference[tick], result))
                    largest_difference = found if largest_difference is None else max(largest_difference, found)
                if identical:
                    for name, expected in reference[tick].items():
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
        if largest_difference is not None:
            info = {**info, "max_abs_diff_vs_reference": largest_difference}
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
            sm_clock_mhz_median=_median_or_none(clocks),
        )
    finally:
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    del runner
    return result, outputs


def _run_guarded(subject: Subject, variant: Variant, ticks: int, reference: list | None, report) -> tuple:
    """run_variant; a `may_fail` variant's exception (or its budget running out) becomes a failed result."""
    if not variant.may_fail:
        return run_variant(subject, variant, ticks, reference, report)
    try:
        with time_budget(variant.budget_s, f"variant {variant.name!r}"):
            return run_variant(subject, variant, ticks, reference, report)
    except Exception as error:
        _recover(subject.device)
        return failed_result(variant, error), []


def _recover(device: torch.device) -> None:
    """Free what a failed variant left behind, so the variants after it start clean."""
    gc.collect()
    if device.type == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()


def profile_all(
    subject: Subject, results: list[VariantResult], ticks: int, report=None, variants: list[Variant] | None = None
) -> list[VariantResult]:
    """`results` (of `run(subject, ticks, ...)`), each that ran with its GPU busy time from `profile_busy`
    (nothing off CUDA). A `may_fail` variant that fails here (or runs out of its budget) keeps its
    timings, with the reason in `info["busy_error"]`. Call it after the process's last timed tick.
    `variants`: those the results came from, by name (default: the subject's, compile variants included)."""
    if not kernel_time_measurable(subject.device):
        return results
    variants = subject.variants + subject.compile_variants if variants is None else variants
    by_name = {variant.name: variant for variant in variants}
    profiled = []
    for result in results:
        variant = by_name.get(result.name)
        if result.error is None and variant is not None:
            try:
                with time_budget(
                    variant.budget_s if variant.may_fail else None, f"variant {variant.name!r} (GPU busy profile)"
                ):
                    busy_ms, busy_fraction = profile_busy(subject, variant, ticks, report)
            except Exception as error:
                if not variant.may_fail:
                    raise
                _recover(subject.device)
                text = f"{type(error).__name__}: {error}".strip()[:600]
                result = attrs.evolve(result, info={**result.info, "busy_error": text})
            else:
                result = attrs.evolve(result, gpu_busy_ms_per_s=busy_ms, busy_fraction=busy_fraction)
        profiled.append(result)
    return profiled


def run(
    subject: Subject,
    ticks: int,
    progress: bool = True,
    compile: bool = False,
    compile_budget_s: float | None = None,
    interleave: bool = False,
    profile: bool = True,
) -> list[VariantResult]:
    """Every variant of `subject`, reference first, under deterministic cuDNN; with `compile`, the
    subject's compile variants last (a failed compile cannot disturb the others). With `interleave`, the
    subject's own variants that ran are then timed again by `run_interleaved`, into each result's
    `info["interleaved"]` (median, p90, p99 ms per second and the median tick). On CUDA every variant
    that ran is finally built once more for its GPU busy profile (`profile_busy`), after all timing;
    with `profile=False` it is not, and a caller that times more afterwards (several subjects in one
    process) calls `profile_all` once it has timed everything."""
    results = []
    reference_outputs = None
    bar = None
    if progress:
        try:
            from rich.progress import Progress

            bar = Progress(transient=True)
            bar.start()
        except ImportError:  # rich is a dependency; stay quiet if an install lacks it
            bar = None
    tasks: dict[str, Any] = {}

    def report(name: str, done: int, total: int) -> None:
        if bar is None:
            return
        if name not in tasks:
            tasks[name] = bar.add_task(f"{subject.name}: {name}", total=total)
        bar.update(tasks[name], completed=done)

    try:
        with deterministic_cudnn():
            ordered = sorted(subject.variants, key=lambda v: not v.reference)
            if compile:
                ordered += [
                    v if compile_budget_s is None else attrs.evolve(v, budget_s=compile_budget_s)
                    for v in subject.compile_variants
                ]
            for variant in ordered:
                result, outputs = _run_guarded(subject, variant, ticks, reference_outputs, report)
                if variant.reference:
                    reference_outputs = outputs
                    result = attrs.evolve(result, bit_identical=True)
                results.append(result)
            if interleave:
                ran = {r.name for r in results if r.error is None}
                again = [v for v in ordered if v.name in ran and v in subject.variants]
                del reference_outputs
                fresh_peak(subject.device)
                try:
                    timed = run_interleaved(subject, again, ticks, report)
                except Exception as error:  # e.g. every variant at once does not fit: keep the sequential results
                    text = f"{type(error).__name__}: {error}".strip()[:600]
                    results = [
                        attrs.evolve(r, info={**r.info, "interleaved": {"error": text}})
                        if r.name in {v.name for v in again}
                        else r
                        for r in results
                    ]
                else:
                    results = [
                        attrs.evolve(
                            r,
                            info={
                                **r.info,
                                "interleaved": {
                                    "ms_per_s_median": timed[r.name].median,
                                    "ms_per_s_p90": timed[r.name].p90,
                                    "ms_per_s_p99": timed[r.name].p99,
                                    "tick_ms_median": timed[r.name].tick_median,
                                    "sm_clock_mhz_median": timed[r.name].sm_clock_mhz_median,
                                },
                            },
                        )
                        if r.name in timed
                        else r
                        for r in results
                    ]
            if profile and kernel_time_measurable(subject.device):  # last: see profile_busy
                results = profile_all(subject, results, ticks, report, variants=ordered)
    finally:
        if bar is not None:
            bar.stop()
    return results


COMPILE_MODE = "reduce-overhead"
DEFAULT_COMPILE_BUDGET_S = 150.0


def _dynamo_counts() -> dict:
    """The torch._dynamo counters this bench reports, as plain numbers (a snapshot)."""
    from torch._dynamo.utils import counters

    return {
        "frames": counters["frames"]["total"],
        "frames_ok": counters["frames"]["ok"],
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": dict(counters["graph_break"]),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


class _WarningLog(logging.Handler):
    """Keeps the first warnings torch._dynamo / torch._inductor log (recompile limit hit, cudagraph skips...)."""

    def __init__(self, keep: int = 8):
        super().__init__(logging.WARNING)
        self.keep = keep
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < self.keep:
            with contextlib.suppress(Exception):
                self.messages.append(record.getMessage().strip().splitlines()[0][:300])


def _clone_outputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _clone_outputs(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_outputs(v) for v in value)
    return value


def _compile_step(runner: Any, compile_fn: Callable) -> Callable[[], None]:
    """Default `install`: compile the runner's whole `step`; returns the undo."""
    runner.step = compile_fn(runner.step)
    return lambda: vars(runner).pop("step", None)


class CompiledRunner:
    """A bench runner whose stock step runs under torch.compile(mode="reduce-overhead").

    `install(runner, compile_fn)` puts compiled code where the runner's step will call it and
    returns an undo (or None); `dynamo_config` is patched around every call (e.g.
    `allow_unspec_int_on_nn_module`). Every call starts a cudagraph-trees step and clones its outputs
    (reduce-overhead overwrites them on the next replay). Per call, torch._dynamo's counters are
    read: compilations during the first call, compilations after it (recompiles, or frames first
    reached later), graph breaks with their reasons, cudagraph skips, and the time of the calls
    that compiled.
    """

    def __init__(
        self,
        runner: Any,
        install: Callable[[Any, Callable], Any] | None = None,
        dynamo_config: Mapping[str, Any] | None = None,
        compile_options: Mapping[str, Any] | None = None,
        note: str = "",
    ):
        self.runner = runner
        self.dynamo_config = dict(dynamo_config or {})
        self.compile_options = dict(compile_options or {})
        self.note = note
        self.calls = 0
        self.first_call_s: float | None = None
        self.compiling_calls_s = 0.0
        self.compiling_ticks: list[int] = []
        self.first_call_compilations = 0
        self.recompilations = 0
        self.failed_frames = 0
        self.graphs = 0
        self.graph_breaks = 0
        self.break_reasons: dict[str, int] = {}
        self.cudagraph_skips = 0
        self.suppress_errors: bool | None = None
        self.warnings = _WarningLog()
        for name in ("torch._dynamo", "torch._inductor"):
            logging.getLogger(name).addHandler(self.warnings)

        def compile_fn(function):
            return torch.compile(function, mode=COMPILE_MODE, **self.compile_options)

        self._undo = (install or _compile_step)(runner, compile_fn)

    def reset(self) -> None:
        self.runner.reset()

    def step(self, **inputs):
        before = _dynamo_counts()
        if self.suppress_errors is None:
            self.suppress_errors = bool(torch._dynamo.config.suppress_errors)
        torch.compiler.cudagraph_mark_step_begin()
        begin = time.perf_counter()
        with torch._dynamo.config.patch(**self.dynamo_config):
            output = self.runner.step(**inputs)
        output = _clone_outputs(output)
        sync(output_device(output))
        seconds = time.perf_counter() - begin
        after = _dynamo_counts()
        compiled = after["frames"] - before["frames"]
        if self.calls == 0:
            self.first_call_s = seconds
            self.first_call_compilations = compiled
        else:
            self.recompilations += compiled
        if compiled:
            self.compiling_calls_s += seconds
            if len(self.compiling_ticks) < 32:
                self.compiling_ticks.append(self.calls)
        self.failed_frames += compiled - (after["frames_ok"] - before["frames_ok"])
        self.graphs += after["graphs"] - before["graphs"]
        self.cudagraph_skips += after["cudagraph_skips"] - before["cudagraph_skips"]
        for reason, count in after["graph_breaks"].items():
            added = count - before["graph_breaks"].get(reason, 0)
            if added:
                self.graph_breaks += added
                key = str(reason)[:200]
                self.break_reasons[key] = self.break_reasons.get(key, 0) + added
        self.calls += 1
        return output

    def stats(self) -> dict:
        return {
            "mode": COMPILE_MODE,
            "compile_options": self.compile_options,
            "dynamo_config": self.dynamo_config,
            "note": self.note,
            "calls": self.calls,
            "first_call_seconds": self.first_call_s,
            "compiling_calls_seconds": self.compiling_calls_s,
            "compiling_ticks": self.compiling_ticks,
            "compilations_first_call": self.first_call_compilations,
            "recompilations": self.recompilations,
            "frames_failed": self.failed_frames,
            "graphs": self.graphs,
            "graph_breaks": self.graph_breaks,
            "graph_break_reasons": dict(sorted(self.break_reasons.items(), key=lambda kv: -kv[1])[:8]),
            "cudagraph_skips": self.cudagraph_skips,
            "suppress_errors": self.suppress_errors,
            "warnings": list(self.warnings.messages),
        }

    def close(self) -> None:
        for name in ("torch._dynamo", "torch._inductor"):
            logging.getLogger(name).removeHandler(self.warnings)
        if callable(self._undo):
            self._undo()
        self._undo = None
        close = getattr(self.runner, "close", None)
        if callable(close):
            close()


def output_device(value: Any) -> torch.device:
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        device = output_device(item)
        if device.type != "cpu":
            return device
    return torch.device("cpu")


def compiled_variant(
    name: str,
    make: Callable[[], Any],
    *,
    install: Callable[[Any, Callable], Any] | None = None,
    dynamo_config: Mapping[str, Any] | None = None,
    compile_options: Mapping[str, Any] | None = None,
    note: str = "",
    budget_s: float | None = DEFAULT_COMPILE_BUDGET_S,
) -> Variant:
    """A compile variant: `make()` builds the stock runner, `install` compiles (default: its whole
    step). Compared with stock eager like every variant; may fail (reported, not raised)."""
    return Variant(
        name,
        lambda: CompiledRunner(make(), install, dynamo_config, compile_options, note),
        info=lambda runner: {"compile": runner.stats()},
        may_fail=True,
        budget_s=budget_s,
    )


def compile_summary(stats: Mapping[str, Any]) -> str:
    first = stats.get("first_call_seconds")
    parts = [
        f"torch.compile({stats.get('mode')!r}"
        + "".join(f", {k}={v!r}" for k, v in (stats.get("compile_options") or {}).items())
        + ")"
    ]
    if stats.get("dynamo_config"):
        parts.append("dynamo " + ", ".join(f"{k}={v!r}" for k, v in stats["dynamo_config"].items()))
    parts.append(
        "first call "
        + ("-" if first is None else f"{first:.1f} s")
        + f", calls that compiled {stats.get('compiling_calls_seconds', 0):.1f} s"
    )
    parts.append(
        f"{stats.get('compilations_first_call', 0)} compilations in the first call, "
        f"{stats.get('recompilations', 0)} after it, {stats.get('graph_breaks', 0)} graph breaks, "
        f"{stats.get('cudagraph_skips', 0)} cudagraph skips"
    )
    if stats.get("frames_failed"):
        parts.append(f"{stats['frames_failed']} frames failed to compile (ran eagerly)")
    if stats.get("suppress_errors"):
        parts.append("torch._dynamo.config.suppress_errors was on")
    for message in stats.get("warnings", [])[:3]:
        parts.append(f"warning: {message}")
    return "; ".join(parts)


def format_table(subject: Subject, results: list[VariantResult]) -> str:
    from duplexcadence.interpreter.plans.plan_text import human_bytes, table

    reference = next(
        (r for r in results if r.bit_identical and r.first_mismatch is None and r.error is None), results[0]
    )
    clocked = any(r.sm_clock_mhz_median is not None for r in results)  # CUDA with NVML
    rows = []
    for r in results:
        if r.error is not None:
            rows.append([r.name, "FAILED", *["-"] * (10 + clocked)])
            continue
        rows.append(
            [
                r.name,
                f"{r.ms_per_s_median:.1f}",
                f"{r.ms_per_s_p90:.1f}",
                f"{r.ms_per_s_p99:.1f}",
                f"{reference.ms_per_s_median / r.ms_per_s_median:.2f}x",
                "-" if r.host_ms_median is None else f"{r.host_ms_median:.3f}",
                "-" if r.gpu_busy_ms_per_s is None else f"{r.gpu_busy_ms_per_s:.1f}",
                "-" if r.busy_fraction is None else f"{r.busy_fraction:.0%}",
                *([_mhz(r.sm_clock_mhz_median)] if clocked else []),
                human_bytes(r.peak_allocated_bytes),
                human_bytes(r.peak_reserved_bytes),
                {True: "yes", False: "NO", None: "-"}[r.bit_identical],
            ]
        )
    lines = [f"{subject.name} on {subject.device}: {subject.description}".rstrip(": ")]
    header = [
        "variant",
        "ms/s median",
        "p90",
        "p99",
        "vs first",
        "host ms/tick",
        "GPU busy ms/s",
        "busy",
        *(["SM MHz"] if clocked else []),
        "peak alloc",
        "peak reserved",
        "== stock eager",
    ]
    lines += table(header, rows, right=tuple(range(1, len(header) - 1)))
    interleaved = [r for r in results if "interleaved" in r.info and "error" not in r.info["interleaved"]]
    failed = next((r.info["interleaved"]["error"] for r in results if "error" in r.info.get("interleaved", {})), None)
    if failed is not None:
        lines.append(f"  the interleaved pass FAILED: {failed}")
    if interleaved:
        first = interleaved[0].info["interleaved"]["ms_per_s_median"]
        clocked = any(r.info["interleaved"].get("sm_clock_mhz_median") is not None for r in interleaved)
        lines.append("  timed again, every variant built at once and stepped in turn each tick:")
        lines += table(
            ["variant", "ms/s median", "p90", "p99", "vs first", "tick ms median", *(["SM MHz"] if clocked else [])],
            [
                [
                    r.name,
                    *(
                        f"{r.info['interleaved'][key]:.1f}"
                        for key in ("ms_per_s_median", "ms_per_s_p90", "ms_per_s_p99")
                    ),
                    f"{first / r.info['interleaved']['ms_per_s_median']:.2f}x",
                    f"{r.info['interleaved']['tick_ms_median']:.3f}",
                    *([_mhz(r.info["interleaved"].get("sm_clock_mhz_median"))] if clocked else []),
                ]
                for r in interleaved
            ],
            right=tuple(range(1, 6 + clocked)),
        )
        for faster, other, sequential, again in pass_disagreements(results):
            lines.append(
                f"  the passes disagree: {faster} is {1 / sequential:.2f}x as fast as {other} sequentially, "
                f"{1 / again:.2f}x interleaved; the interleaved pass is the fairer (docs/benchmarks.md)"
            )
    for r in results:
        if r.first_mismatch:
            lines.append(f"  {r.name}: first mismatch at {r.first_mismatch}")
        if r.error is not None:
            lines.append(f"  {r.name}: FAILED: {r.error}")
        if "busy_error" in r.info:
            lines.append(f"  {r.name}: the GPU busy profile FAILED: {r.info['busy_error']}")
        if r.info.get("compile"):
            lines.append(f"  {r.name}: {compile_summary(r.info['compile'])}")
        if "max_abs_diff_vs_reference" in r.info:
            lines.append(
                f"  {r.name}: not bit-identical by design; max abs difference from "
                f"{results[0].name} {r.info['max_abs_diff_vs_reference']:.3g}"
            )
    return "\n".join(lines)


PASS_DISAGREEMENT = 0.03
"""How much faster one variant must be than another in one timed pass for `pass_disagreements` to report
a pass where it is not (3 %: more than two runs of one command on the H200 differ by in steady state)."""


def pass_disagreements(results: list[VariantResult]) -> list[tuple[str, str, float, float]]:
    """Pairs of variants that the sequential and the interleaved pass rank in opposite orders, where one
    pass has the first at least `PASS_DISAGREEMENT` faster: (faster sequentially, other, ms/s ratio
    sequential, ms/s ratio interleaved), each ratio the first's over the second's. The sequential pass
    gives each variant its own stretch of time and its own place in the order (moshi's whole-step graph,
    for one, runs faster when it is captured before another graph of its kind); the interleaved pass
    shares both."""
    timed = [r for r in results if r.error is None and "ms_per_s_median" in r.info.get("interleaved", {})]
    found = []
    for index, first in enumerate(timed):
        for second in timed[index + 1 :]:
            sequential = first.ms_per_s_median / second.ms_per_s_median
            interleaved = first.info["interleaved"]["ms_per_s_median"] / second.info["interleaved"]["ms_per_s_median"]
            opposite = (sequential - 1) * (interleaved - 1) < 0
            if not opposite or max(abs(sequential - 1), abs(interleaved - 1)) < PASS_DISAGREEMENT:
                continue
            if sequential > 1:  # name first the variant that was faster sequentially
                found.append((second.name, first.name, 1 / sequential, 1 / interleaved))
            else:
                found.append((first.name, second.name, sequential, interleaved))
    return found


def _mhz(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def to_json(subject: Subject, results: list[VariantResult]) -> dict:
    return {
        "model": subject.name,
        "device": str(subject.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(subject.device) if subject.device.type == "cuda" else None,
        "description": subject.description,
        "ticks_per_second": str(subject.ticks_per_second),
        "extra": subject.extra,
        "variants": [r.to_json() for r in results],
        "pass_disagreements": [
            {"faster_sequentially": faster, "other": other, "ratio_sequential": sequential, "ratio_interleaved": again}
            for faster, other, sequential, again in pass_disagreements(results)
        ],
    }


def dump(path: str, payload: dict) -> None:
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
