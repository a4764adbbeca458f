"""Peak memory of a variant: a fresh peak before it is built, and the peak split into weights, state and the rest."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any

import torch

from duplexcadence.interpreter.bench.subject import Subject


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


def cublas_workspace_bytes(device: torch.device) -> int | None:
    """The bytes PyTorch allocates for a cuBLAS workspace on `device`: one per stream cuBLAS runs on, the
    first time it does (32 MiB by default on Hopper; `CUBLAS_WORKSPACE_CONFIG`). Measured on the current
    stream, after the workspaces are dropped, by one small matmul; None off CUDA or where the workspaces
    cannot be dropped."""
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if device.type != "cuda" or clear_workspaces is None:
        return None
    torch.cuda.synchronize(device)
    clear_workspaces()
    matrix = torch.ones(8, 8, device=device)
    before = torch.cuda.memory_allocated(device)
    product = matrix @ matrix
    del product
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device) - before


def reserved_accounting(runner: Any, before: int | None, peak: int | None) -> dict | None:
    """For a runner that holds a DuplexCadence runtime (`runner.runtime`), on CUDA: its peak reserved memory
    against what the runtime accounts for: what was reserved before the variant was built (`before`), the
    arena's segment (the plan's `ArenaPlan.reserved_bytes`) and the graph pools (measured after each capture);
    `unaccounted_bytes` is the rest (eager caches the pools cannot use, workspaces, allocator segments). None
    for any other runner, or off CUDA."""
    report = getattr(getattr(runner, "runtime", None), "report", None)
    if report is None or before is None or peak is None:
        return None
    numbers = report()
    accounted = before + numbers.arena_reserved_bytes + numbers.graph_pool_bytes
    return {
        "before_bytes": before,
        "arena_bytes": numbers.arena_reserved_bytes,
        "graph_pool_bytes": numbers.graph_pool_bytes,
        "accounted_bytes": accounted,
        "peak_bytes": peak,
        "unaccounted_bytes": peak - accounted,
    }


def module_bytes(root: Any, device: torch.device, depth: int = 4) -> int:
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
        weights, weights_in_peak, weights_source = module_bytes(runner, subject.device), True, "modules"
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
