"""The capture's cuBLAS workspaces and graph pools, as far as the CPU can check them: the workspaces are
dropped before a capture and after it, whatever ends it, and a pool's reserved bytes are its own segments'
(tests/runtime/test_capture_memory_gpu.py checks both on a GPU)."""

from __future__ import annotations

import pytest
import torch

from duplexcadence.interpreter.runtime.capture import graphs


def test_workspaces_are_dropped_before_and_after_the_block_even_when_it_raises(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("clear"), raising=False)
    with graphs.workspaces_in_pool():
        calls.append("capture")
    assert calls == ["clear", "capture", "clear"]
    calls.clear()
    with pytest.raises(RuntimeError, match="capture failed"), graphs.workspaces_in_pool():
        calls.append("capture")
        raise RuntimeError("capture failed")
    assert calls == ["clear", "capture", "clear"]


def test_a_pools_reserved_bytes_are_the_segments_it_owns(monkeypatch):
    segments = [
        {"total_size": 32 << 20, "segment_pool_id": (0, 3)},
        {"total_size": 2 << 20, "segment_pool_id": (0, 3)},
        {"total_size": 20 << 20, "segment_pool_id": (0, 0)},  # the allocator's general pool
        {"total_size": 64 << 20, "segment_pool_id": (0, 4)},  # another lane's
    ]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    assert graphs.pool_reserved_bytes((0, 3)) == 34 << 20
    assert graphs.pool_reserved_bytes((0, 5)) == 0
