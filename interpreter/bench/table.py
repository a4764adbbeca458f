"""The bench's table: one row per variant (ms per duplex second, the median ms per tick, GPU busy, memory, bit-identity),
the interleaved pass beneath, then a line per finding (peak memory over stock's, a mismatch, a failure, a compile
summary, a trace)."""

from __future__ import annotations

from duplexcadence.interpreter.bench.compiled import compile_summary
from duplexcadence.interpreter.bench.results import memory_over_stock, pass_disagreements
from duplexcadence.interpreter.bench.subject import Subject, VariantResult
from duplexcadence.interpreter.bench.trace import trace_line
from duplexcadence.interpreter.plans.plan_text import human_bytes, table


def _mhz(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ms(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(reference_ms: float | None, ms: float | None) -> str:
    """How many times faster than the reference a variant is ("-" where either has no time: it failed)."""
    return "-" if reference_ms is None or ms is None else f"{reference_ms / ms:.2f}x"


def format_table(subject: Subject, results: list[VariantResult]) -> str:
    """The results of `run(subject, ...)` as text: the first line names the subject and device."""
    reference = next(
        (r for r in results if r.bit_identical and r.first_mismatch is None and r.error is None), results[0]
    )
    clocked = any(r.sm_clock_mhz_median is not None for r in results)  # CUDA with NVML
    tick = subject.tick_name
    header = [
        "variant",
        "ms/s median",
        "p90",
        "p99",
        "vs first",
        f"ms/{tick}",
        f"host ms/{tick}",
        "GPU busy ms/s",
        "busy",
        *(["SM MHz"] if clocked else []),
        "peak alloc",
        "peak reserved",
        "== stock eager",
    ]
    rows = []
    for r in results:
        if r.error is not None:
            rows.append([r.name, "FAILED", *["-"] * (len(header) - 2)])
            continue
        rows.append(
            [
                r.name,
                f"{r.ms_per_s_median:.1f}",
                f"{r.ms_per_s_p90:.1f}",
                f"{r.ms_per_s_p99:.1f}",
                _ratio(reference.ms_per_s_median, r.ms_per_s_median),
                _ms(r.tick_ms_median, 3),
                _ms(r.host_ms_median, 3),
                _ms(r.gpu_busy_ms_per_s, 1),
                "-" if r.busy_fraction is None else f"{r.busy_fraction:.0%}",
                *([_mhz(r.sm_clock_mhz_median)] if clocked else []),
                human_bytes(r.peak_allocated_bytes),
                human_bytes(r.peak_reserved_bytes),
                {True: "yes", False: "NO", None: "-"}[r.bit_identical],
            ]
        )
    lines = [f"{subject.name} on {subject.device}: {subject.description}".rstrip(": ")]
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
            [
                "variant",
                "ms/s median",
                "p90",
                "p99",
                "vs first",
                f"ms/{tick}",
                *(["SM MHz"] if clocked else []),
            ],
            [
                [
                    r.name,
                    *(
                        f"{r.info['interleaved'][key]:.1f}"
                        for key in ("ms_per_s_median", "ms_per_s_p90", "ms_per_s_p99")
                    ),
                    f"{first / r.info['interleaved']['ms_per_s_median']:.2f}x",
                    _ms(r.info["interleaved"]["tick_ms_median"], 3),
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
    for over in memory_over_stock(results):
        workspace = next(
            (
                r.memory["cublas_workspace_bytes"]
                for r in results
                if r.memory and r.memory.get("cublas_workspace_bytes")
            ),
            None,
        )
        lines.append(
            f"  {over['variant']}: peak {over['kind']} {human_bytes(over['peak_bytes'])}, over stock by "
            f"{human_bytes(over['over_bytes'])} ({over['stock_variant']}: {human_bytes(over['stock_peak_bytes'])})"
            + (
                f"; a cuBLAS workspace is {human_bytes(workspace)} here, one per stream that runs cuBLAS"
                if workspace and over["kind"] == "allocated"
                else ""
            )
        )
    for r in results:
        reserved = r.info.get("reserved")
        if reserved:
            lines.append(
                f"  {r.name}: peak reserved {human_bytes(reserved['peak_bytes'])} = before it "
                f"{human_bytes(reserved['before_bytes'])} + the arena {human_bytes(reserved['arena_bytes'])} (the plan) "
                f"+ graph pools {human_bytes(reserved['graph_pool_bytes'])} + "
                f"{human_bytes(reserved['unaccounted_bytes'])} unaccounted "
                f"({reserved['unaccounted_bytes'] / reserved['peak_bytes']:.0%})"
            )
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
        if r.info.get("trace"):
            lines.append(trace_line(r.name, r.info["trace"]))
        for finding in r.info.get("capture_blocked", ()):
            lines.append(f"  {r.name}: {finding}")
    return "\n".join(lines)
