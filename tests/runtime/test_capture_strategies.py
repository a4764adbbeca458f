"""Capture strategies chosen by name: the runs each plans (exact, from the plan alone: no GPU), the registry
(built-in names, the `duplexcadence.capture` entry points, a clear error for an unknown name), and
`Runtime.load(capture=...)`. On CPU no graph is captured; the runs a strategy plans are then stepped through
the real step paths with stand-in graphs (`test_replay_path.EagerGraph`) against the general path."""

from __future__ import annotations

import importlib.metadata
from collections import Counter
from pathlib import Path

import pytest
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.loader import stdlib_path
from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter.plans.plan import make_plan
from duplexcadence.interpreter.runtime import capture
from duplexcadence.interpreter.runtime.capture import CaptureStrategy, Run, checked_runs, templates_of
from duplexcadence.interpreter.runtime.replay import StageGraph, resolve_all
from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.tests.runtime.test_replay_path import EagerGraph
from duplexcadence.tests.runtime.test_toy_runtime import codes_stream

TOY = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
TICKS = 60  # every planned instant: the warm-up (20) and a steady period (25), then into the next


def plan_of(path, max_graphs=None):
    return make_plan(load_program(path, {}), max_graphs=max_graphs)


def shapes(runs: tuple[Run, ...]) -> list[tuple[str, tuple[str, ...]]]:
    return [(run.kind, run.stages) for run in runs]


def planned(strategy: str, path, blocked=(), max_graphs=None) -> Counter:
    """How many planned instants get each sequence of runs."""
    chosen = capture.get(strategy)
    return Counter(
        tuple(shapes(checked_runs(chosen, t, frozenset(blocked)))) for t in templates_of(plan_of(path, max_graphs))
    )


GRAPH_ALL = (("graph", ("encode", "attend", "upsample")),)
SPLIT = (("graph", ("encode",)), ("eager", ("attend",)), ("graph", ("upsample",)))
PER_STAGE = (("graph", ("encode",)), ("graph", ("attend",)), ("graph", ("upsample",)))
EAGER = (("eager", ("encode",)), ("eager", ("attend",)), ("eager", ("upsample",)))


def test_the_toy_tail_runs_each_strategy_plans():
    assert planned("fused", TOY) == {GRAPH_ALL: 45}
    assert planned("fused", TOY, blocked={"attend"}) == {SPLIT: 45}
    assert planned("per-stage", TOY) == {PER_STAGE: 45}
    assert planned("per-stage", TOY, blocked={"attend"}) == {SPLIT: 45}
    assert planned("eager", TOY) == {EAGER: 45}
    assert planned("eager", TOY, blocked={"attend"}) == {EAGER: 45}


def test_over_the_graph_budget_a_firing_splits_the_fused_runs_around_it():
    """`max_graphs=4` leaves attend's warm-up shapes (instants 1 to 19) without a planned graph."""
    assert planned("fused", TOY, max_graphs=4) == {GRAPH_ALL: 26, SPLIT: 19}
    assert planned("per-stage", TOY, max_graphs=4) == {PER_STAGE: 26, SPLIT: 19}
    fused = [shapes(capture.get("fused").plan_runs(t, ())) for t in templates_of(plan_of(TOY, max_graphs=4))]
    assert [index for index, runs in enumerate(fused) if tuple(runs) == SPLIT] == list(range(1, 20))


def test_mimi_replays_one_graph_per_frame_fused_and_three_per_stage():
    mimi = stdlib_path("models.mimi_decoder")
    stages = ("upsample", "transformer", "seanet")
    assert planned("fused", mimi) == {(("graph", stages),): 150}
    assert planned("per-stage", mimi) == {tuple(("graph", (s,)) for s in stages): 150}
    assert planned("eager", mimi) == {tuple(("eager", (s,)) for s in stages): 150}
    assert planned("fused", mimi, blocked={"transformer"}) == {
        (("graph", ("upsample",)), ("eager", ("transformer",)), ("graph", ("seanet",))): 150
    }
    templates = templates_of(plan_of(mimi))
    for name, graphs in (("fused", 1), ("per-stage", 3), ("eager", 0)):
        keys = {run.key for t in templates for run in capture.get(name).plan_runs(t, ()) if run.kind == "graph"}
        assert len(keys) == graphs, name  # the distinct graphs a slot captures: every frame repeats them


