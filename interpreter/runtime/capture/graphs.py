"""Capturing a session slot's CUDA graphs, ahead of time, as its capture strategy plans the runs.

A slot's addresses are known before any tick, so the graph for a warm-up instant is captured before
the instant happens. First every planned (stage, signature) is warmed up and probed for what a graph
cannot hold (capture/obstacles.py: host reads of device values, host-device copies, caller-owned tensors
outside the arena, every other host synchronisation; a stage with any is blocked, with one located
diagnostic per obstacle, and runs eagerly); then each planned instant's graph runs are captured, each as
one CUDA graph, in the lane's graph pool and on the lane's stream.

Public: `capture_slot`, `probe_stage`, `host_counters_seen`, `collector_paused`, `workspaces_in_pool`,
`pool_reserved_bytes`, `sync_debug`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from collections.abc import Callable, Collection, Generator
from typing import Any

import attrs
import torch

from duplexcadence.dsl import messages
from duplexcadence.interpreter.plans.trace import Firing
from duplexcadence.interpreter.runtime.binding import tensors_in
from duplexcadence.interpreter.runtime.capture.obstacles import (
    RecordedCounters,
    counter_obstacles,
    diagnostics_of,
    find_obstacles,
    owned_pointers,
)
from duplexcadence.interpreter.runtime.capture.strategy import CaptureStrategy, Run, StepTemplate, checked_runs
from duplexcadence.interpreter.runtime.errors import CaptureWarning
from duplexcadence.interpreter.runtime.lanes import lane_stream
from duplexcadence.interpreter.runtime.replay import StageGraph
from duplexcadence.interpreter.runtime.session import Session, call_in_session


def capture_slot(session: Session, strategy: CaptureStrategy) -> None:
    """Capture the graphs of `session`'s slot into `session.graphs`, and each planned instant's runs into
    `session.runs` (by template index); then the graph runs of every off-plan instant the runtime's declared
    steps lead to (`plan.off_plan`), which a step finds by their firings' signatures (replay.matching_runs).
    The session is reset afterwards.

    The warm-up runs on the caller's current stream and only the captures on the lane's stream, as
    `torch.cuda.graph` users do: eager work of a model on a side stream puts the process in a state
    where every CUDA graph replays slower from then on (about 0.3 us more between any two kernels:
    about 180 us, 11 % of a Mimi frame on the H200; docs/benchmarks.md, "CUDA graph replay on the H200").
    """
    runtime = session.runtime
    stream = lane_stream(runtime.device, session.lane)  # captures only (each with its workspaces in the pool)
    trace = runtime.plan.trace
    for graph_plan in runtime.plan.capture.captured:
        firing = runtime.first_firing[graph_plan.signature]
        stage = runtime.program.stages[firing.stage]
        if stage.name in runtime.blocked:
            continue
        try:
            obstacles = _probe(session, firing, trace.states[firing.instant][0])
        except Exception as error:  # the stage raised: plan it eager, say where
            _block(session, stage, error, stacklevel=4)
        else:
            if obstacles:
                _block_obstacles(session, stage, diagnostics_of(stage.name, obstacles, stage.span), stacklevel=4)
    _probe_off_plan(session)
    for index, template in enumerate(runtime.templates):
        session.runs[index] = _capture_template(
            session,
            strategy,
            template,
            functools.partial(_capture_run, session, stream=stream, lengths=trace.states[index][0]),
            runtime.blocked.keys,
            functools.partial(_block, session, stacklevel=5),
        )
    for template, found in zip(runtime.off_plan_templates, runtime.plan.off_plan.instants):
        _capture_template(
            session,
            strategy,
            template,
            functools.partial(_capture_run, session, stream=stream, lengths=found.lengths),
            functools.partial(_blocked_off_plan, runtime, found.last),
            functools.partial(_block_off_plan, session, last=found.last, stacklevel=5),
        )
    session.reset()
    runtime.pool_bytes[session.lane] = pool_reserved_bytes(runtime.pools[session.lane])


def _probe(session: Session, firing: Firing, lengths: dict[str, int]) -> list:
    """`probe_stage` on storage filled with zeros, drawing from the session's generator state."""
    runtime = session.runtime
    for storage in session.storage.values():
        storage.fill_zero()
    try:
        stage = runtime.program.stages[firing.stage]
        return call_in_session(session, stage.rng, probe_stage, session, firing, lengths)
    finally:
        torch.cuda.synchronize(runtime.device)


