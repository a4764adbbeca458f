"""Replay of captured graph runs on addresses resolved once: what the short path of a step replays.

An on-plan step whose instant is made only of graph runs skips re-deriving its views from the firings:
the views its inputs are copied into and its outputs are cloned from are resolved for every planned
instant when the slot captures, and shared by the slot's later sessions (a slot's addresses do not
change). A step that cannot take the short path (an eager firing, an input off the planned shape, the
last instant) still replays the graphs whose firings it repeats (`matching_runs`).

Public: `StageGraph`, `GraphReplay`, `resolve_replays`, `resolve_all`, `matching_runs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.trace import Firing
from duplexcadence.interpreter.runtime.capture.strategy import Run
from duplexcadence.interpreter.runtime.storage import RegionStorage


@attrs.define
class StageGraph:
    """A captured graph run (capture/graphs.py): its number in the slot, the CUDA graph, the module outputs
    it leaves (writes without a length, read after each replay), and how long its capture took."""

    key: int
    graph: Any
    module_outputs: dict[str, torch.Tensor]
    capture_seconds: float


@attrs.frozen
class GraphReplay:
    """One graph run of a planned instant with its addresses resolved once per slot: the views its inputs
    are copied into, the graph, and the views its outputs are cloned from."""

    feeds: tuple[tuple[str, torch.Tensor], ...] = attrs.field(repr=False)
    graph: StageGraph = attrs.field(repr=False)
    firings: tuple[Firing, ...]
    rng: bool
    outputs: tuple[tuple[str, torch.Tensor], ...] = attrs.field(repr=False)


def resolve_replays(
    program: Program, storage: Mapping[str, RegionStorage], graphs: Mapping[tuple, StageGraph], runs: Sequence[Run]
) -> tuple[GraphReplay, ...] | None:
    """The resolved graph runs of one planned instant; None when it has an eager run (or a feed that goes
    through a staging copy): such an instant takes the general path."""
    if not runs or any(run.kind != "graph" for run in runs):
        return None
    resolved = []
    for run in runs:
        assert run.key is not None, "a graph run is keyed by its firings' signatures"
        graph = graphs[run.key]
        feeds, outputs = [], []
        for firing in run.firings:
            for view in firing.views:
                if view.kind == "feed":
                    assert view.length is not None, "a feed's length is the units it brings"
                    target = storage[view.region].append_target(view.offset, view.length)
                    if target is None:
                        return None
                    feeds.append((view.region, target))
                elif view.kind == "write" and program.regions[view.region].role == "output":
                    axis = program.regions[view.region].time_axis
                    assert axis is not None, "an output region has a time axis"
                    source = (
                        graph.module_outputs[view.region]
                        if view.length is None
                        else storage[view.region].view(view.transient).narrow(axis, view.offset, view.length)
                    )
                    outputs.append((view.region, source))
        rng = any(program.stages[f.stage].rng for f in run.firings)
        resolved.append(GraphReplay(tuple(feeds), graph, run.firings, rng, tuple(outputs)))
    return tuple(resolved)


def resolve_all(
    program: Program,
    storage: Mapping[str, RegionStorage],
    graphs: Mapping[tuple, StageGraph],
    runs: Mapping[int, Sequence[Run]],
) -> dict[int, tuple[GraphReplay, ...] | None]:
    """`resolve_replays` of every planned instant, once, when the slot's graphs are captured: each warm-up
    instant is stepped once per session, so resolving on first use would cost every warm-up step (the
    same views serve every later session of the slot: its addresses do not change)."""
    return {index: resolve_replays(program, storage, graphs, instant) for index, instant in runs.items()}


def matching_runs(graphs: Mapping[tuple, StageGraph], firings: Sequence[Firing]) -> tuple[Run, ...]:
    """Firings stepped off the template path: the longest captured run of consecutive firings whose
    signatures match (a session back on a planned shape after a short instant replays its graphs
    again: same shapes and offsets, same addresses), else eager."""
    runs: list[Run] = []
    start = 0
    while start < len(firings):
        for end in range(len(firings), start, -1):
            key = tuple(f.signature for f in firings[start:end])
            if key in graphs:
                runs.append(Run("graph", key, tuple(firings[start:end])))
                start = end
                break
        else:
            runs.append(Run.eager(firings[start]))
            start += 1
    return tuple(runs)