def test_a_graph_run_is_keyed_by_its_firings_signatures():
    template = templates_of(plan_of(TOY))[0]
    (run,) = capture.get("fused").plan_runs(template, ())
    assert run.key == tuple(f.signature for f in template.firings) and run.firings == template.firings
    assert [r.key for r in capture.get("per-stage").plan_runs(template, ())] == [
        (f.signature,) for f in template.firings
    ]


# --- the registry ---------------------------------------------------------------------------------


def test_the_built_in_strategies_by_name():
    assert capture.available() == ["eager", "fused", "per-stage"]
    assert [capture.get(name).name for name in capture.available()] == ["eager", "fused", "per-stage"]
    assert capture.DEFAULT == "fused"
    assert [capture.get(name).graphs for name in ("fused", "per-stage", "eager")] == [True, True, False]


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError) as caught:
        capture.get("fuse")
    assert (
        str(caught.value) == "no capture strategy named 'fuse'; the registered strategies are eager, fused, per-stage"
    )


class Reversed(CaptureStrategy):
    """Not a legal strategy: its runs do not follow the instant's order."""

    name = "reversed"
    summary = "eager firings in reverse"

    def plan_runs(self, template, blocked):
        return tuple(Run.eager(f) for f in reversed(template.firings))


class GraphEverything(CaptureStrategy):
    """Not a legal strategy: it ignores the blocked stages."""

    name = "graph-everything"
    summary = "one graph, whatever is blocked"

    def plan_runs(self, template, blocked):
        return (Run.graph(template.firings),)


REVERSED = Reversed()
NOT_A_STRATEGY = object()


