"""A bench run as JSON (the schema of docs/benchmarks/*.json), and where its two timed passes disagree."""

from __future__ import annotations

import json

import torch

from duplexcadence.interpreter.bench.subject import Subject, VariantResult

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
    timed = [
        (r, r.ms_per_s_median)
        for r in results
        if r.error is None and r.ms_per_s_median is not None and "ms_per_s_median" in r.info.get("interleaved", {})
    ]
    found = []
    for index, (first, first_ms_per_s) in enumerate(timed):
        for second, second_ms_per_s in timed[index + 1 :]:
            sequential = first_ms_per_s / second_ms_per_s
            interleaved = first.info["interleaved"]["ms_per_s_median"] / second.info["interleaved"]["ms_per_s_median"]
            opposite = (sequential - 1) * (interleaved - 1) < 0
            if not opposite or max(abs(sequential - 1), abs(interleaved - 1)) < PASS_DISAGREEMENT:
                continue
            if sequential > 1:  # name first the variant that was faster sequentially
                found.append((second.name, first.name, 1 / sequential, 1 / interleaved))
            else:
                found.append((first.name, second.name, sequential, interleaved))
    return found


def memory_over_stock(results: list[VariantResult]) -> list[dict]:
    """Every variant whose peak allocated or peak reserved memory is above the reference's (stock eager: the
    first result, which `run` times first) in the same run, one entry per `kind` ("allocated", "reserved"):
    its name and peak, the reference's, and by how much."""
    if not results:
        return []
    reference = results[0]
    found = []
    for r in results[1:]:
        for kind, peak, stock in (
            ("allocated", r.peak_allocated_bytes, reference.peak_allocated_bytes),
            ("reserved", r.peak_reserved_bytes, reference.peak_reserved_bytes),
        ):
            if peak is not None and stock is not None and peak > stock:
                found.append(
                    {
                        "variant": r.name,
                        "kind": kind,
                        "peak_bytes": peak,
                        "stock_variant": reference.name,
                        "stock_peak_bytes": stock,
                        "over_bytes": peak - stock,
                    }
                )
    return found


def to_json(subject: Subject, results: list[VariantResult]) -> dict:
    """The run as the JSON of docs/benchmarks/*.json: the subject, the environment, every variant's
    `VariantResult` (ms per duplex second and per tick, memory, bit-identity, `info`), and the variants
    whose peak allocated or reserved memory is above stock eager's (`memory_over_stock`)."""
    return {
        "model": subject.name,
        "device": str(subject.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(subject.device) if subject.device.type == "cuda" else None,
        "driver": driver_version() if subject.device.type == "cuda" else None,
        "description": subject.description,
        "ticks_per_second": str(subject.ticks_per_second),
        "tick_name": subject.tick_name,
        "warmup_ticks": subject.warmup_ticks,
        "extra": subject.extra,
        "variants": [r.to_json() for r in results],
        "memory_over_stock": memory_over_stock(results),
        "pass_disagreements": [
            {"faster_sequentially": faster, "other": other, "ratio_sequential": sequential, "ratio_interleaved": again}
            for faster, other, sequential, again in pass_disagreements(results)
        ],
    }


def driver_version() -> str | None:
    """The NVIDIA driver's version (NVML, through nvidia-ml-py), or None where it cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no nvidia-ml-py, no driver: the JSON says null
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def dump(path: str, payload: dict) -> None:
    """Write `payload` (from `to_json`) to `path`."""
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1, sort_keys=True, default=str)
