"""Pass 5, capture plan: one CUDA graph per distinct (stage, exact-shape signature).

Every firing of the trace maps to exactly one graph key or to eager (a firing whose shapes are decided at
run time, an advance `up to N`, always to eager). Under a `max_graphs` budget the
rule for which graphs are kept is: graphs used in the steady period first (they replay forever),
then warm-up graphs by how many firings they serve (most first), ties by first use; firings of the
graphs left out run eagerly. Firings outside the plan at run time (a flush chunk, a shape the
trace never saw) also run eagerly and are counted.
"""

from __future__ import annotations

import attrs

from duplexcadence.interpreter.plans.trace import Trace


@attrs.frozen
class GraphPlan:
    """One graph to capture: its key, the stage, the firings (stage firing numbers) that replay it."""

    key: int
    stage: str
    signature: tuple = attrs.field(repr=False)
    firings: tuple[int, ...]
    steady: bool
    captured: bool

    @property
    def shapes(self) -> dict[str, tuple[int, ...] | None]:
        """Region -> shape of the view the stage sees, for reading the plan."""
        return {part[0]: part for part in self.signature[1:] if part[0] != "advances"}


@attrs.frozen
class Replay:
    """What one firing of the trace does: replay graph `key`, or run eagerly (key None)."""

    instant: int
    stage: str
    count: int
    key: int | None


@attrs.frozen
class CapturePlan:
    graphs: tuple[GraphPlan, ...]
    warmup: tuple[Replay, ...]
    steady: tuple[Replay, ...]
    max_graphs: int | None
    eager_rule: str

    @property
    def captured(self) -> list[GraphPlan]:
        return [g for g in self.graphs if g.captured]

    @property
    def eager_firings(self) -> int:
        return sum(r.key is None for r in self.warmup + self.steady)

    def key_for(self, signature: tuple) -> int | None:
        for graph in self.graphs:
            if graph.signature == signature:
                return graph.key if graph.captured else None
        return None


EAGER_RULE = (
    "graphs used in the steady period are kept first, then warm-up graphs by the number of "
    "firings they serve, ties by first use; firings of graphs over the budget, firings whose "
    "shapes are decided at run time (`up to N`), and firings outside the plan, run eagerly"
)


def plan_capture(trace: Trace, max_graphs: int | None = None) -> CapturePlan:
    order: dict[tuple, list] = {}
    for firing in trace.firings:
        if not firing.varies:  # shapes decided at run time: always eager
            order.setdefault(firing.signature, []).append(firing)
    steady_signatures = {f.signature for f in trace.steady()} if trace.periodic else set()
    ranked = sorted(
        order.items(),
        key=lambda item: (item[0] not in steady_signatures, -len(item[1]), item[1][0].instant, item[1][0].stage),
    )
    keep = {sig for sig, _ in ranked[: max_graphs if max_graphs is not None else len(ranked)]}
    graphs = []
    key_of: dict[tuple, int] = {}
    for key, (signature, firings) in enumerate(order.items()):
        key_of[signature] = key
        graphs.append(
            GraphPlan(
                key,
                firings[0].stage,
                signature,
                tuple(f.count for f in firings),
                signature in steady_signatures,
                signature in keep,
            )
        )

    def replay(firing) -> Replay:
        key = key_of[firing.signature] if firing.signature in keep and not firing.varies else None
        return Replay(firing.instant, firing.stage, firing.count, key)

    warmup = tuple(replay(f) for f in trace.warmup())
    steady = tuple(replay(f) for f in trace.steady())
    return CapturePlan(tuple(graphs), warmup, steady, max_graphs, EAGER_RULE)
