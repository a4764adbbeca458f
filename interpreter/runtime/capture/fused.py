"""The `fused` capture strategy (the default): an instant's consecutive capturable firings as one graph.

An instant replays with as few launches as possible (Mimi's three stages replay as one launch per
frame); a firing that cannot be captured (a blocked stage, or over the `max_graphs` budget) splits the
instant into runs around it.
"""

from __future__ import annotations

from collections.abc import Collection

from duplexcadence.interpreter.plans.trace import Firing
from duplexcadence.interpreter.runtime.capture.strategy import CaptureStrategy, Run, StepTemplate, capturable


class Fused(CaptureStrategy):
    name = "fused"
    summary = "an instant's consecutive capturable firings as one graph, split around the others"

    def plan_runs(self, template: StepTemplate, blocked: Collection[str]) -> tuple[Run, ...]:
        runs: list[Run] = []
        current: list[Firing] = []
        for firing, graphable in zip(template.firings, capturable(template, blocked)):
            if graphable:
                current.append(firing)
                continue
            if current:
                runs.append(Run.graph(current))
                current = []
            runs.append(Run.eager(firing))
        if current:
            runs.append(Run.graph(current))
        return tuple(runs)


STRATEGY = Fused()
