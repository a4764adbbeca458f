"""The runtime: a plan bound to a PyTorch model, sessions that own their regions, exact-shape graphs.

    rt = Runtime.load("mimi.clock", model=decoder, params={"B": 1}, device="cuda", hooks={...})
    s = rt.session()            # a session owns its regions in the arena
    pcm = s.step(codes=c)       # one instant: feed inputs, replay each stage's graph (or run it eagerly)
    s.reset()                   # barge-in: state back to its declared start, addresses unchanged
    rt.report()                 # bytes per region vs stock, graphs, capture time, replays, eager firings

One `step` runs one instant of the plan: every stage that fires at it, in dataflow order. A stage
firing is executed by its *body*: bind the region views (exact shape, stable address) to module
attributes or pass them as arguments, call the stage, copy what it returns into its regions with
the declared retention, trim. On CUDA the body of every planned (stage, signature) is captured
once into a CUDA graph and replayed; everything else runs the same body eagerly, so the two paths
execute the same arithmetic.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.plan import Plan, make_plan
from duplexcadence.interpreter.plans.trace import Firing, Simulator, View
from duplexcadence.interpreter.runtime.binding import Attribute, StageCallable, bind_program, describe
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES, DeviceArena, RegionStorage


class StepError(ValueError):
    """A `step()` call with bad inputs; the session's state is exactly as before the call."""


class SessionFailed(RuntimeError):
    """A stage raised during a step: the session refuses further steps until `reset()`."""


class SessionsFailed(SessionFailed):
    """`Runtime.step_many`: one or more sessions failed at their instant, the others completed it.

    `outputs` maps each completed session to its outputs; `failures` each failed session to its
    `SessionFailed` (that session refuses further steps until `reset()`)."""

    def __init__(self, message: str, outputs: dict, failures: dict):
        super().__init__(message)
        self.outputs = outputs
        self.failures = failures


class CaptureWarning(UserWarning):
    """A stage could not be captured into a CUDA graph and runs eagerly."""


@attrs.define
class StageGraph:
    key: int
    graph: Any
    module_outputs: dict[str, torch.Tensor]
    capture_seconds: float


@attrs.frozen
class StepTemplate:
    """One traced instant, ready to replay: firings, their graph keys (None: eager), input shapes."""

    firings: tuple[Firing, ...]
    keys: tuple[int | None, ...]
    inputs: dict[str, tuple[int, ...]] = attrs.field(hash=False)

    @classmethod
    def of(cls, firings: list[Firing], graph_key: dict) -> StepTemplate:
        inputs = {v.region: tuple(v.shape) for f in firings for v in f.views if v.kind == "feed"}
        return cls(tuple(firings), tuple(graph_key.get(f.signature) for f in firings), inputs)


@attrs.frozen
class GraphReplay:
    """One fused graph run of a planned instant with its addresses resolved once per session: the views
    its inputs are copied into, the graph, and the views its outputs are cloned from. An on-plan step
    made only of such runs skips re-deriving them from the firings (`Session._replay`)."""

    feeds: tuple[tuple[str, torch.Tensor], ...] = attrs.field(repr=False)
    graph: StageGraph = attrs.field(repr=False)
    firings: tuple[Firing, ...]
    rng: bool
    outputs: tuple[tuple[str, torch.Tensor], ...] = attrs.field(repr=False)


@attrs.frozen
class PendingStep:
    """A step whose inputs were checked and whose runs were chosen, before anything changed: the
    runs (fused graph replays and eager firings), the inputs by name, the simulator after an
    off-plan instant (None on the plan), and the bound lengths at the start of the instant."""

    runs: list = attrs.field(repr=False)
    inputs: dict[str, torch.Tensor] = attrs.field(repr=False)
    simulator: Simulator | None = attrs.field(repr=False)
    off_plan: bool
    last: bool
    bound_lengths: dict[str, int] = attrs.field(repr=False)


@attrs.define
class Counters:
    """What a session did: steps, graph replays, eager firings (planned, e.g. over budget; or off-plan), and
    the steps that took the short replay path (`Session._replay`)."""

    steps: int = 0
    replays: int = 0
    eager_planned: int = 0
    eager_off_plan: int = 0
    per_graph: Counter = attrs.field(factory=Counter)
    short_path_steps: int = 0

    def add_totals(self, other: Counters) -> None:
        """Add `other`'s replays, eager firings and short-path steps (what the runtime's report sums)."""
        self.replays += other.replays
        self.eager_planned += other.eager_planned
        self.eager_off_plan += other.eager_off_plan
        self.short_path_steps += other.short_path_steps


@attrs.frozen
class RegionReport:
    name: str
    bytes: int
    stock_bytes: int | None
    double_buffer_bytes: int