def _probe_off_plan(session: Session) -> None:
    """Probe each stage once more for each kind of off-plan firing its planned firings are not (the last
    instant of a stream, which hooks see as `firing.last`), at its first off-plan graph: a stage whose probe
    finds an obstacle, or that raises, runs eagerly at such instants only (`Runtime.off_plan_blocked`). Once
    for the runtime's slots (`Runtime.off_plan_probed`)."""
    runtime = session.runtime
    planned = (runtime.first_firing[g.signature] for g in runtime.plan.capture.captured)
    probed = runtime.off_plan_probed | {(firing.stage, firing.last) for firing in planned}
    for found in runtime.plan.off_plan.instants:
        for firing in found.firings:
            kind = (firing.stage, firing.last)
            if (
                kind in probed
                or firing.stage in runtime.blocked
                or firing.signature not in runtime.plan.off_plan.graphs
            ):
                continue
            probed.add(kind)
            runtime.off_plan_probed.add(kind)
            stage = runtime.program.stages[firing.stage]
            try:
                obstacles = _probe(session, firing, found.lengths)
            except Exception as error:
                _block_off_plan(session, stage, error, firing.last, stacklevel=5)
                continue
            if obstacles:
                diagnostics = diagnostics_of(stage.name, obstacles, stage.span)
                runtime.off_plan_blocked.setdefault(firing.last, {})[stage.name] = diagnostics[0]
                listed = "; ".join(d.message.split(": ", 1)[1] for d in diagnostics)
                warnings.warn(
                    f"stage '{stage.name}' cannot be captured at {_off_plan_kind(firing.last)}: {listed}; "
                    "it runs eagerly there",
                    CaptureWarning,
                    stacklevel=4,
                )


def _blocked_off_plan(runtime, last: bool) -> Collection[str]:
    """The stages that run eagerly at off-plan instants of this kind (`last` or not)."""
    return runtime.blocked.keys() | runtime.off_plan_blocked.get(last, {}).keys()


def _off_plan_kind(last: bool) -> str:
    return "the last instant of a stream" if last else "instants off the plan"


def _block_off_plan(session: Session, stage, error: BaseException, last: bool, stacklevel: int) -> None:
    """Run `stage` eagerly at off-plan instants of this kind (`last` or not), with a `capture-blocked`
    warning (`stacklevel`: to the caller of `Runtime.session`); its planned firings keep their graphs."""
    diagnostic = messages.capture_blocked(stage.name, _first_line(error), stage.span)
    session.runtime.off_plan_blocked.setdefault(last, {})[stage.name] = diagnostic
    warnings.warn(
        f"{diagnostic.message} at {_off_plan_kind(last)}; it runs eagerly there", CaptureWarning, stacklevel=stacklevel
    )


