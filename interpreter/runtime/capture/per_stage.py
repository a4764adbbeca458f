"""The `per-stage` capture strategy: one graph per capturable firing.

Each firing replays its own graph (one launch per stage firing instead of one per instant): more
launches, but a graph per (stage, signature), shared by every instant that repeats that firing, so
fewer graphs and less capture time when the instants differ in a few stages only.
"""

from __future__ import annotations

from collections.abc import Collection

from duplexcadence.interpreter.runtime.capture.strategy import CaptureStrategy, Run, StepTemplate, capturable


class PerStage(CaptureStrategy):
    name = "per-stage"
    summary = "one graph per capturable firing, each stage replayed on its own"

    def plan_runs(self, template: StepTemplate, blocked: Collection[str]) -> tuple[Run, ...]:
        return tuple(
            Run.graph((firing,)) if graphable else Run.eager(firing)
            for firing, graphable in zip(template.firings, capturable(template, blocked))
        )


STRATEGY = PerStage()
