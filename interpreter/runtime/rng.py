"""Random numbers: each session's generator state, and the scope that installs it for a stage declared `rng`.

A stage draws from the device's default generator (`torch.randn_like` in the model's code). Each session
keeps its own state: `call_with_rng` installs it in the default generator around the stage and takes the
advanced state back, so interleaved sessions each draw the numbers of their solo run. On CUDA, the lanes
after the first have a generator state of their own (`lane_rng_states`), installed around their stages
first.

A graph replay of such a lane reads its seed and offset from the lane's state alone (the state its graph
was captured with), so `replay_with_lane_rng` sets the session's state there and replays without the
default generator or `RNG_LOCK`: lanes stepped from threads of their own (`Runtime.lane_threads`) replay
concurrently.

Public: `RNG_LOCK`, `seeded_rng_state`, `get_rng_state`, `set_rng_state`, `lane_rng_states`,
`default_generator`, `call_with_rng`, `replay_with_lane_rng`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

Result = TypeVar("Result")

RNG_LOCK = threading.RLock()
"""Held while a session's RNG state is installed in the device's default generator: that generator is
one per process, so runtimes stepped from several threads take turns at their `rng` stages."""


def seeded_rng_state(seed: int, device: torch.device) -> torch.Tensor:
    """The default generator's state after `manual_seed(seed)`, from a generator of our own: seeding the
    process's default generator and restoring it would race with another thread's `rng` stage drawing
    from it (and `torch.manual_seed` reseeds every device; `torch.cuda.manual_seed` the current one,
    not necessarily `device`)."""
    generator = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()  # as get_rng_state
    return generator.manual_seed(seed).get_state()


def get_rng_state(device: torch.device) -> torch.Tensor:
    """The state of `device`'s default generator (a copy)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    """Install `state` in `device`'s default generator."""
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def lane_rng_states(device: torch.device, lanes: int) -> list[Any]:
    """The generator state of each lane: None for lane 0 and off CUDA (the device's default state).

    Each lane's graphs draw random numbers through their own CUDA generator state: a replay's prologue
    writes the seed and offset into a device tensor of the state its graph was captured with, so two lanes
    replaying concurrently through ONE state would race on it. Lane 0 uses the device's default state
    (lanes=1 is unchanged); the others a clone, installed around their stages."""
    states: list[Any] = [None] * lanes
    if device.type == "cuda" and lanes > 1:
        generator = torch.cuda.default_generators[device.index]
        states[1:] = [generator.clone_state() for _ in range(lanes - 1)]
    return states


def default_generator(device: torch.device) -> torch.Generator:
    """`device`'s default generator, the one a stage's `torch.randn_like` draws from (on CUDA, the
    device is initialised: the runtime's arena is on it)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index]
    return torch.default_generator


def call_with_rng(
    device: torch.device, state: torch.Tensor, lane_state: Any, fn: Callable[..., Result], *args: Any
) -> tuple[Result, torch.Tensor]:
    """`fn(*args)` drawing from `state`: (what `fn` returned, the state it left). `lane_state` (from
    `lane_rng_states`, or None) is installed in the default generator first.

    The default generator is back as it was whatever happens, an exception that arrives part-way
    included (KeyboardInterrupt, or what a signal handler raises). Each state is put back by a call
    into the generator (C, no Python frame) that is the first statement of a `finally`, made twice
    from two nested `finally` blocks: a signal's Python handler runs only between bytecodes after a
    call returns, so it cannot land between entering the `finally` and the call; an exception raised
    at a line boundary (what a tracer can do, and what tests/runtime/test_step_atomicity.py does)
    skips at most the first of the two."""
    generator = default_generator(device)
    with RNG_LOCK:
        original = None
        try:
            try:
                if lane_state is not None:  # this lane's generator state: its graphs were captured with it
                    original = generator.graphsafe_get_state()
                    generator.graphsafe_set_state(lane_state)
                saved = generator.get_state()
                try:
                    try:
                        generator.set_state(state)
                        result = fn(*args)
                        state = generator.get_state()
                    finally:
                        generator.set_state(saved)
                finally:
                    generator.set_state(saved)
            finally:  # the lane's state never stays installed, whatever raised
                if original is not None:
                    generator.graphsafe_set_state(original)
        finally:
            if original is not None:
                generator.graphsafe_set_state(original)
    return result, state


def replay_with_lane_rng(
    state: torch.Tensor, lane_state: Any, replay: Callable[[], Result]
) -> tuple[Result, torch.Tensor]:
    """`replay()` (a graph captured with `lane_state`, from `lane_rng_states`) drawing from `state`: (what it
    returned, the state it left). The replay's prologue takes the seed and offset from `lane_state` and
    advances it there; the default generator is not touched, so no lock is taken. `lane_state` is back as
    it was whatever happens (one thread steps a lane at a time)."""
    saved = lane_state.get_state()
    try:
        lane_state.set_state(state)
        result = replay()
        state = lane_state.get_state()
    finally:
        lane_state.set_state(saved)
    return result, state