@attrs.frozen
class RuntimeReport:
    """The numbers a serving engineer asks for, from one runtime."""

    device: str
    sessions: int
    arena_bytes: int
    session_bytes: int
    scratch_bytes: int
    regions: tuple[RegionReport, ...]
    graphs_planned: int
    graphs_captured: int
    stage_graphs_covered: int
    capture_seconds: float
    blocked: tuple[Diagnostic, ...]
    replays: int
    eager_planned: int
    eager_off_plan: int
    lanes: int = 1
    """Scratch copies in the arena: `arena_bytes` = sessions x `session_bytes` + lanes x `scratch_bytes`."""
    short_path_steps: int = 0

    @property
    def stock_bytes(self) -> int:
        return sum(r.stock_bytes for r in self.regions if r.stock_bytes is not None)

    @property
    def compared_bytes(self) -> int:
        return sum(r.bytes for r in self.regions if r.stock_bytes is not None)

    def __str__(self) -> str:
        from duplexcadence.interpreter.plans.plan_text import human_bytes

        if self.lanes == 1:
            lines = [
                f"DuplexCadence runtime on {self.device}: {self.sessions} session slot(s)",
                f"  arena {human_bytes(self.arena_bytes)} in one allocation ({human_bytes(self.session_bytes)} "
                f"per session + {human_bytes(self.scratch_bytes)} shared scratch)",
            ]
        else:
            lines = [
                f"DuplexCadence runtime on {self.device}: {self.sessions} session slot(s) in {self.lanes} lanes",
                f"  arena {human_bytes(self.arena_bytes)} in one allocation ({human_bytes(self.session_bytes)} "
                f"per session + {self.lanes} x {human_bytes(self.scratch_bytes)} scratch, one copy per lane)",
            ]
        if self.stock_bytes:
            lines.append(
                f"  regions with a stock allocation: {human_bytes(self.compared_bytes)} vs stock "
                f"{human_bytes(self.stock_bytes)} per session"
            )
        lines.append(
            f"  graphs: {self.stage_graphs_covered} of {self.graphs_planned} planned stage graphs captured, "
            f"fused into {self.graphs_captured} instant graphs in {self.capture_seconds:.2f} s; stage "
            f"replays {self.replays}; eager firings {self.eager_planned} planned + {self.eager_off_plan} "
            f"outside the plan; {self.short_path_steps} steps on the short replay path"
        )
        for diagnostic in self.blocked:
            lines.append(f"  blocked: {diagnostic.message}")
        return "\n".join(lines)


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def available_bytes(device: torch.device) -> tuple[int, int] | None:
    """(free on the device, cached by PyTorch's allocator but unused) for a CUDA device; None elsewhere.
    The allocator returns its cached blocks to the driver before it gives up on an allocation, so
    both count as available."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free, max(cached, 0)


def check_arena_fits(plan: Plan, sessions: int, device: torch.device, lanes: int = 1) -> None:
    """Raise ClockError (over-budget) when the arena for `sessions` and `lanes` cannot be allocated on
    `device`; called before anything is allocated."""
    available = available_bytes(device)
    if available is None:
        return
    needed = plan.arena.total_bytes(sessions, lanes)
    free, cached = available
    if needed > free + cached:
        raise ClockError(
            [
                messages.arena_does_not_fit(
                    needed,
                    sessions,
                    plan.arena.session_bytes,
                    plan.arena.scratch_bytes,
                    free,
                    cached,
                    str(device),
                    lanes,
                )
            ]
        )


class Runtime:
    """A plan bound to a model on one device, with an arena for `sessions` session slots in `lanes`
    lanes: slot i belongs to lane i % lanes; each lane has its own scratch block, graph memory pool
    and (on CUDA) stream, so sessions of different lanes can be stepped concurrently (`step_many`).

    Threads: the sessions of one lane share its scratch block, and all sessions share the double
    buffers and the model's bound attributes, so `lock` serialises steps (and resets, closes,
    captures, reports): any thread may step any session, one call at a time. For steps that run in
    parallel, use lanes and `step_many` from one thread, or load one runtime per thread, each on its
    own model instance (binding sets the model's attributes).
    """

    def __init__(
        self,
        plan: Plan,
        model: Any,
        device: torch.device,
        callables: dict[str, StageCallable],
        attributes: dict[str, Attribute],
        sessions: int,
        graphs: bool,
        on_reset: Callable[[Any], None] | None,
        lanes: int = 1,
    ):
        self.plan = plan
        self.program: Program = plan.program
        self.model = model
        self.device = device
        self.callables = callables
        self.attributes = attributes
        self.graphs_enabled = graphs
        self.on_reset = on_reset
        self.lanes = lanes
        try:
            self.arena = DeviceArena(plan.arena, sessions, device, lanes)
        except torch.cuda.OutOfMemoryError:  # the free memory was there, but in pieces
            free, cached = available_bytes(device) or (0, 0)
            raise ClockError(
                [
                    messages.arena_does_not_fit(
                        plan.arena.total_bytes(sessions, lanes),
                        sessions,
                        plan.arena.session_bytes,
                        plan.arena.scratch_bytes,
                        free,
                        cached,
                        str(device),
                        lanes,
                    )
                ]
            ) from None
        self.lock = threading.RLock()
        self.free_slots = list(range(sessions))
        self.blocked: dict[str, Diagnostic] = {}
        # graphs share a private memory pool only within a lane: the pool's allocator assumes its graphs
        # replay one after another, which holds within a lane (one stream) but not across lanes
        self.pools = [torch.cuda.graph_pool_handle() for _ in range(lanes)] if graphs else [None] * lanes
        self.pool = self.pools[0]
        # Each lane's graphs draw random numbers through their own CUDA generator state: a replay's
        # prologue writes the seed and offset into a device tensor of the state its graph was captured
        # with, so two lanes replaying concurrently through ONE state would race on it. Lane 0 uses the
        # device's default state (lanes=1 is unchanged); the others a clone, swapped in around their stages.
        self.lane_rng_states: list[Any] = [None] * lanes
        if device.type == "cuda" and lanes > 1:
            generator = torch.cuda.default_generators[device.index]
            self.lane_rng_states[1:] = [generator.clone_state() for _ in range(lanes - 1)]
        self.first_firing: dict[tuple, Firing] = {}
        for firing in plan.trace.firings:
            self.first_firing.setdefault(firing.signature, firing)
        self.graph_key = {g.signature: g.key for g in plan.capture.graphs if g.captured}
        # an on-plan step repeats a traced instant: its firings, graph keys and input shapes, precomputed
        self.templates = [StepTemplate.of(firings, self.graph_key) for firings in plan.trace.by_instant()]
        self.storage_dtypes = {name: TORCH_DTYPES[r.dtype] for name, r in plan.program.regions.items()}
        instants = plan.clocks.instants
        self._prefix_counts = [Counter() for _ in range(len(instants) + 1)]
        for phase, instant in enumerate(instants):
            self._prefix_counts[phase + 1] = self._prefix_counts[phase] + Counter(instant.stages)
        self.sessions: list[Session] = []
        self.closed_counters = Counters()
        # graphs bake in addresses, and addresses belong to a slot: a later session in the slot reuses them
        self.slot_graphs: dict[int, tuple[dict, dict, dict]] = {}  # slot -> its graphs, runs and resolved replays
        self.capture_seconds = 0.0
        self.graphs_captured = 0

    def lane_of(self, slot: int) -> int:
        """The lane of session slot `slot`: slots are dealt to lanes round-robin."""
        return slot % self.lanes

    def lane_stream(self, lane: int):
        """Lane `lane`'s CUDA stream: its graphs are captured on it and `step_many` runs it on it."""
        return _lane_stream(self.device, lane)

    def counts_before(self, instant: int) -> dict[str, int]:
        """How many times each stage has fired before `instant` (from the clocks alone)."""
        periods, phase = divmod(instant, len(self.plan.clocks.instants))
        partial = self._prefix_counts[phase]
        return {
            name: periods * timing.per_hyperperiod + partial[name] for name, timing in self.plan.clocks.stages.items()
        }

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        clock: str | Path | Program,
        model: Any,
        params: Mapping[str, Any] | None = None,
        device: str | torch.device | None = None,
        hooks: Mapping[str, Callable] | None = None,
        sessions: int = 1,
        graphs: bool | str = "auto",
        max_graphs: int | None = None,
        on_reset: Callable[[Any], None] | None = None,
        lanes: int = 1,
    ) -> Runtime:
        """Check the `.clock` file, plan it, bind it to `model`, and allocate the arena.

        `params` override the file's params (values as Python numbers or `.clock` text).
        `graphs`: "auto" captures CUDA graphs on a CUDA device; False runs every firing eagerly.
        `lanes`: how many sessions `step_many` can run at once (1 to `sessions`); each lane adds one
        copy of the scratch block to the arena and has its own graph pool and CUDA stream.
        Raises `ClockError` with located diagnostics when the file, the binding or the budget fails.
        """
        device = _device(device)
        if sessions < 1:
            raise ValueError(f"sessions must be at least 1, not {sessions}")
        if not isinstance(lanes, int) or not 1 <= lanes <= sessions:
            raise ValueError(
                f"lanes must be a whole number from 1 to sessions ({sessions}), not {lanes!r}: a lane "
                "without a session slot would hold a scratch block nothing uses"
            )
        program = (
            clock if isinstance(clock, Program) else load_program(clock, {k: str(v) for k, v in (params or {}).items()})
        )
        plan = make_plan(program, max_graphs=max_graphs)
        callables, attributes = bind_program(program, model, hooks, device)
        check_arena_fits(plan, sessions, device, lanes)
        use_graphs = device.type == "cuda" and graphs not in (False, "off", "never")
        return cls(plan, model, device, callables, attributes, sessions, use_graphs, on_reset, lanes)

    def session(self, initial: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> Session:
        """A new session in a free slot: its regions at their start, its own RNG state from `seed`."""
        with self.lock:
            if not self.free_slots:
                raise RuntimeError(
                    f"all {self.arena.sessions} session slots are in use; close a session or load "
                    f"the runtime with sessions={self.arena.sessions + 1}"
                )
            slot = self.free_slots[0]
            session = Session(self, slot, initial, seed)  # raises before taking the slot on bad initial values
            if self.graphs_enabled:
                if slot not in self.slot_graphs:
                    session._capture_graphs()  # an error here leaves the slot free
                    self.slot_graphs[slot] = (session.graphs, session.runs, session.replays)
                session.graphs, session.runs, session.replays = self.slot_graphs[slot]
            self.free_slots.remove(slot)
            self.sessions.append(session)
            return session

    def step_many(self, steps: Mapping[Session, Mapping[str, torch.Tensor] | torch.Tensor]) -> dict[Session, Any]:
        """Run one instant of each session (as `session.step(**inputs)`), sessions of different lanes
        concurrently; returns {session: outputs} in the order given.

        `steps` maps each session of this runtime to its inputs by name (or to its one input tensor).
        Every session's inputs are checked first: a bad one raises StepError (naming the session's
        slot) and no session changes. The host then interleaves the sessions run by run: the first
        run (a fused graph replay or an eager firing) of every lane's session, then the second, and
        so on, each on its lane's CUDA stream, so a host synchronisation inside one session's eager
        stage (`torch.istft`) waits while the other lanes' work is already queued. Sessions of one
        lane share its scratch block: they run one after another in the lane. Each lane's stream
        first waits on the caller's current stream, and the caller's current stream waits on every
        lane before this returns, so the inputs may come from, and the outputs be used on, the
        current stream. A stage that raises fails its session only: the others complete their
        instant and `SessionsFailed` is raised with their outputs. Off the CUDA device the sessions
        run interleaved the same way on the host, one run at a time.
        """
        with self.lock:
            pending: dict[Session, PendingStep] = {}
            for session, inputs in steps.items():
                if not isinstance(session, Session) or session.runtime is not self:
                    raise StepError(f"step_many() takes sessions of this runtime, got {session!r}")
                args, named = ((inputs,), {}) if isinstance(inputs, torch.Tensor) else ((), dict(inputs or {}))
                try:
                    session._check_steppable()
                    pending[session] = session._begin(args, named, False, session._planned_index(args, named, False))
                except (StepError, SessionFailed, RuntimeError) as error:
                    raise type(error)(
                        f"step_many(), the session in slot {session.slot}: {error}; no session was stepped"
                    ) from error
            lanes: dict[int, deque[Session]] = {}
            for session in pending:
                lanes.setdefault(session.lane, deque()).append(session)
            streams: dict[int, Any] = {}
            if self.device.type == "cuda":
                caller = torch.cuda.current_stream(self.device)
                streams = {lane: self.lane_stream(lane) for lane in lanes}
                for stream in streams.values():
                    stream.wait_stream(caller)
            running: dict[Session, Generator] = {}
            outputs: dict[Session, Any] = {}
            failures: dict[Session, SessionFailed] = {}
            try:
                while lanes:
                    for lane in list(lanes):
                        with torch.cuda.stream(streams[lane]) if streams else contextlib.nullcontext():
                            self._advance_lane(lanes, lane, pending, running, outputs, failures)
            except BaseException as error:  # not a stage's (those fail their session): e.g. KeyboardInterrupt
                for session, runs in running.items():
                    session._abandon(runs, error)
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

    @staticmethod
    def _advance_lane(
        lanes: dict[int, deque], lane: int, pending: dict, running: dict, outputs: dict, failures: dict
    ) -> None:
        """One run of lane `lane`'s current session; a session that is done hands the lane to the next."""
        queue = lanes[lane]
        while queue:
            session = queue[0]
            if session not in running:
                running[session] = session._run_step(pending[session])
            try:
                next(running[session])
                return
            except StopIteration as done:
                outputs[session] = done.value
            except SessionFailed as error:
                failures[session] = error
            queue.popleft()
        del lanes[lane]

    # --- reporting -------------------------------------------------------------------------------

    def report(self) -> RuntimeReport:
        with self.lock:
            return self._report()

    def _report(self) -> RuntimeReport:
        schedule = self.plan.schedule
        regions = tuple(
            RegionReport(r.name, r.bytes, r.stock_bytes, r.double_buffer_bytes) for r in schedule.regions.values()
        )
        totals = attrs.evolve(self.closed_counters)
        for session in self.sessions:
            totals.add_totals(session.counters)
        covered = {signature for graphs, _, _ in self.slot_graphs.values() for key in graphs for signature in key}
        return RuntimeReport(
            str(self.device),
            self.arena.sessions,
            self.arena.nbytes,
            self.plan.arena.session_bytes,
            self.plan.arena.scratch_bytes,
            regions,
            len(self.plan.capture.graphs),
            self.graphs_captured,
            len(covered),
            self.capture_seconds,
            tuple(self.blocked.values()),
            totals.replays,
            totals.eager_planned,
            totals.eager_off_plan,
            self.lanes,
            totals.short_path_steps,
        )

    def verify(self, stock, inputs, ticks: int | None = None, seed: int = 0):
        """Run stock eager and a fresh session side by side; see `duplexcadence.interpreter.runtime.verify`."""
        from duplexcadence.interpreter.runtime.verify import verify

        return verify(self, stock, inputs, ticks=ticks, seed=seed)


class Session:
    """One conversation's state: its regions in its arena slot, its clock position and RNG state."""

    def __init__(self, runtime: Runtime, slot: int, initial: Mapping[str, torch.Tensor] | None, seed: int):
        self.runtime = runtime
        self.slot = slot
        self._lane = runtime.lane_of(slot)
        self.seed = seed
        program = runtime.program
        self.storage: dict[str, RegionStorage] = {}
        for name, region in program.regions.items():
            persistent = runtime.plan.schedule.regions[name].persistent
            flat = runtime.arena.block(name, slot if persistent else None, self.lane)
            double = None
            if runtime.plan.schedule.regions[name].double_buffer_bytes:
                double = runtime.arena.block(f"{name}~double", None, self.lane)
            self.storage[name] = RegionStorage(region, flat, double)
        self.graphs: dict[tuple, StageGraph] = {}
        self.runs: dict[int, list] = {}
        self.replays: dict[int, tuple[GraphReplay, ...] | None] = {}  # by template index, resolved after capture
        self.counters = Counters()
        self.failed: BaseException | None = None
        self.closed = False
        self.initial = dict(initial or {})
        self._check_initial(self.initial)
        self.reset()

    # --- public API ------------------------------------------------------------------------------

    @property
    def instant(self) -> int:
        return self._instant

    @property
    def lane(self) -> int:
        """The lane whose scratch block, graph pool and CUDA stream this session uses (its slot % lanes)."""
        return self._lane

    def reset(self, initial: Mapping[str, torch.Tensor] | None = None) -> None:
        """Back to the declared start (barge-in, new turn); every address stays where it was."""
        runtime = self.runtime
        with runtime.lock:
            if self.closed:  # its slot may be another session's now: resetting would overwrite that one
                raise RuntimeError("this session is closed")
            if initial is not None:
                self._check_initial(initial)
                self.initial = dict(initial)
            for name, storage in self.storage.items():
                if runtime.plan.schedule.regions[name].persistent:
                    storage.fill_zero()
                    region = runtime.program.regions[name]
                    if region.start == "given":
                        source = self.initial[name]
                        storage.view(None if region.fixed else region.start_length).copy_(source.detach())
            self.simulator = Simulator(runtime.program, runtime.plan.clocks)
            self.simulator_stale = False
            self.on_plan = True
            self._instant = 0
            self.failed = None
            self.finished = False
            self.rng_state = _seeded_rng_state(self.seed, runtime.device)
            self._bind_current()
            if runtime.on_reset is not None:
                runtime.on_reset(runtime.model)

    def step(self, *args: torch.Tensor, **inputs: torch.Tensor):
        """Run one instant. Inputs by input-region name (or one positional tensor when the instant has
        one input). Returns the output regions written at this instant: a tensor, or a dict when
        there are several. On bad inputs raises StepError and leaves the session untouched.

        An input with fewer units than the plan expects (a flush of a short input) makes the
        instant cover that fraction of its planned time: every advance of the instant scales with
        it (StepError if one comes out fractional); such firings run eagerly, outside the plan."""
        return self._step(args, inputs, last=False)

    def finish(self, *args: torch.Tensor, **inputs: torch.Tensor):
        """Run the last instant of the stream: like `step`, and the lookahead the reads held back is
        consumed too and every write's latency is released, except a `latency L dropped` (stages see
        `firing.last`). The session then refuses steps until `reset()`."""
        return self._step(args, inputs, last=True)

    def _step(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool):
        with self.runtime.lock:
            self._check_steppable()
            index = self._planned_index(args, inputs, last)
            replays = self._replays_at(index)
            if replays is not None:
                return self._replay(replays, inputs)
            runs = self._run_step(self._begin(args, inputs, last, index))
            try:
                while True:
                    try:
                        next(runs)
                    except StopIteration as done:
                        return done.value
            except BaseException as error:
                self._abandon(runs, error)
                raise

    def _abandon(self, runs: Generator, error: BaseException) -> None:
        """A step stopped between two of its runs by an exception that is not a stage's (KeyboardInterrupt,
        a signal handler's): part of the instant ran, so the session fails as if a stage had raised."""
        if inspect.getgeneratorstate(runs) == inspect.GEN_SUSPENDED:
            self.failed = error
            runs.close()

    def _check_steppable(self) -> None:
        if self.closed:
            raise RuntimeError("this session is closed")
        if self.failed is not None:
            raise SessionFailed(
                f"the session failed at instant {self._instant} ({self.failed!r}); call reset() to start it again"
            ) from self.failed
        if self.finished:
            raise StepError(
                f"the session finished its stream at instant {self._instant - 1}; call reset() to start the next one"
            )

    def _planned_index(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool) -> int | None:
        """The planned instant this step repeats (`_template_index`), None when it takes the general path."""
        return self._template_index(args, inputs) if self.on_plan and not last else None

    def _begin(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool, index: int | None) -> PendingStep:
        """Everything a step decides before it changes anything: the inputs checked (StepError), the runs.
        `index`: `_planned_index` of the same arguments (it names positional inputs in `inputs`)."""
        runtime = self.runtime
        if index is not None:
            runs = self.runs.get(index) or self._eager_runs(runtime.templates[index].firings)
            return PendingStep(runs, inputs, None, False, last, dict(runtime.plan.trace.states[index][0]))
        self._sync_simulator()
        lengths = dict(self.simulator.length)
        firings, simulator, off_plan = self._plan_step(args, inputs, last)
        return PendingStep(self._eager_runs(firings), inputs, simulator, off_plan, last, lengths)

    def _run_step(self, step: PendingStep) -> Generator[None, None, Any]:
        """Execute a begun step, yielding between its runs (`Runtime.step_many` interleaves sessions
        there); returns the step's outputs. A stage that raises fails the session (SessionFailed)."""
        self._bound_lengths = step.bound_lengths
        outputs: dict[str, torch.Tensor] = {}
        firing = None
        try:
            for position, (kind, key, firings) in enumerate(step.runs):
                if position:
                    yield
                firing = firings[0]
                self._execute(kind, key, firings, step.inputs, outputs, step.off_plan)
        except Exception as error:
            self.failed = error
            raise self._stage_failed(firing, error) from error
        except BaseException as error:  # KeyboardInterrupt inside a run, or closed by _abandon (already failed)
            if self.failed is None:
                self.failed = error
            raise
        if step.simulator is not None:
            self.simulator = step.simulator
            self.simulator_stale = False
            self.on_plan = self.on_plan and not step.off_plan
        else:
            self.simulator_stale = True
        return self._advance(outputs, step.last)

    def _replay(self, replays: tuple[GraphReplay, ...], inputs: Mapping[str, torch.Tensor]):
        """An on-plan step made only of graph runs, on addresses resolved before (see `_replays_at`):
        per run, copy the inputs in, replay, clone the outputs out; what `_run_step` does for such a step,
        on the same views, with the same counters and failure handling."""
        outputs: dict[str, torch.Tensor] = {}
        counters = self.counters
        run = None
        try:
            for run in replays:
                for name, target in run.feeds:
                    tensor = inputs[name]
                    target.copy_(tensor.detach() if tensor.requires_grad else tensor)
                if run.rng:
                    with self._rng_scope(True):
                        run.graph.graph.replay()
                else:
                    run.graph.graph.replay()
                counters.replays += len(run.firings)
                counters.per_graph[run.graph.key] += 1
                for name, source in run.outputs:
                    outputs[name] = source.clone()
        except Exception as error:
            self.failed = error
            raise self._stage_failed(run.firings[0], error) from error
        except BaseException as error:  # KeyboardInterrupt between two runs: part of the instant ran
            self.failed = error
            raise
        self.simulator_stale = True
        counters.short_path_steps += 1
        return self._advance(outputs, last=False)

    def _advance(self, outputs: dict[str, torch.Tensor], last: bool):
        """Count a completed step and return its outputs: a tensor, or a dict when there are several."""
        self._instant += 1
        self.counters.steps += 1
        self.finished = last
        if len(outputs) == 1:
            return next(iter(outputs.values()))
        return outputs

    def _stage_failed(self, firing: Firing, error: Exception) -> SessionFailed:
        return SessionFailed(
            f"stage '{firing.stage}' ({self._call_text(firing)}) raised at instant "
            f"{self._instant}: {error!r}; the session refuses further steps until reset()"
        )

    def _replays_at(self, index: int | None) -> tuple[GraphReplay, ...] | None:
        """The resolved graph runs of planned instant `index`, or None when it has an eager firing (or a
        feed that goes through a staging copy): such an instant takes the general path."""
        return None if index is None else self.replays.get(index)

    def _resolve_all_replays(self) -> dict[int, tuple[GraphReplay, ...] | None]:
        """`_resolve_replays` of every planned instant, once, when the slot's graphs are captured: each
        warm-up instant is stepped once per session, so resolving on first use would cost every warm-up
        step (the same views serve every later session of the slot: its addresses do not change)."""
        return {index: self._resolve_replays(runs) for index, runs in self.runs.items()}

    def _resolve_replays(self, runs: list | None) -> tuple[GraphReplay, ...] | None:
        if not runs or any(kind != "graph" for kind, _, _ in runs):
            return None
        program = self.runtime.program
        resolved = []
        for _, key, firings in runs:
            graph = self.graphs[key]
            feeds, outputs = [], []
            for firing in firings:
                for view in firing.views:
                    if view.kind == "feed":
                        target = self.storage[view.region].append_target(view.offset, view.length)
                        if target is None:
                            return None
                        feeds.append((view.region, target))
                    elif view.kind == "write" and program.regions[view.region].role == "output":
                        region = program.regions[view.region]
                        source = (
                            graph.module_outputs[view.region]
                            if view.length is None
                            else self.storage[view.region]
                            .view(view.transient)
                            .narrow(region.time_axis, view.offset, view.length)
                        )
                        outputs.append((view.region, source))
            rng = any(program.stages[f.stage].rng for f in firings)
            resolved.append(GraphReplay(tuple(feeds), graph, tuple(firings), rng, tuple(outputs)))
        return tuple(resolved)

    def region(self, name: str) -> torch.Tensor:
        """The current exact view of a region (for inspection; do not keep it across steps: a scratch
        region's view is shared by the runtime's sessions)."""
        with self.runtime.lock:
            if self.closed:  # its slot may be another session's now
                raise RuntimeError("this session is closed")
            self._sync_simulator()
            storage = self.storage[name]
            region = self.runtime.program.regions[name]
            if region.fixed:
                return storage.view()
            if region.retention.kind == "ring":
                return storage.view(region.retention.last)
            return storage.view(self.simulator.length.get(name, 0))

    def data_ptrs(self) -> dict[str, int]:
        """The base address of every region (stable for the life of the session)."""
        return {name: storage.flat.data_ptr() for name, storage in self.storage.items()}

    def close(self) -> None:
        """Give the slot back to the runtime."""
        runtime = self.runtime
        with runtime.lock:
            if not self.closed:
                self.closed = True
                runtime.free_slots.append(self.slot)
                runtime.free_slots.sort()
                if self in runtime.sessions:
                    runtime.sessions.remove(self)
                    runtime.closed_counters.add_totals(self.counters)

    # --- one step --------------------------------------------------------------------------------

    def _input_regions(self, index: int) -> dict[str, str]:
        """Input regions fed at instant `index`, mapped to the stage that reads them."""
        runtime = self.runtime
        fed: dict[str, str] = {}
        for stage in self.simulator.stages_at(index):
            for access in runtime.program.stages[stage].accesses:
                if access.kind == "read" and runtime.program.regions[access.region].role == "input":
                    fed.setdefault(access.region, stage)
        return fed

    def _eager_runs(self, firings) -> list:
        """Firings stepped off the template path: the longest captured run of consecutive firings whose
        signatures match (a session back on a planned shape after a short instant replays its graphs
        again: same shapes and offsets, same addresses), else eager."""
        runs: list = []
        start = 0
        while start < len(firings):
            for end in range(len(firings), start, -1):
                key = tuple(f.signature for f in firings[start:end])
                if key in self.graphs:
                    runs.append(("graph", key, tuple(firings[start:end])))
                    start = end
                    break
            else:
                runs.append(("eager", None, (firings[start],)))
                start += 1
        return runs

    def _template_index(self, args: tuple, inputs: dict[str, torch.Tensor]) -> int | None:
        """The precomputed instant this step repeats, if the inputs are exactly the planned ones."""
        runtime = self.runtime
        index = runtime.plan.trace.planned_index(self._instant)
        if index is None or index >= len(runtime.templates):
            return None
        template = runtime.templates[index]
        named = inputs
        if args:
            if len(args) != 1 or len(template.inputs) != 1 or inputs:
                return None
            named = {next(iter(template.inputs)): args[0]}
        if named.keys() != template.inputs.keys():
            return None
        for name, tensor in named.items():
            if (
                not isinstance(tensor, torch.Tensor)
                or tuple(tensor.shape) != template.inputs[name]
                or tensor.dtype != runtime.storage_dtypes[name]
                or tensor.device != runtime.device
            ):
                return None
        inputs.update(named)  # only on a match: the off-plan path names a positional input itself
        return index

    def _sync_simulator(self) -> None:
        """Bring the simulator to the current instant after on-plan steps (which skip it)."""
        if not self.simulator_stale:
            return
        runtime = self.runtime
        index = runtime.plan.trace.planned_index(self._instant)
        lengths, fills = runtime.plan.trace.states[index]
        self.simulator.restore(lengths, fills, runtime.counts_before(self._instant))
        self.simulator_stale = False

    def _plan_step(
        self, args: tuple, inputs: dict[str, torch.Tensor], last: bool = False
    ) -> tuple[list[Firing], Simulator, bool]:
        runtime = self.runtime
        expected = self._input_regions(self._instant)
        if args:
            if len(args) != 1 or len(expected) != 1 or inputs:
                raise StepError(f"pass inputs by name: this instant takes {_names(expected)}")
            inputs[next(iter(expected))] = args[0]
        unknown = sorted(set(inputs) - set(expected))
        missing = sorted(set(expected) - set(inputs))
        if unknown or missing:
            parts = []
            if missing:
                parts.append("missing " + ", ".join(missing))
            if unknown:
                parts.append("unexpected " + ", ".join(unknown))
            raise StepError(
                f"step() at instant {self._instant}: {'; '.join(parts)}; this instant takes {_names(expected)}"
            )
        override: dict[str, int] = {}
        probe = self.simulator.copy()
        planned = {v.region: v for f in probe.copy().run_instant(self._instant) for v in f.views if v.kind == "feed"}
        for name, tensor in inputs.items():
            region = runtime.program.regions[name]
            problem = _input_problem(region, tensor, runtime.device)
            if problem:
                raise StepError(
                    f"step() input '{name}': {problem}; expected {_expected(region, planned[name].length)} "
                    f"on {runtime.device}"
                )
            units = tensor.shape[region.time_axis]
            if units != planned[name].length:
                override[name] = units
        try:
            firings = probe.run_instant(self._instant, override, last=last)
        except ValueError as error:
            raise StepError(f"step() at instant {self._instant}: {error}") from error
        off_plan = bool(override) or last or runtime.plan.trace.planned_index(self._instant) is None
        for firing in firings:
            for view in firing.views:
                capacity = runtime.plan.schedule.regions[view.region].capacity
                needed = max(
                    view.transient if view.kind in ("feed", "write") else 0,
                    (view.start + view.length) if view.length is not None and view.kind != "update" else 0,
                )
                if capacity is not None and needed > capacity:
                    region = runtime.program.regions[view.region]
                    longer = [
                        f"'{name}' has {units} units where the plan feeds {planned[name].length}"
                        for name, units in sorted(override.items())
                        if units > planned[name].length
                    ]
                    cause = (
                        f"input {', '.join(longer)}: feed at most the planned units an instant"
                        if longer
                        else "the session has reached the end of what its .clock plans for: reset() it, or declare "
                        "a longer retention or horizon"
                    )
                    raise StepError(
                        f"step() at instant {self._instant}: region '{view.region}' would hold {needed} "
                        f"units, over its capacity of {capacity} ({region.retention.describe()}); {cause}"
                    )
        return firings, probe, off_plan

    def _execute(
        self,
        kind: str,
        key: tuple | None,
        firings: tuple[Firing, ...],
        inputs: Mapping[str, torch.Tensor],
        outputs: dict,
        off_plan: bool,
    ) -> None:
        """Feed, then replay one fused graph (or run one firing eagerly), then collect outputs."""
        runtime = self.runtime
        for firing in firings:
            for view in firing.views:
                if view.kind == "feed":
                    self.storage[view.region].append(view.offset, 0, inputs[view.region].detach())
        stages = [runtime.program.stages[f.stage] for f in firings]
        with self._rng_scope(any(stage.rng for stage in stages)):
            if kind == "graph":
                graph = self.graphs[key]
                graph.graph.replay()
                module_outputs = graph.module_outputs
                self.counters.replays += len(firings)
                self.counters.per_graph[graph.key] += 1
            else:
                firing = firings[0]
                if firing.instant != self._instant:  # a template: hooks see the real instant and count
                    count = runtime.counts_before(self._instant)[firing.stage]
                    firing = attrs.evolve(
                        firing, instant=self._instant, count=count, time=runtime.plan.clocks.instant_time(self._instant)
                    )
                module_outputs = self._run_body(firing)
                if not off_plan and firing.signature in runtime.first_firing:
                    self.counters.eager_planned += 1
                else:
                    self.counters.eager_off_plan += 1
        for firing in firings:
            for view in firing.views:
                if view.kind != "write":
                    continue
                region = runtime.program.regions[view.region]
                if region.role != "output":
                    continue
                if view.length is None:
                    outputs[view.region] = module_outputs[view.region].clone()
                else:
                    outputs[view.region] = (
                        self.storage[view.region]
                        .view(view.transient)
                        .narrow(region.time_axis, view.offset, view.length)
                        .clone()
                    )

    @torch.no_grad()
    def _run_body(self, firing: Firing) -> dict[str, torch.Tensor]:
        """Bind, call, store, trim: what a graph captures and what eager execution runs.

        Always without autograd: parameters require grad by default, and an in-place write into a
        region under grad mode would chain every tick onto the arena's autograd history."""
        runtime = self.runtime
        program = runtime.program
        stage = program.stages[firing.stage]
        call = runtime.callables[stage.name]
        reads = [v for v in firing.views if v.kind == "read"]
        updates = [v for v in firing.views if v.kind == "update"]
        args: list = []
        kwargs: dict = {}
        handed: dict[str, torch.Tensor] = {}
        read_iter, update_iter = iter(reads), iter(updates)
        for access in stage.accesses:
            if access.kind == "write":
                continue
            view = next(read_iter) if access.kind == "read" else next(update_iter)
            tensor = self._view_tensor(view)
            if access.region in runtime.attributes:
                runtime.attributes[access.region].set(tensor)
                handed[access.region] = tensor
                continue
            if access.alias:
                kwargs[access.alias] = tensor
            else:
                args.append(tensor)
        if call.is_hook:
            if call.wants_firing:
                kwargs["firing"] = firing
            result = call.fn(runtime.model, *args, **kwargs)
        else:
            result = call.fn(*args, **kwargs)
        returned = [a for a in stage.accesses if a.kind in ("update", "write") and a.region not in runtime.attributes]
        values = _as_tuple(result, len(returned), stage.name)
        module_outputs: dict[str, torch.Tensor] = {}
        by_region = {a.region: v for a, v in zip(returned, values)}
        write_views = {v.region: v for v in firing.views if v.kind == "write"}
        for view in updates:
            region = program.regions[view.region]
            if view.region in runtime.attributes:
                new = runtime.attributes[view.region].get()
                if new is handed[view.region] or region.fixed or region.retention.kind == "ring":
                    if new is not handed[view.region]:
                        self.storage[view.region].view(None if region.fixed else view.length).copy_(new)
                    continue
                self._store(stage.name, view, new)
            else:
                self._store(stage.name, view, by_region[view.region])
        for name, view in write_views.items():
            value = by_region.get(name)
            if view.length is None:
                module_outputs[name] = value
                continue
            region = program.regions[name]
            if not _fits(region, value) or value.shape[region.time_axis] != view.length:  # copy_ would broadcast
                raise TypeError(
                    f"stage '{stage.name}' wrote {describe(value)} to region '{name}', declared "
                    f"{region.dtype}[{_dims(region)}] with {view.length} units at this firing"
                )
            self.storage[name].append(view.offset, 0, value)
        for view in firing.views:
            if view.kind in ("feed", "write") and view.kept is not None and view.length is not None:
                region = program.regions[view.region]
                self.storage[view.region].trim(view.transient, region.retention)
        self._bind_current(after=firing)
        return module_outputs

    def _call_text(self, firing: Firing) -> str:
        """How the stage was called, for an error: `module 'path' called as (x f32[1, 2, 1], ...)`."""
        runtime = self.runtime
        stage = runtime.program.stages[firing.stage]
        call = runtime.callables[stage.name]
        parts = ["model"] if call.is_hook else []
        views = iter(v for v in firing.views if v.kind in ("read", "update"))
        for access in stage.accesses:
            if access.kind == "write":
                continue
            view = next(views)
            if access.region in runtime.attributes:
                continue
            shape = view.shape if view.shape is not None else runtime.program.regions[access.region].shape
            text = f"{access.region} {runtime.program.regions[access.region].dtype}[{', '.join(map(str, shape))}]"
            parts.append(f"{access.alias}={text}" if access.alias else text)
        callee = f"hook '{stage.target}'" if call.is_hook else f"module '{stage.target or '(root)'}'"
        return f"{callee} called as ({', '.join(parts)})"

    def _store(self, stage: str, view: View, version: Any) -> None:
        """Keep the retained part of a stage's new version; it must agree with the plan's lengths."""
        region = self.runtime.program.regions[view.region]
        if not _fits(region, version):  # a copy into the region would broadcast it or cast it silently
            raise TypeError(
                f"stage '{stage}' gave {describe(version)} as the new version of region "
                f"'{view.region}', declared {region.dtype}[{_dims(region)}]"
            )
        kept = self.storage[view.region].store_version(version, region.retention)
        if region.fixed:
            return
        if kept != view.kept:
            units = version.shape[region.time_axis]
            raise ValueError(
                f"stage '{stage}' returned {units} units of region '{view.region}'; the .clock says it held "
                f"{view.length} and advances {view.transient - view.length} per firing, so it keeps {view.kept}, "
                f"not {kept} ({region.retention.describe()}); check its `start` and `update` declarations"
            )

    def _view_tensor(self, view: View) -> torch.Tensor:
        region = self.runtime.program.regions[view.region]
        storage = self.storage[view.region]
        if region.fixed:
            return storage.view()
        if view.kind == "update" or region.retention.kind == "ring":
            return storage.view(view.length)
        whole = storage.view(view.start + view.length)
        if view.start == 0:
            return whole
        return whole.narrow(region.time_axis, view.start, view.length)

    def _bind_current(self, after: Firing | None = None) -> None:
        """Point every bound attribute at its region's current view: the lengths at the start of the
        instant, with the updates of every firing of the instant so far (up to `after`) applied."""
        runtime = self.runtime
        if after is None:
            self._bound_lengths = dict(self.simulator.length)
        else:
            for view in after.views:
                if view.kind == "update" and view.kept is not None:
                    self._bound_lengths[view.region] = view.kept
        lengths = self._bound_lengths
        for name, slot in runtime.attributes.items():
            region = runtime.program.regions[name]
            storage = self.storage[name]
            if region.fixed:
                slot.set(storage.view())
            elif region.retention.kind == "ring":
                slot.set(storage.view(region.retention.last))
            else:
                length = lengths.get(name, 0)
                if length == 0 and region.start == "empty" and slot.get() is None and after is None:
                    continue  # lazily created state stays None until the module makes it
                slot.set(storage.view(length))

    @contextlib.contextmanager
    def _rng_scope(self, uses_rng: bool):
        if not uses_rng:
            yield
            return
        device = self.runtime.device
        with _RNG_LOCK:
            lane_state = self.runtime.lane_rng_states[self.lane]
            generator = original = None
            if lane_state is not None:  # this lane's generator state: its graphs were captured with it
                generator = torch.cuda.default_generators[device.index]
                original = generator.graphsafe_get_state()
                generator.graphsafe_set_state(lane_state)
            try:
                saved = _get_rng(device)
                _set_rng(device, self.rng_state)
                try:
                    yield
                finally:
                    self.rng_state = _get_rng(device)
                    _set_rng(device, saved)
            finally:  # the lane's state never stays installed, whatever raised
                if generator is not None:
                    generator.graphsafe_set_state(original)

    # --- graphs ----------------------------------------------------------------------------------

    def _capture_graphs(self) -> None:
        """Capture this slot's graphs ahead of time (the slot's addresses are known before any tick).

        First every planned (stage, signature) is warmed up and probed for host syncs; a stage that
        syncs is planned eager. Then each planned instant's consecutive graphable firings are
        captured as ONE graph (a fused run), so an instant replays with as few launches as possible.

        The warm-up runs on the caller's current stream and only the captures on the lane's stream,
        as `torch.cuda.graph` users do: eager work of a model on a side stream puts the process in a
        state where every CUDA graph replays slower from then on (about 0.3 us more between any two
        kernels: about 180 us, 11 % of a Mimi frame on the H200; docs/benchmarks.md, sixth session).
        """
        runtime = self.runtime
        stream = runtime.lane_stream(self.lane)  # captures only: the lane's cuBLAS workspace is baked into its graphs
        for graph_plan in runtime.plan.capture.captured:
            firing = runtime.first_firing[graph_plan.signature]
            stage = runtime.program.stages[firing.stage]
            if stage.name in runtime.blocked:
                continue
            for storage in self.storage.values():
                storage.fill_zero()
            try:
                with self._rng_scope(stage.rng):
                    self._bound_lengths = dict(runtime.plan.trace.states[firing.instant][0])
                    self._run_body(firing)  # warm-up: lazy buffers, cuBLAS handles, torch.compile'd kernels
                    self._bound_lengths = dict(runtime.plan.trace.states[firing.instant][0])
                    with _sync_debug("error"):
                        self._run_body(firing)  # the probe: a host sync inside the stage raises here
            except Exception as error:  # a sync or host copy: plan this stage eager, say where
                self._block(stage, error)
            torch.cuda.synchronize(runtime.device)
        for index, template in enumerate(runtime.templates):
            self.runs[index] = self._capture_template(
                template, lambda key, firings: self._capture_run(key, firings, stream)
            )
        self.replays = self._resolve_all_replays()
        self.reset()

    def _capture_template(
        self, template: StepTemplate, capture: Callable[[tuple, tuple[Firing, ...]], BaseException | None]
    ) -> list:
        """The instant's runs, each fused run captured by `capture` (None on success, else the error).

        A fused run whose capture fails is split: its firings are captured one by one, the first that
        fails alone has its stage blocked (eager, with a `capture-blocked` warning), and the instant is
        split again around it, so every graph run it returns was captured. When every firing captures
        alone and only the fused run fails, the run's first stage is blocked: each retry blocks one more
        stage, so this ends."""
        runtime = self.runtime
        while True:
            runs = self._runs(template)
            for kind, key, firings in runs:
                if kind != "graph" or key in self.graphs:
                    continue
                error = capture(key, firings)
                if error is None:
                    continue
                culprit, cause = firings[0], error
                if len(firings) > 1:
                    for firing in firings:
                        alone = (firing.signature,)
                        alone_error = None if alone in self.graphs else capture(alone, (firing,))
                        if alone_error is not None:
                            culprit, cause = firing, alone_error
                            break
                self._block(runtime.program.stages[culprit.stage], cause)
                break
            else:
                return runs

    def _runs(self, template: StepTemplate) -> list[tuple[str, tuple | None, tuple[Firing, ...]]]:
        """Split an instant into fused graph runs and eager firings."""
        runtime = self.runtime
        runs: list[tuple[str, tuple | None, tuple[Firing, ...]]] = []
        current: list[Firing] = []
        for firing, key in zip(template.firings, template.keys):
            if key is not None and firing.stage not in runtime.blocked:
                current.append(firing)
                continue
            if current:
                runs.append(("graph", tuple(f.signature for f in current), tuple(current)))
                current = []
            runs.append(("eager", None, (firing,)))
        if current:
            runs.append(("graph", tuple(f.signature for f in current), tuple(current)))
        return runs

    def _capture_run(self, key: tuple, firings: tuple[Firing, ...], stream) -> BaseException | None:
        """Capture one fused run as graph `key`; the error if the capture failed (nothing is kept)."""
        runtime = self.runtime
        stages = [runtime.program.stages[f.stage] for f in firings]
        for storage in self.storage.values():
            storage.fill_zero()
        started = time.perf_counter()
        torch.cuda.synchronize(runtime.device)
        graph = torch.cuda.CUDAGraph()
        module_outputs: dict[str, torch.Tensor] = {}
        try:
            with self._rng_scope(any(stage.rng for stage in stages)):
                self._bound_lengths = dict(runtime.plan.trace.states[firings[0].instant][0])
                with _collector_paused(), torch.cuda.graph(graph, pool=runtime.pools[self.lane], stream=stream):
                    for firing in firings:
                        module_outputs.update(self._run_body(firing))
        except Exception as error:
            torch.cuda.synchronize(runtime.device)
            return error
        torch.cuda.synchronize(runtime.device)
        self.graphs[key] = StageGraph(len(self.graphs), graph, module_outputs, time.perf_counter() - started)
        runtime.capture_seconds += self.graphs[key].capture_seconds
        runtime.graphs_captured = max(runtime.graphs_captured, len(self.graphs))
        return None

    def _block(self, stage, error: BaseException) -> None:
        diagnostic = messages.capture_blocked(stage.name, _first_line(error), stage.span)
        self.runtime.blocked[stage.name] = diagnostic
        warnings.warn(f"{diagnostic.message}; it runs eagerly", CaptureWarning, stacklevel=4)

    def _check_initial(self, initial: Mapping[str, torch.Tensor]) -> None:
        runtime = self.runtime
        given = {n: r for n, r in runtime.program.regions.items() if r.start == "given"}
        for name in initial:
            if name not in given:
                raise StepError(
                    f"initial value for '{name}', which is not a region declared `start given`; "
                    f"those are: {_names(given) or 'none'}"
                )
        missing = sorted(set(given) - set(initial))
        if missing:
            raise StepError(f"the session needs initial values for {', '.join(missing)} (declared `start given`)")
        for name, tensor in initial.items():
            region = given[name]
            length = None if region.fixed else region.start_length
            want = region.shape if region.fixed else region.shape_at(length)
            if (
                not isinstance(tensor, torch.Tensor)
                or tuple(tensor.shape) != tuple(want)
                or tensor.dtype != TORCH_DTYPES[region.dtype]
            ):
                raise StepError(
                    f"initial value for '{name}' is {describe(tensor)}; expected {region.dtype}"
                    f"[{', '.join(map(str, want))}]"
                )


def _fits(region, value: Any) -> bool:
    """Whether `value` is a tensor of the region's dtype and declared dims (any length on the time axis)."""
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == TORCH_DTYPES[region.dtype]
        and value.dim() == len(region.shape)
        and all(dim is None or value.shape[axis] == dim for axis, dim in enumerate(region.shape))
    )


