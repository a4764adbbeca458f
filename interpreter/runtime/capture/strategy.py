"""The interface of a capture strategy, and the records it works on: an instant's template and its runs.

A planned instant is a sequence of firings (`StepTemplate`). A capture strategy splits it into runs
(`Run`): a graph run is one CUDA graph that replays its firings' bodies in order, an eager run is one
firing run eagerly. Which firings may be captured at all is decided before the strategy is asked: a
firing without a planned graph (over the `max_graphs` budget) or of a blocked stage (it syncs with the
host, or its capture failed) runs eagerly whatever the strategy says. The runs are a pure function of
the template and the blocked stages, so they can be asserted without a GPU.

No torch here: a strategy plans runs from the plan alone.

Public: `Run`, `StepTemplate`, `templates_of`, `off_plan_templates`, `CaptureStrategy`, `capturable`,
`checked_runs`.
"""

from __future__ import annotations

import abc
from collections.abc import Collection
from typing import ClassVar

import attrs

from duplexcadence.interpreter.plans.plan import Plan
from duplexcadence.interpreter.plans.trace import Firing


@attrs.frozen
class Run:
    """One run of an instant: `kind` "graph" (its firings captured as one CUDA graph, keyed by their
    signatures) or "eager" (one firing, `key` None)."""

    kind: str
    key: tuple | None
    firings: tuple[Firing, ...]

    @classmethod
    def graph(cls, firings: tuple[Firing, ...] | list[Firing]) -> Run:
        return cls("graph", tuple(f.signature for f in firings), tuple(firings))

    @classmethod
    def eager(cls, firing: Firing) -> Run:
        return cls("eager", None, (firing,))

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(f.stage for f in self.firings)


@attrs.frozen
class StepTemplate:
    """One traced instant, ready to replay: firings, their graph keys (None: eager), input shapes."""

    firings: tuple[Firing, ...]
    keys: tuple[int | None, ...]
    inputs: dict[str, tuple[int, ...]] = attrs.field(hash=False)

    @property
    def key(self) -> tuple:
        """The firings' signatures: the instant's identity."""
        return tuple(f.signature for f in self.firings)

    @classmethod
    def of(cls, firings: list[Firing], graph_key: dict) -> StepTemplate:
        # a feed's shape is always known: an input region has a time axis, and a feed a length
        inputs = {v.region: v.shape for f in firings for v in f.views if v.kind == "feed" and v.shape is not None}
        return cls(tuple(firings), tuple(graph_key.get(f.signature) for f in firings), inputs)


def templates_of(plan: Plan) -> tuple[StepTemplate, ...]:
    """Every planned instant of `plan` (the warm-up, then one steady period) as a template."""
    graph_key = {g.signature: g.key for g in plan.capture.graphs if g.captured}
    return tuple(StepTemplate.of(firings, graph_key) for firings in plan.trace.by_instant())


def off_plan_templates(plan: Plan) -> tuple[StepTemplate, ...]:
    """Every off-plan instant the declared steps lead to (`plan.off_plan.instants`, in that order) as a
    template: a firing is keyed by its planned graph (None over the `max_graphs` budget) or its off-plan one."""
    graph_key = {g.signature: g.key for g in plan.capture.graphs if g.captured} | plan.off_plan.graphs
    return tuple(StepTemplate.of(list(found.firings), graph_key) for found in plan.off_plan.instants)


def capturable(template: StepTemplate, blocked: Collection[str]) -> tuple[bool, ...]:
    """For each firing of the template: whether it may go into a graph (it has a planned graph and its
    stage is not blocked)."""
    return tuple(key is not None and f.stage not in blocked for f, key in zip(template.firings, template.keys))


class CaptureStrategy(abc.ABC):
    """How an instant's firings are grouped into runs.

    `name`: what `Runtime.load(capture=...)` takes; `summary`: one line for the docs and errors;
    `graphs`: False when the strategy captures nothing (every firing runs eagerly, and no stage is
    warmed up or probed for capture)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    graphs: ClassVar[bool] = True

    @abc.abstractmethod
    def plan_runs(self, template: StepTemplate, blocked: Collection[str]) -> tuple[Run, ...]:
        """The instant's runs, in order, covering each firing of the template once; a graph run holds only
        firings that `capturable(template, blocked)` allows."""

    def __repr__(self) -> str:
        return f"<capture strategy '{self.name}'>"


def checked_runs(strategy: CaptureStrategy, template: StepTemplate, blocked: Collection[str]) -> tuple[Run, ...]:
    """`strategy.plan_runs(template, blocked)`, or ValueError saying how the runs break the interface."""
    runs = strategy.plan_runs(template, blocked)
    covered = tuple(f for run in runs for f in run.firings)
    if covered != template.firings:
        raise ValueError(
            f"capture strategy '{strategy.name}' planned runs of stages {[run.stages for run in runs]} for an "
            f"instant of {[f.stage for f in template.firings]}: the runs must cover the instant's firings once, in order"
        )
    allowed = dict(zip(template.firings, capturable(template, blocked)))
    for run in runs:
        if run.kind == "eager" and len(run.firings) == 1:
            continue
        if run.kind != "graph" or not run.firings or not all(allowed[f] for f in run.firings):
            raise ValueError(
                f"capture strategy '{strategy.name}' planned a {run.kind} run of {list(run.stages)}: an eager "
                "run is one firing, a graph run holds only firings with a planned graph and an unblocked stage"
            )
    return runs
