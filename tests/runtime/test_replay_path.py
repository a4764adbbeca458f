"""The on-plan short path (replay.py, `Session.step`): a planned instant made only of graph runs is stepped on
views resolved once per session. On CPU the graphs are stand-ins that run the captured firings' bodies
eagerly, so the path's own work (feeds, counters, output clones, failure handling) is checked against the
general path here; the GPU tests check it with real CUDA graphs against stock."""

from __future__ import annotations

import pytest
import torch

from duplexcadence.interpreter.runtime.errors import SessionFailed, StepError
from duplexcadence.interpreter.runtime.replay import StageGraph, resolve_all
from duplexcadence.interpreter.runtime.session import Session
from duplexcadence.tests.runtime.test_toy_runtime import TICKS, codes_stream, make


class EagerGraph:
    """A CPU stand-in for a captured CUDA graph: `replay()` runs the captured firings' bodies, at the bound
    lengths of the instant they were planned at (what a real graph has baked in)."""

    def __init__(self, session, firings, lengths, fail_at_instant=None):
        self.session, self.firings, self.lengths = session, firings, dict(lengths)
        self.fail_at_instant = fail_at_instant

    def replay(self):
        if self.session.instant == self.fail_at_instant:
            raise RuntimeError("boom")
        self.session.body.bound_lengths = dict(self.lengths)
        for firing in self.firings:
            self.session.body.run(firing)


def install_eager_graphs(session, fail_at_instant=None):
    """Give `session` the runs and graphs a CUDA capture would (every planned firing graphed)."""
    runtime = session.runtime
    for index, template in enumerate(runtime.templates):
        runs = runtime.capture.plan_runs(template, runtime.blocked)
        for run in runs:
            if run.kind == "graph" and run.key not in session.graphs:
                lengths = runtime.plan.trace.states[run.firings[0].instant][0]
                graph = EagerGraph(session, run.firings, lengths, fail_at_instant)
                session.graphs[run.key] = StageGraph(len(session.graphs), graph, {}, 0.0)
        session.runs[index] = runs
    session.replays = resolve_all(
        runtime.program, session.storage, session.graphs, session.runs
    )  # as the capture does, once


def sessions_pair():
    replayed_runtime, prompt = make()
    general_runtime, _ = make()
    replayed = replayed_runtime.session(initial={"cache": prompt})
    install_eager_graphs(replayed)
    return replayed, general_runtime.session(initial={"cache": prompt})


def test_replayed_steps_equal_the_general_path_and_skip_it(monkeypatch):
    replayed, general = sessions_pair()
    feed = codes_stream()
    addresses = replayed.data_ptrs()
    replayed.step(**feed(0))
    general.step(**feed(0))

    def general_path(self, step):
        raise AssertionError("an on-plan instant of graph runs took the general path")

    execute = Session.execute
    monkeypatch.setattr(
        Session, "execute", lambda self, step: general_path(self, step) if self is replayed else execute(self, step)
    )
    for tick in range(1, TICKS):
        ours, theirs = replayed.step(**feed(tick)), general.step(**feed(tick))
        assert torch.equal(ours, theirs), tick
        assert ours.data_ptr() != replayed.storage["pcm"].flat.data_ptr()  # a clone, not the region
    assert replayed.data_ptrs() == addresses
    assert replayed.instant == general.instant == TICKS
    assert replayed.counters.steps == TICKS
    assert replayed.counters.replays == 3 * TICKS  # three firings an instant, each replayed
    assert sum(replayed.counters.per_graph.values()) == TICKS  # one fused run an instant
    assert replayed.counters.eager_planned == replayed.counters.eager_off_plan == 0
    assert replayed.counters.short_path_steps == TICKS and general.counters.short_path_steps == 0
    assert replayed.runtime.report().short_path_steps == TICKS
    assert all(replays is not None for replays in replayed.replays.values())
    assert set(replayed.replays) == set(range(len(replayed.runtime.templates)))
    assert torch.equal(replayed.region("cache"), general.region("cache"))  # the simulator catches up
    replayed.close()  # a closed session's counts stay in its runtime's report
    report = replayed.runtime.report()
    assert (report.short_path_steps, report.replays, report.eager_planned) == (TICKS, 3 * TICKS, 0)


def test_resolved_feeds_and_outputs_are_views_of_the_session_regions():
    replayed, _ = sessions_pair()
    replayed.step(**codes_stream()(0))
    (run,) = replayed.replays[0]
    assert [name for name, _ in run.feeds] == ["codes"] and [name for name, _ in run.outputs] == ["pcm"]
    assert run.feeds[0][1].data_ptr() == replayed.storage["codes"].flat.data_ptr()
    assert run.outputs[0][1].data_ptr() == replayed.storage["pcm"].flat.data_ptr()
    assert tuple(run.outputs[0][1].shape) == (1, 4, 2)
    assert run.rng  # the toy's upsample draws noise: its replay runs in the session's RNG scope


def test_a_replay_that_raises_fails_the_session_with_the_stage_named():
    runtime, prompt = make()
    session = runtime.session(initial={"cache": prompt})
    install_eager_graphs(session, fail_at_instant=2)
    feed = codes_stream()
    session.step(**feed(0))
    session.step(**feed(1))
    with pytest.raises(SessionFailed) as raised:
        session.step(**feed(2))
    assert str(raised.value) == (
        "stage 'encode' (module 'encoder' called as (codes i64[1, 1])) raised at instant 2: RuntimeError('boom'); "
        "the session refuses further steps until reset()"
    )
    assert session.instant == 2 and session.counters.steps == 2
    with pytest.raises(
        SessionFailed,
        match=r"^the session failed at instant 2 \(RuntimeError\('boom'\)\); call "
        r"reset\(\) to start it again$",
    ):
        session.step(**feed(2))


def test_bad_inputs_get_the_general_paths_errors_and_change_nothing():
    replayed, general = sessions_pair()
    feed = codes_stream()
    for session in (replayed, general):
        session.step(**feed(0))
    errors = []
    for session in (replayed, general):
        with pytest.raises(StepError) as raised:
            session.step(codes=feed(1)["codes"].float())
        errors.append(str(raised.value))
    assert errors[0] == errors[1] and "codes" in errors[0]
    assert replayed.instant == 1 and replayed.counters.replays == 3
    assert torch.equal(replayed.step(**feed(1)), general.step(**feed(1)))