def _dims(region) -> str:
    return ", ".join("time" if d is None else str(d) for d in region.shape)


def _names(regions) -> str:
    return ", ".join(sorted(regions)) or "no inputs"


def _expected(region, length: int) -> str:
    return f"{region.dtype}[{', '.join(map(str, region.shape_at(length)))}]"


def _input_problem(region, tensor: Any, device: torch.device) -> str | None:
    if not isinstance(tensor, torch.Tensor):
        return f"got {type(tensor).__name__}, not a tensor"
    if tensor.dtype != TORCH_DTYPES[region.dtype]:
        return f"dtype {describe(tensor)}"
    if tensor.device != device and not (tensor.device.type == device.type == "cuda" and device.index is None):
        return f"on {tensor.device}"
    if tensor.dim() != len(region.shape):
        return f"got {describe(tensor)}"
    for axis, dim in enumerate(region.shape):
        if dim is not None and tensor.shape[axis] != dim:
            return f"got {describe(tensor)}"
    units = tensor.shape[region.time_axis]
    if units < 0:
        return "no units"
    return None


def _as_tuple(result: Any, count: int, stage: str) -> tuple:
    if count == 0:
        return ()
    if count == 1:
        if isinstance(result, (tuple, list)) and len(result) == 1:
            return (result[0],)
        return (result,)
    if not isinstance(result, (tuple, list)) or len(result) != count:
        raise TypeError(
            f"stage '{stage}' must return {count} tensors (its unbound updates and writes, in "
            f"declared order), got {type(result).__name__}"
        )
    return tuple(result)


