"""A batched step replayed from a CUDA graph captured at each exact number of rows.

The engine steps the conversations that need a stage this second, and their number changes from second to
second and, inside a decode loop, from step to step as rows finish. Padding the batch to a few sizes would
compute rows nobody asked for; :class:`RowGraphs` instead captures one graph per row count R (1..``rows``) over
static buffers whose first R rows are the step's inputs and outputs, and replays the one for the rows at hand.
The step reads every per-row value (slots, lengths, positions, random counters) from device tensors, so a graph
is valid for any conversations in its rows.

On CUDA each graph is captured the first time its row count runs (or ahead of time, :meth:`RowGraphs.capture`),
after two warm-up calls on a side stream; elsewhere, or with ``capture=False``, the step runs directly: the same
code on the same buffers. The graphs share one memory pool: nothing a graph allocates outlives its replay (its
results are copied into the static output buffers, which live outside the pool), so any graph may overwrite
another's scratch, and one pool holds the largest of them rather than their sum.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.runtime.capture.graphs import workspaces_in_pool

WARMUP_CALLS = 2
"""Calls on a side stream before a capture (PyTorch's recipe: lazy initialisation stays out of the graph)."""


@attrs.define
class RowGraphCounters:
    """What a :class:`RowGraphs` did: graphs captured (and the seconds it took), replays, direct runs."""

    captures: int = 0
    capture_seconds: float = 0.0
    replays: int = 0
    direct: int = 0


class RowGraphs:
    """``step(rows)`` (reads the first ``rows`` rows of its static inputs, writes those of its outputs) replayed
    from a graph per row count (see the module docstring)."""

    def __init__(
        self,
        name: str,
        step: Callable[[int], None],
        rows: int,
        device: torch.device,
        capture: bool = True,
        pool: Any = None,
    ) -> None:
        self.name = name
        self.step = step
        self.rows = rows
        self.device = device
        self.capture_enabled = capture and device.type == "cuda"
        self.pool = pool if pool is not None or not self.capture_enabled else torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.counters = RowGraphCounters()

    def __call__(self, rows: int) -> None:
        if not 1 <= rows <= self.rows:
            raise ValueError(f"{self.name}: {rows} rows asked, the step holds 1..{self.rows}")
        if not self.capture_enabled:
            self.counters.direct += 1
            self.step(rows)
            return
        graph = self.graphs.get(rows)
        if graph is None:
            graph = self._capture(rows)
        graph.replay()
        self.counters.replays += 1

    def capture(self, counts: Iterable[int]) -> None:
        """Capture the graphs of ``counts`` rows ahead of time (no-op where nothing is captured)."""
        if not self.capture_enabled:
            return
        for rows in counts:
            if rows not in self.graphs:
                self._capture(rows)

    def _capture(self, rows: int) -> torch.cuda.CUDAGraph:
        started = time.perf_counter()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.step(rows)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # As the runtime's captures: the graph's cuBLAS workspace lives in its pool, and the warm-up stream's
        # workspace is not kept beside it.
        with workspaces_in_pool(), torch.cuda.graph(graph, pool=self.pool):
            self.step(rows)
        torch.cuda.synchronize(self.device)
        self.graphs[rows] = graph
        self.counters.captures += 1
        self.counters.capture_seconds += time.perf_counter() - started
        return graph