def fake_entry_points(monkeypatch, **registered: str) -> None:
    entries = [
        importlib.metadata.EntryPoint(name, value, capture.ENTRY_POINT_GROUP) for name, value in registered.items()
    ]
    original = importlib.metadata.entry_points

    def entry_points(**selection):
        if selection.get("group") == capture.ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints(entries)
        return original(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_a_strategy_of_another_distribution_registers_through_an_entry_point(monkeypatch):
    here = "duplexcadence.tests.runtime.test_capture_strategies"
    fake_entry_points(
        monkeypatch,
        reversed=f"{here}:REVERSED",
        broken=f"{here}:NOT_A_STRATEGY",
        misnamed=f"{here}:REVERSED",
        missing="no_such_module_here:STRATEGY",
        fused=f"{here}:REVERSED",
    )
    assert capture.available() == ["broken", "eager", "fused", "misnamed", "missing", "per-stage", "reversed"]
    third_party = capture.get("reversed")  # this file, imported again by its dotted name
    assert type(third_party).__name__ == "Reversed" and third_party.summary == "eager firings in reverse"
    assert capture.get("fused").name == "fused"  # a built-in name wins
    with pytest.raises(
        ValueError, match=r"^capture strategy 'broken' is registered as '.*:NOT_A_STRATEGY', which is not"
    ):
        capture.get("broken")
    with pytest.raises(
        ValueError, match=r"^capture strategy 'misnamed' is registered as .*, a strategy named 'reversed'$"
    ):
        capture.get("misnamed")
    with pytest.raises(
        ValueError, match=r"^capture strategy 'missing' is registered as .*, which does not load: No module"
    ):
        capture.get("missing")


def test_runs_that_break_the_interface_are_refused_with_what_is_wrong():
    template = templates_of(plan_of(TOY))[0]
    with pytest.raises(ValueError) as caught:
        checked_runs(REVERSED, template, ())
    assert str(caught.value) == (
        "capture strategy 'reversed' planned runs of stages [('upsample',), ('attend',), ('encode',)] for an instant "
        "of ['encode', 'attend', 'upsample']: the runs must cover the instant's firings once, in order"
    )
    assert shapes(checked_runs(GraphEverything(), template, ())) == list(GRAPH_ALL)
    with pytest.raises(ValueError) as caught:
        checked_runs(GraphEverything(), template, {"attend"})
    assert str(caught.value) == (
        "capture strategy 'graph-everything' planned a graph run of ['encode', 'attend', 'upsample']: an eager run is "
        "one firing, a graph run holds only firings with a planned graph and an unblocked stage"
    )


# --- Runtime.load(capture=...) ----------------------------------------------------------------------


def test_runtime_load_takes_the_strategy_by_name():
    model = build_toy()
    assert Runtime.load(TOY, model, device="cpu").capture.name == "fused"
    assert Runtime.load(TOY, model, device="cpu", capture="per-stage").capture.name == "per-stage"
    for eager in (dict(capture="eager"), dict(graphs=False), dict(graphs="off"), dict(graphs=False, capture="eager")):
        runtime = Runtime.load(TOY, model, device="cpu", **eager)
        assert runtime.capture.name == "eager" and runtime.report().capture == "eager"
    with pytest.raises(ValueError, match=r"^no capture strategy named 'fastest'; the registered strategies are eager"):
        Runtime.load(TOY, model, device="cpu", capture="fastest")
    with pytest.raises(ValueError) as caught:
        Runtime.load(TOY, model, device="cpu", graphs=False, capture="per-stage")
    assert str(caught.value) == (
        "graphs=False runs every firing eagerly, which is capture='eager', not capture='per-stage'; give one of the two"
    )


def install_planned_graphs(session) -> None:
    """Give `session` the graphs and runs its runtime's strategy plans, as a CUDA capture would, with stand-in
    graphs that run the captured firings' bodies."""
    runtime = session.runtime
    for index, template in enumerate(runtime.templates):
        runs = checked_runs(runtime.capture, template, runtime.blocked)
        for run in runs:
            if run.kind == "graph" and run.key not in session.graphs:
                lengths = runtime.plan.trace.states[run.firings[0].instant][0]
                session.graphs[run.key] = StageGraph(
                    len(session.graphs), EagerGraph(session, run.firings, lengths), {}, 0
                )
        session.runs[index] = runs
    session.replays = resolve_all(runtime.program, session.storage, session.graphs, session.runs)


@pytest.mark.parametrize("strategy,graphs_per_instant", [("fused", 1), ("per-stage", 3)])
def test_each_strategys_runs_step_like_the_general_path(strategy, graphs_per_instant):
    model = build_toy()
    prompt = make_prompt(model, 6)
    replayed = Runtime.load(TOY, model, device="cpu", capture=strategy).session(initial={"cache": prompt})
    install_planned_graphs(replayed)
    general = Runtime.load(TOY, build_toy(), device="cpu", capture="eager").session(initial={"cache": prompt})
    feed = codes_stream()
    for tick in range(TICKS):
        assert torch.equal(replayed.step(**feed(tick)), general.step(**feed(tick))), tick
    counters = replayed.counters
    assert counters.short_path_steps == TICKS and counters.replays == 3 * TICKS and counters.eager_planned == 0
    assert sum(counters.per_graph.values()) == graphs_per_instant * TICKS
    assert general.counters.eager_planned == 3 * TICKS and general.counters.replays == 0


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["fused", "per-stage", "eager"])
def test_gpu_every_strategy_is_bit_identical_to_stock(strategy):
    from duplexcadence.tests.runtime.test_toy_runtime import stock_for

    model = build_toy(device="cuda")
    prompt = make_prompt(model, 6)
    runtime = Runtime.load(TOY, model, device="cuda", capture=strategy)
    report = runtime.verify(stock_for(prompt, "cuda"), codes_stream(device="cuda"), ticks=60, deterministic=True)
    assert report.equal, str(report)
    summary = runtime.report()
    distinct_instants = len({tuple(f.signature for f in t.firings) for t in runtime.templates})
    graphs = {"fused": distinct_instants, "per-stage": len(runtime.plan.capture.graphs), "eager": 0}[strategy]
    assert summary.graphs_captured == graphs and summary.capture == strategy
    assert summary.stage_graphs_covered == (0 if strategy == "eager" else len(runtime.plan.capture.graphs))
    replays_per_tick = 0 if strategy == "eager" else 3
    assert report.runtime_counters.replays == replays_per_tick * 60
    assert report.runtime_counters.eager_planned == (3 * 60 if strategy == "eager" else 0)


def test_planning_runs_needs_no_torch():
    """The interface, the registry and the built-in strategies import nothing that imports torch: a strategy's
    runs are planned from the plan alone (graphs.py, the capture itself, is the runtime's)."""
    import ast

    folder = Path(capture.__file__).parent
    for name in ("__init__.py", "strategy.py", "fused.py", "per_stage.py", "eager.py"):
        tree = ast.parse((folder / name).read_text())
        imported = {
            alias.name if isinstance(node, ast.Import) else node.module
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        assert not {m for m in imported if m and (m.split(".")[0] == "torch" or m.endswith("capture.graphs"))}, name
        assert {m for m in imported if m and m.startswith("duplexcadence.")} <= {
            "duplexcadence.interpreter.plans.plan",
            "duplexcadence.interpreter.plans.trace",
            "duplexcadence.interpreter.runtime.capture.strategy",
        }, name
