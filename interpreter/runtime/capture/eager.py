"""The `eager` capture strategy: no graphs, every firing runs its body eagerly (what `graphs=False` means).

Nothing is warmed up, probed or captured, and no graph pool is made: for debugging, for profiling the
stages one by one, or for a model whose stages cannot be captured at all.
"""

from __future__ import annotations

from collections.abc import Collection

from duplexcadence.interpreter.runtime.capture.strategy import CaptureStrategy, Run, StepTemplate


class Eager(CaptureStrategy):
    name = "eager"
    summary = "no graphs: every firing runs eagerly"
    graphs = False

    def plan_runs(self, template: StepTemplate, blocked: Collection[str]) -> tuple[Run, ...]:
        return tuple(Run.eager(firing) for firing in template.firings)


STRATEGY = Eager()