def probe_stage(session: Session, firing: Firing, lengths: dict[str, int] | None = None) -> list:
    """Run the firing's body twice: a warm-up, then the probe that counts what a graph cannot hold
    (obstacles.find_obstacles), which it returns. `lengths`: the regions' lengths at the start of the
    firing's instant (default: its planned instant's)."""
    runtime = session.runtime
    if lengths is None:
        lengths = runtime.plan.trace.states[firing.instant][0]
    session.body.bound_lengths = dict(lengths)
    session.body.run(firing)  # warm-up: lazy buffers, cuBLAS handles, torch.compile'd kernels
    session.body.bound_lengths = dict(lengths)
    arena = runtime.arena.buffer
    start = arena.data_ptr()
    end = start + arena.numel()
    owned = owned_pointers(
        (item for name, value in session.objects.items() for item in tensors_in(value, name)),
        runtime.device.type,
        lambda pointer: start <= pointer < end,
    )
    recorded = RecordedCounters(firing.counters)
    probe = attrs.evolve(firing, counters=recorded)
    try:
        cuda = runtime.device.type == "cuda"
        found = find_obstacles(lambda: session.body.run(probe), runtime.device.type, owned, sync_warnings=cuda)
    except Exception:  # code the counting mode cannot run (a compiled kernel): the first host sync raises
        session.body.bound_lengths = dict(lengths)
        with sync_debug("error"):
            session.body.run(probe)
        found = []
    changing = set(runtime.program.counters) - runtime.plan.repeating_counters
    read = (recorded.read - runtime.host_counters) & changing  # the body itself reads the bound ones
    return found + counter_obstacles(read, host_counters_seen(runtime, firing.stage, changing))


def host_counters_seen(runtime, stage_name: str, counters: set[str]) -> list[tuple[str, str]]:
    """The counters among `counters` bound as Python ints where stage `stage_name` can see them: into an
    object the stage passes, or into the model at a path under the stage's module (or anywhere, for a hook)."""
    program = runtime.program
    stage = program.stages[stage_name]
    passed = {p.object for p in stage.passes}
    seen = []
    for name in sorted(counters & runtime.host_counters):
        region = program.regions[name]
        if region.bind_object is not None:
            if region.bind_object in passed:
                seen.append((name, f'bind {region.bind_object} "{region.bind}"'))
        elif stage.callable_kind == "hook" or not stage.target or region.bind.startswith(stage.target + "."):
            seen.append((name, f'bind "{region.bind}"'))
    return seen


def _capture_template(
    session: Session,
    strategy: CaptureStrategy,
    template: StepTemplate,
    capture: Callable[[tuple, tuple[Firing, ...]], BaseException | None],
    blocked: Callable[[], Collection[str]],
    block: Callable[[Any, BaseException], None],
) -> tuple[Run, ...]:
    """The instant's runs, each graph run captured by `capture` (None on success, else the error).

    `blocked()`: the stages that run eagerly at this instant; `block(stage, error)` adds one. A graph run
    whose capture fails is split: its firings are captured one by one, the first that fails alone has its
    stage blocked (eager, with a `capture-blocked` warning), and the instant is planned again with that
    stage blocked, so every graph run it returns was captured. When every firing captures alone and only
    the whole run fails, the run's first stage is blocked: each retry blocks one more stage, so this ends."""
    runtime = session.runtime
    while True:
        runs = checked_runs(strategy, template, blocked())
        for run in runs:
            if run.key is None or run.key in session.graphs:  # an eager run, or a graph captured already
                continue
            error = capture(run.key, run.firings)
            if error is None:
                continue
            culprit, cause = run.firings[0], error
            if len(run.firings) > 1:
                for firing in run.firings:
                    alone = (firing.signature,)
                    alone_error = None if alone in session.graphs else capture(alone, (firing,))
                    if alone_error is not None:
                        culprit, cause = firing, alone_error
                        break
            block(runtime.program.stages[culprit.stage], cause)
            break
        else:
            return runs


def _capture_run(
    session: Session, key: tuple, firings: tuple[Firing, ...], stream, lengths: dict[str, int]
) -> BaseException | None:
    """Capture one graph run as graph `key`, its instant starting at the regions' `lengths`; the error if the
    capture failed (nothing is kept)."""
    runtime = session.runtime
    stages = [runtime.program.stages[f.stage] for f in firings]
    for storage in session.storage.values():
        storage.fill_zero()
    started = time.perf_counter()
    torch.cuda.synchronize(runtime.device)
    graph = torch.cuda.CUDAGraph()
    module_outputs: dict[str, torch.Tensor] = {}

    def record() -> None:
        session.body.bound_lengths = dict(lengths)
        with (
            collector_paused(),
            workspaces_in_pool(),
            torch.cuda.graph(graph, pool=runtime.pools[session.lane], stream=stream),
        ):
            for firing in firings:
                module_outputs.update(session.body.run(firing))

    try:
        call_in_session(session, any(stage.rng for stage in stages), record)
    except Exception as error:
        torch.cuda.synchronize(runtime.device)
        return error
    torch.cuda.synchronize(runtime.device)
    session.graphs[key] = StageGraph(len(session.graphs), graph, module_outputs, time.perf_counter() - started)
    runtime.capture_seconds += session.graphs[key].capture_seconds
    runtime.graphs_captured = max(runtime.graphs_captured, len(session.graphs))
    return None


