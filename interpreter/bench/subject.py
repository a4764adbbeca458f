"""The records of a bench: a `Subject` (a tail to measure), its `Variant`s, and a `VariantResult` per variant."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import attrs
import torch


@attrs.define
class Variant:
    """A way of running the tail: `make()` returns an object with `reset()` and `step(**inputs)` (and
    optionally `close()`).

    `reference`: stock eager, against which every other variant's outputs are compared.
    `info(runner)` collects what the variant wants reported (graphs captured, capture seconds...).
    `outputs`: the reference's outputs this variant produces and is compared on (None: all of them), for a
    variant that leaves out work no output of its own depends on (PersonaPlex with `other_mimi` pruned).
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
    # The bench reports the largest over the ticks in `info["max_abs_diff_vs_reference"]`.
    difference: Callable[[int, Mapping, Mapping], float] | None = None
    outputs: tuple[str, ...] | None = None


@attrs.define
class Subject:
    """A benchmarked tail: its variants, its inputs, and how many ticks make a duplex second.

    `inputs(tick)` gives the keyword inputs of one `step`; `tick_name` says what one tick is (a Mimi
    "frame", a one-second "chunk"), for the per-tick columns of the table.
    """

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
    tick_name: str = "tick"


@attrs.frozen
class VariantResult:
    """What one variant measured. Milliseconds per duplex second (`ms_per_s_*`) and per tick (`tick_ms_*`)
    are over the ticks after the warm-up; every field is None for a variant that failed (`error`)."""

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
    memory: dict | None = None  # see memory.memory_breakdown
    error: str | None = None  # why a `may_fail` variant failed (its numbers are then None)
    host_ms_median: float | None = None  # a steady tick's time until `step` returns, before the synchronisation
    sm_clock_mhz_median: float | None = None  # the SM clock read after each steady tick (NVML; None off CUDA)
    tick_ms_p90: float | None = None
    tick_ms_p99: float | None = None

    def to_json(self) -> dict:
        return attrs.asdict(self)


def option_flag(value: object) -> bool:
    """An on/off `--option KEY=VALUE` of `dsl bench` (1, true, yes, on) as a bool."""
    return str(value).lower() in ("1", "true", "yes", "on")
