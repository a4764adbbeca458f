"""Streams and lanes: the CUDA streams captures and lanes run on, and `step_many`'s interleaving.

A runtime's session slots are dealt to lanes round-robin; each lane has its own scratch block, graph
memory pool, generator state (rng.py) and CUDA stream, so sessions of different lanes can be stepped
concurrently. `step_many` begins every session's step (all inputs checked before any session moves),
then either steps each lane from a worker thread of its own (`Runtime.lane_threads`) or runs the
sessions run by run on the caller's thread, the lanes' current sessions in turn; each lane on its
stream.

Public: `capture_stream`, `lane_stream`, `step_many`.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Generator, Mapping
from concurrent.futures import Executor, wait
from typing import Any

import torch

from duplexcadence.interpreter.runtime.errors import SessionFailed, SessionsFailed, StepError
from duplexcadence.interpreter.runtime.session import PendingStep, Session

_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}
_LANE_STREAMS: dict[tuple[torch.device, int], torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every capture of the process: cuBLAS keeps a workspace per
    stream, so a new stream per session would cost one more workspace (32 MiB) each time."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device=device)
    return _CAPTURE_STREAMS[device]


def lane_stream(device: torch.device, lane: int) -> torch.cuda.Stream:
    """Lane 0 runs on the process's capture stream (so a one-lane runtime captures as before), lane k on
    a side stream of its own, shared by lane k of every runtime on the device (one cuBLAS workspace
    each, as for the capture stream; lanes of two runtimes are never stepped in one call)."""
    if lane == 0:
        return capture_stream(device)
    if (device, lane) not in _LANE_STREAMS:
        _LANE_STREAMS[(device, lane)] = torch.cuda.Stream(device=device)
    return _LANE_STREAMS[(device, lane)]


def step_many(
    runtime: object,
    device: torch.device,
    steps: Mapping[Session, Mapping[str, torch.Tensor] | torch.Tensor],
    workers: Executor | None = None,
) -> dict[Session, Any]:
    """`Runtime.step_many` of `runtime` (its sessions on `device`; see there); the caller holds its lock.
    With `workers` (the runtime's lane threads) and more than one lane to step, each lane runs on one."""
    pending: dict[Session, PendingStep] = {}
    for session, inputs in steps.items():
        if not isinstance(session, Session) or session.runtime is not runtime:
            raise StepError(f"step_many() takes sessions of this runtime, got {session!r}")
        args, named = ((inputs,), {}) if isinstance(inputs, torch.Tensor) else ((), dict(inputs or {}))
        try:
            pending[session] = session.begin(args, named, last=False)
        except (StepError, SessionFailed, RuntimeError) as error:
            raise type(error)(
                f"step_many(), the session in slot {session.slot}: {error}; no session was stepped"
            ) from error
    lanes: dict[int, deque[Session]] = {}
    for session in pending:
        lanes.setdefault(session.lane, deque()).append(session)
    streams: dict[int, Any] = {}
    if device.type == "cuda":
        caller = torch.cuda.current_stream(device)
        streams = {lane: lane_stream(device, lane) for lane in lanes}
        for stream in streams.values():
            stream.wait_stream(caller)
    running: dict[Session, Generator] = {}
    outputs: dict[Session, Any] = {}
    failures: dict[Session, SessionFailed] = {}
    try:
        if workers is not None and len(lanes) > 1:
            _step_lanes_on_threads(workers, device, lanes, streams, pending, outputs, failures)
        else:
            while lanes:
                for lane in list(lanes):
                    with torch.cuda.stream(streams[lane]) if streams else contextlib.nullcontext():
                        _advance_lane(lanes, lane, pending, running, outputs, failures)
    except BaseException as error:  # not a stage's (those fail their session): e.g. KeyboardInterrupt
        for session, runs in running.items():
            session.abandon(runs, error)
        raise
    finally:
        if streams:
            for stream in streams.values():
                caller.wait_stream(stream)
    if streams:  # made on a lane's stream, used on the caller's: freed only after the caller's use
        for value in outputs.values():
            for tensor in value.values() if isinstance(value, dict) else (value,):
                if isinstance(tensor, torch.Tensor):
                    tensor.record_stream(caller)
    if failures:
        names = ", ".join(f"slot {session.slot}" for session in failures)
        raise SessionsFailed(
            f"step_many(): the session(s) in {names} failed; the others completed their "
            f"instant: {next(iter(failures.values()))}",
            {s: outputs[s] for s in steps if s in outputs},
            failures,
        ) from next(iter(failures.values()))
    return {session: outputs[session] for session in steps}


def _advance_lane(
    lanes: dict[int, deque], lane: int, pending: dict, running: dict, outputs: dict, failures: dict
) -> None:
    """One run of lane `lane`'s current session; a session that is done hands the lane to the next."""
    queue = lanes[lane]
    while queue:
        session = queue[0]
        if session not in running:
            running[session] = session.execute(pending[session])
        try:
            next(running[session])
            return
        except StopIteration as done:
            outputs[session] = done.value
        except SessionFailed as error:
            failures[session] = error
        queue.popleft()
    del lanes[lane]


def _step_lanes_on_threads(
    workers: Executor,
    device: torch.device,
    lanes: dict[int, deque[Session]],
    streams: dict[int, Any],
    pending: dict,
    outputs: dict,
    failures: dict,
) -> None:
    """Every lane's sessions, one after another, on a worker thread per lane (on the lane's stream);
    returns once every lane is done. An exception that is not a stage's (those fail their session) stops
    its lane, the others complete, and the first such is raised here."""
    inference = torch.is_inference_mode_enabled()  # thread-local: the lanes run in the caller's mode
    jobs = [
        workers.submit(_step_lane, device, streams.get(lane), queue, pending, outputs, failures, inference)
        for lane, queue in lanes.items()
    ]
    try:
        wait(jobs)
    except BaseException:  # interrupted while waiting: the lanes still finish before the caller goes on
        wait(jobs)
        raise
    for job in jobs:
        job.result()


def _step_lane(
    device: torch.device,
    stream: Any,
    queue: deque[Session],
    pending: dict,
    outputs: dict,
    failures: dict,
    inference: bool,
) -> None:
    """One lane's sessions, one after another, on `stream` (a lane thread's current stream), in inference
    mode when the caller is."""
    placed = torch.cuda.device(device) if stream is not None else contextlib.nullcontext()
    on_stream = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with placed, on_stream, torch.inference_mode(inference):
        for session in queue:
            runs = session.execute(pending[session])
            try:
                while True:
                    next(runs)
            except StopIteration as done:
                outputs[session] = done.value
            except SessionFailed as error:
                failures[session] = error
            except BaseException as error:  # not a stage's: the session is left part-way, the lane stops
                session.abandon(runs, error)
                raise
