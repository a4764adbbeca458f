"""The per-operation trace of a profiled stretch of ticks (`dsl bench --trace DIR`): the profile as a Chrome
trace file (open it in Perfetto or chrome://tracing), and a summary of its device operations: how many
kernels and copies, their busy time, the span from the first to the last, the idle time inside it and the
largest gaps with the operations on both sides."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

GAPS_LISTED = 8
OPERATIONS_LISTED = 10


def gpu_operations(profile: Any) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel, memcpy and memset a torch.profiler saw on the device, in
    start order (kernels inside CUDA-graph replays included: CUPTI traces them)."""
    operations = []
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.time_range.end > event.time_range.start:
            operations.append((event.time_range.start, event.time_range.end, event.name))
    return sorted(operations)


def timeline_summary(operations: list[tuple[float, float, str]], top: int = GAPS_LISTED) -> dict:
    """Counts, busy time (the union of the operations' intervals), span, idle time, the `top` largest gaps
    and the operations with the most summed time, of a list of (start us, end us, name) in start order."""
    if not operations:
        return {"operations": 0}
    busy = 0.0
    covered_until = operations[0][0]
    gaps = []
    for index, (start, end, name) in enumerate(operations):
        if start > covered_until and index:
            gaps.append((start - covered_until, operations[index - 1][2], name))
        busy += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    span = covered_until - operations[0][0]
    kinds = {"memcpy": 0, "memset": 0, "kernel": 0}
    by_name: dict[str, list] = {}
    for start, end, name in operations:
        lowered = name.lower()
        kinds["memcpy" if "memcpy" in lowered else "memset" if "memset" in lowered else "kernel"] += 1
        entry = by_name.setdefault(name[:160], [0, 0.0])
        entry[0] += 1
        entry[1] += end - start
    gaps.sort(reverse=True)
    heaviest = sorted(by_name.items(), key=lambda item: -item[1][1])[:OPERATIONS_LISTED]
    return {
        "operations": len(operations),
        **kinds,
        "busy_us": busy,
        "span_us": span,
        "idle_us": span - busy,
        "largest_gaps": [
            {"us": round(gap, 2), "after": before[:80], "before": after[:80]} for gap, before, after in gaps[:top]
        ],
        "heaviest": [{"name": name, "count": count, "us": round(us, 2)} for name, (count, us) in heaviest],
    }


def trace_file(directory: str | Path, subject_name: str, variant_name: str) -> Path:
    """`DIR/<subject>-<variant>.trace.json`, the names lowered and reduced to letters, digits and dashes."""

    def slug(text: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "variant"

    return Path(directory) / f"{slug(subject_name)}-{slug(variant_name)}.trace.json"


def write_trace(profile: Any, path: Path, ticks: int) -> dict:
    """Write `profile` as a Chrome trace to `path`; returns the summary of its device operations over `ticks`
    ticks, with the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    profile.export_chrome_trace(str(path))
    return {"path": str(path), "ticks": ticks, **timeline_summary(gpu_operations(profile))}


def trace_line(variant_name: str, summary: dict) -> str:
    """One line of the table for a variant's trace."""
    if not summary.get("operations"):
        return f"  {variant_name}: trace {summary['path']} ({summary['ticks']} ticks, no device operations)"
    per_tick = summary["ticks"] or 1
    return (
        f"  {variant_name}: trace {summary['path']}: {summary['operations'] / per_tick:.0f} device operations a tick "
        f"({summary['kernel'] / per_tick:.0f} kernels, {summary['memcpy'] / per_tick:.0f} copies), "
        f"busy {summary['busy_us'] / per_tick:.1f} us, idle {summary['idle_us'] / per_tick:.1f} us a tick"
    )