def _block_obstacles(session: Session, stage, diagnostics: list, stacklevel: int) -> None:
    """Plan `stage` eager from now on: every obstacle its probe found, one `capture-blocked` diagnostic
    each, in the runtime's report, and one `CaptureWarning` listing them."""
    runtime = session.runtime
    runtime.blocked[stage.name] = diagnostics[0]
    runtime.obstacles[stage.name] = tuple(diagnostics)
    listed = "; ".join(d.message.split(": ", 1)[1] for d in diagnostics)
    warnings.warn(
        f"stage '{stage.name}' cannot be captured: {listed}; it runs eagerly", CaptureWarning, stacklevel=stacklevel
    )


def _block(session: Session, stage, error: BaseException, stacklevel: int) -> None:
    """Plan `stage` eager from now on, with a `capture-blocked` warning (`stacklevel`: to the caller of
    `Runtime.session`)."""
    diagnostic = messages.capture_blocked(stage.name, _first_line(error), stage.span)
    session.runtime.blocked[stage.name] = diagnostic
    warnings.warn(f"{diagnostic.message}; it runs eagerly", CaptureWarning, stacklevel=stacklevel)


@contextlib.contextmanager
def collector_paused() -> Generator[None, None, None]:
    """No automatic garbage collection inside the block (a capture). A collection there may destroy the
    CUDA graphs of a runtime that became garbage; destroying a graph during a capture invalidates that
    capture, and its failed end leaves the default generator marked as capturing, so every later replay
    of a graph that draws random numbers raises 'Offset increment outside graph capture'. (Since torch 2.x
    `torch.cuda.graph` collects before a capture only with `torch.compiler.config.force_cudagraph_gc`.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def pool_reserved_bytes(pool) -> int:
    """The bytes the caching allocator holds for graph memory pool `pool` (its segments, in use or not)."""
    return sum(
        segment["total_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", ())) == tuple(pool)
    )


@contextlib.contextmanager
def workspaces_in_pool() -> Generator[None, None, None]:
    """PyTorch's cuBLAS and cuBLASLt workspaces dropped before the block (a capture) and after it, as
    torch's cudagraph trees do around theirs.

    PyTorch keeps a workspace per (cuBLAS handle, stream) for the life of the process (32 MiB on Hopper),
    and a graph bakes in the address of the one its capture used. Dropped before, the capture allocates its
    own inside the graph's memory pool: no graph of this runtime uses a workspace that lives anywhere else,
    which the allocator could give to another tensor once its owner frees it (PyTorch frees a stream's
    workspaces when a graph captured on that stream is destroyed: a graph of another runtime on a shared
    stream would then replay into freed memory). Dropped after, no workspace from the pool outlives the
    capture: it is free in the pool, where the pool's later captures (one lane's graphs, which replay one
    after another) use it again, and the process holds no second workspace beside the eager one. Dropping
    frees the other streams' workspaces too: a graph captured elsewhere in the process (by other code) whose
    workspace lives outside its own pool must not rely on it; PyTorch's own eager calls allocate theirs
    again when next needed."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


@contextlib.contextmanager
def sync_debug(mode: str) -> Generator[None, None, None]:
    """`torch.cuda.set_sync_debug_mode(mode)` inside the block ("error": a host sync raises)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