_RNG_LOCK = threading.RLock()
"""Held while a session's RNG state is swapped into the device's default generator: that generator
is one per process, so runtimes stepped from several threads take turns at their `rng` stages."""

_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _capture_stream(device: torch.device):
    """One side stream per device for every capture of the process: cuBLAS keeps a workspace per
    stream, so a new stream per session would cost one more workspace (32 MiB) each time."""
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device=device)
    return _CAPTURE_STREAMS[device]


_LANE_STREAMS: dict[tuple[torch.device, int], torch.cuda.Stream] = {}


def _lane_stream(device: torch.device, lane: int):
    """Lane 0 runs on the process's capture stream (so a one-lane runtime captures as before), lane k on
    a side stream of its own, shared by lane k of every runtime on the device (one cuBLAS workspace
    each, as for the capture stream; lanes of two runtimes are never stepped in one call)."""
    if lane == 0:
        return _capture_stream(device)
    if (device, lane) not in _LANE_STREAMS:
        _LANE_STREAMS[(device, lane)] = torch.cuda.Stream(device=device)
    return _LANE_STREAMS[(device, lane)]


def _seeded_rng_state(seed: int, device: torch.device) -> torch.Tensor:
    """The default generator's state after `manual_seed(seed)`, from a generator of our own: seeding the
    process's default generator and restoring it would race with another thread's `rng` stage drawing
    from it (and `torch.manual_seed` reseeds every device; `torch.cuda.manual_seed` the current one,
    not necessarily `device`)."""
    generator = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()  # as _get_rng
    return generator.manual_seed(seed).get_state()


def _get_rng(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


@contextlib.contextmanager
def _collector_paused():
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


@contextlib.contextmanager
def _sync_debug(mode: str):
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
