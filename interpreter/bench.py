"""One benchmark for every tail: ms per duplex second, GPU busy time, peak memory, bit-identity.

A *subject* (one per example model, `examples/<model>/bench.py: subject(**options)`) says how to
build the model, which stock variants exist (stock eager first: it is the reference for
bit-identity), how to load the DuplexCadence runtime, and the inputs of each tick. The harness runs
every variant in one process on one device, side by side, with the same inputs:

* ms per duplex second: per-tick wall time with a synchronisation around each tick (CUDA events
  agree within noise), grouped into duplex seconds by the clock (12 or 13 Mimi frames a second);
  median, p90 and p99 over seconds, warm-up ticks excluded;
* GPU busy vs wall: kernel time from torch.profiler over a few steady ticks, against their wall time;
* peak memory allocated while the variant is built and run (its weights, state, graph pools and
  activations: every variant builds its own model) and the allocator's reserved high-water;
* bit-identity: every output of every tick `torch.equal` to stock eager's, under deterministic cuDNN.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import attrs
import torch

from .verify import compare, deterministic_cudnn


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
    weights_bytes: int = 0
    extra: dict = attrs.field(factory=dict)


@attrs.frozen
class VariantResult:
    name: str
    ms_per_s_median: float
    ms_per_s_p90: float
    ms_per_s_p99: float
    tick_ms_median: float
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

    def to_json(self) -> dict:
        return attrs.asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    """Kernel time per duplex second and the busy fraction of the wall time, by torch.profiler."""
    if subject.device.type != "cuda":
        return None, None
    activities = [torch.profiler.ProfilerActivity.CUDA]
    _sync(subject.device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profile:
        for tick in range(first, first + count):
            runner.step(**subject.inputs(tick))
        _sync(subject.device)
    wall = time.perf_counter() - start
    kernel_us = sum(event.device_time_total for event in profile.key_averages())
    # device_time_total of the top-level averages counts every kernel once
    busy_s = kernel_us / 1e6
    per_tick_ms = busy_s * 1000 / count
    return per_tick_ms * float(subject.ticks_per_second), min(1.0, busy_s / wall) if wall > 0 else None


def run_variant(subject: Subject, variant: Variant, ticks: int, reference: list | None,
                progress: Callable[[str, int, int], None] | None = None) -> tuple[VariantResult, list]:
    device = subject.device
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base_allocated = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    runner = variant.make()
    runner.reset()
    _sync(device)
    setup_seconds = time.perf_counter() - started
    state_bytes = (torch.cuda.memory_allocated(device) - base_allocated) if device.type == "cuda" else None
    outputs: list = []
    tick_ms: list[float] = []
    mismatch = None
    identical = True if reference is not None and variant.compare else None
    largest_difference = None
    with torch.no_grad():
        for tick in range(ticks):
            inputs = subject.inputs(tick)
            _sync(device)
            begin = time.perf_counter()
            result = runner.step(**inputs)
            _sync(device)
            tick_ms.append((time.perf_counter() - begin) * 1000)
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
        profiled = min(ticks, max(8, int(subject.ticks_per_second * 2)))
        busy_ms, busy_fraction = _busy(runner, subject, ticks - profiled, profiled)  # replays the last inputs
    peak_allocated = peak_reserved = None
    if device.type == "cuda":
        peak_allocated = torch.cuda.max_memory_allocated(device) - base_allocated  # weights and state included
        peak_reserved = torch.cuda.max_memory_reserved(device)
    per_second = [sum(tick_ms[t] for t in second) for second in seconds_of(ticks, subject.ticks_per_second)
                  if second.start >= subject.warmup_ticks]
    steady_ticks = tick_ms[subject.warmup_ticks:] or tick_ms
    if not per_second:
        per_second = [statistics.median(steady_ticks) * float(subject.ticks_per_second)]
    info = variant.info(runner)
    if largest_difference is not None:
        info = {**info, "max_abs_diff_vs_reference": largest_difference}
    result = VariantResult(
        variant.name, statistics.median(per_second), _percentile(per_second, 0.9), _percentile(per_second, 0.99),
        statistics.median(steady_ticks), busy_ms, busy_fraction, peak_allocated, peak_reserved, state_bytes,
        setup_seconds, identical, mismatch, ticks, info)
    del runner
    return result, outputs


def run(subject: Subject, ticks: int, progress: bool = True) -> list[VariantResult]:
    """Every variant of `subject`, reference first, under deterministic cuDNN."""
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
            for variant in ordered:
                result, outputs = run_variant(subject, variant, ticks, reference_outputs, report)
                if variant.reference:
                    reference_outputs = outputs
                    result = attrs.evolve(result, bit_identical=True)
                results.append(result)
    finally:
        if bar is not None:
            bar.stop()
    return results


def format_table(subject: Subject, results: list[VariantResult]) -> str:
    from .plan_report import human_bytes, table

    reference = next((r for r in results if r.bit_identical and r.first_mismatch is None), results[0])
    rows = []
    for r in results:
        rows.append([r.name, f"{r.ms_per_s_median:.1f}", f"{r.ms_per_s_p90:.1f}", f"{r.ms_per_s_p99:.1f}",
                     f"{reference.ms_per_s_median / r.ms_per_s_median:.2f}x",
                     "-" if r.gpu_busy_ms_per_s is None else f"{r.gpu_busy_ms_per_s:.1f}",
                     "-" if r.busy_fraction is None else f"{r.busy_fraction:.0%}",
                     human_bytes(r.peak_allocated_bytes), human_bytes(r.peak_reserved_bytes),
                     {True: "yes", False: "NO", None: "-"}[r.bit_identical]])
    lines = [f"{subject.name} on {subject.device}: {subject.description}".rstrip(": ")]
    lines += table(["variant", "ms/s median", "p90", "p99", "vs first", "GPU busy ms/s", "busy", "peak alloc",
                    "peak reserved", "== stock eager"], rows, right=tuple(range(1, 9)))
    for r in results:
        if r.first_mismatch:
            lines.append(f"  {r.name}: first mismatch at {r.first_mismatch}")
        if "max_abs_diff_vs_reference" in r.info:
            lines.append(f"  {r.name}: not bit-identical by design; max abs difference from "
                         f"{results[0].name} {r.info['max_abs_diff_vs_reference']:.3g}")
    return "\n".join(lines)


def to_json(subject: Subject, results: list[VariantResult]) -> dict:
    return {"model": subject.name, "device": str(subject.device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(subject.device)
            if subject.device.type == "cuda" else None, "description": subject.description,
            "ticks_per_second": str(subject.ticks_per_second), "extra": subject.extra,
            "variants": [r.to_json() for r in results]}


def dump(path: str, payload: dict) -> None:
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
