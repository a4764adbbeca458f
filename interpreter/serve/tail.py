"""What a pool serves: a `ServedTail` (how to load a tail's runtime, the inputs of a tick, its stock loop).

A registered tail gives one through its `Tail.serve` reference (`serve(device=..., **options)`); a `.clock`
file with a model builder (`MODULE:FUNCTION`) gets a generic one (`served_tail`). The stock loop is the
reference a load generator compares every served output with (`SeededStock` gives it the session's seed the
way the runtime does).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

import duplexcadence
from duplexcadence.interpreter import tails
from duplexcadence.interpreter.runtime.rng import RNG_LOCK, get_rng_state, seeded_rng_state, set_rng_state
from duplexcadence.interpreter.serve import messages


class ServeSetupError(ValueError):
    """A tail that cannot be served as asked (an unknown tail, a builder that does not import, no adapter)."""


@attrs.frozen
class LoadedTail:
    """A loaded runtime and the values of its `start given` regions every session starts from (None: none)."""

    runtime: Any = attrs.field(repr=False)
    initial: Mapping[str, torch.Tensor] | None = attrs.field(default=None, repr=False)


@attrs.frozen
class ServedTail:
    """How to serve one tail.

    `load(sessions=, lanes=, rows=)`: the runtime with `sessions` session slots in `lanes` lanes; `rows` (not
    None) loads it with the batch param (`batch_param`) at `rows`, for lockstep groups of that many sessions.
    `inputs(seed, tick)`: the host tensors of one session's tick (calibration, load generators; None: zeros of
    the planned shapes). `stock(seed)`: the stock streaming loop of one session alone (`reset()`,
    `step(**inputs)`), built on `device`; None when there is none. `stock_group(rows)`: the tail's own batched
    streaming loop of a lockstep group of `rows` rows, the reference of a lockstep row (`reset()`: every row
    fresh; `join(row)`: that row's stream starts over; `step({row: inputs})`: one instant, the rows not given
    fed zeros as a group's idle rows are, returning `{row: outputs by name}` on the host for the rows given);
    None when there is none. `options`: what the tail was built with (the server's `ready` frame names them,
    so a client can rebuild the same stock loop). `input_bounds`: the least and the most value each input
    may hold (a codebook's codes); in a lockstep group, where one row's failed stage fails every row, a
    member's tick outside them is refused (`bad-input`) before the group's step.
    """

    name: str
    load: Callable[..., LoadedTail]
    device: str = "cpu"
    inputs: Callable[[int, int], dict[str, torch.Tensor]] | None = None
    stock: Callable[[int], Any] | None = None
    options: Mapping[str, str] = attrs.field(factory=dict)
    batch_param: str = "B"
    stock_group: Callable[[int], Any] | None = None
    input_bounds: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)


def served_tail(
    target: str,
    model: str | None = None,
    params: Mapping[str, str] | None = None,
    device: str = "cpu",
) -> ServedTail:
    """The `ServedTail` of a registered tail (`target` a name, `params` its options), or of a `.clock` file
    bound to the model `MODULE:FUNCTION` builds (`params` the file's params); ServeSetupError otherwise."""
    params = dict(params or {})
    if model is None:
        if target not in tails.available():
            registered = ", ".join(tails.available()) or "none registered"
            raise ServeSetupError(
                f"'{target}' is not a registered tail ({registered}); to serve a .clock file, give the model "
                "builder with --model MODULE:FUNCTION"
            )
        tail = tails.get(target)
        tail.require()
        if tail.serve is None:
            raise ServeSetupError(messages.no_serve_adapter(target))
        try:
            served = tail.serve(device=device, **params)
        except (TypeError, ValueError) as error:  # an option the adapter does not take, or a value it refuses
            raise ServeSetupError(f"tail '{target}': {error}") from error
        if not isinstance(served, ServedTail):
            raise ServeSetupError(
                f"tail '{target}': its serve adapter returned {type(served).__name__}, not a ServedTail"
            )
        return served
    builder = import_function(model)
    if not Path(target).is_file():
        raise ServeSetupError(f"'{target}' is not a .clock file (with --model, the first argument is the .clock file)")
    built = builder(**({"device": device} if "device" in inspect.signature(builder).parameters else {}))
    if isinstance(built, ServedTail):
        return built
    return clock_tail(target, built, params, device)


def import_function(target: str) -> Callable[..., Any]:
    """FUNCTION of `MODULE:FUNCTION`, importable from the current folder or the installed packages."""
    module_name, sep, function_name = target.partition(":")
    if not sep or not module_name or not function_name:
        raise ServeSetupError(f"--model {target!r} is not MODULE:FUNCTION (e.g. mymodel:build)")
    try:
        return tails.import_function(module_name, function_name)
    except tails.ImportFailed as error:
        raise ServeSetupError(str(error)) from error


def clock_tail(clock: str, model: Any, params: Mapping[str, str], device: str) -> ServedTail:
    """A `.clock` file bound to `model` (no hooks): sessions start from the file's declared starts (a region
    declared `start given` needs a ServedTail of its own), ticks are zeros of the planned shapes, no stock."""
    program = duplexcadence.load_program(clock, dict(params))
    given = sorted(name for name, region in program.regions.items() if region.start == "given")
    if given:
        raise ServeSetupError(messages.needs_initial(given))
    if isinstance(model, torch.nn.Module):
        model = model.to(device)

    def load(sessions: int = 1, lanes: int = 1, rows: int | None = None) -> LoadedTail:
        values = dict(params)
        if rows is not None:
            values["B"] = str(rows)
        runtime = duplexcadence.Runtime.load(clock, model, params=values, device=device, sessions=sessions, lanes=lanes)
        return LoadedTail(runtime)

    return ServedTail(Path(clock).stem, load, device=device, options=dict(params))


class SeededStock:
    """A stock loop that draws its random numbers from its own generator state, seeded with the session's
    seed at start and at every `reset`, as a runtime session does: its draws never depend on other work."""

    def __init__(self, stock: Any, seed: int, device: str | torch.device):
        self.stock = stock
        self.seed = seed
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.state = seeded_rng_state(seed, self.device)

    def reset(self) -> None:
        self.stock.reset()
        self.state = seeded_rng_state(self.seed, self.device)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """This stock loop's generator state in the device's default generator, under the runtime's
        `RNG_LOCK`: a runtime stepped by another thread of the process (a pool's device thread) takes turns
        with it rather than draw from the same generator meanwhile."""
        with RNG_LOCK:
            saved = get_rng_state(self.device)
            set_rng_state(self.device, self.state)
            try:
                yield
            finally:
                self.state = get_rng_state(self.device)
                set_rng_state(self.device, saved)

    @torch.no_grad()
    def step(self, **inputs: torch.Tensor) -> Any:
        with self.installed():
            return self.stock.step(**inputs)


@contextlib.contextmanager
def deterministic_cudnn() -> Iterator[None]:
    """cuDNN's deterministic algorithms inside the block (the runtime's verify does the same: with its default
    choice two eager runs of one convolution can differ in the last bits)."""
    previous = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous
