"""The runtime: a plan bound to a PyTorch model, sessions that own their regions, exact-shape graphs.

    rt = Runtime.load("mimi.clock", model=decoder, params={"B": 1}, device="cuda", hooks={...})
    s = rt.session()            # a session owns its regions in the arena
    pcm = s.step(codes=c)       # one instant: feed inputs, replay each stage's graph (or run it eagerly)
    s.reset()                   # barge-in: state back to its declared start, addresses unchanged
    rt.report()                 # bytes per region vs stock, graphs, capture time, replays, eager firings

One `step` runs one instant of the plan: every stage that fires at it, in dataflow order. A stage
firing is executed by its *body* (body.py): bind the region views (exact shape, stable address) to
module attributes or pass them as arguments, call the stage, copy what it returns into its regions
with the declared retention, trim. On CUDA the bodies are captured ahead of time into CUDA graphs, in
the runs the capture strategy plans (capture/), and replayed; everything else runs the same body
eagerly, so the two paths execute the same arithmetic.

The runtime's modules: session.py (the step path), inputs.py, body.py, replay.py, capture/, rng.py,
lanes.py, reports.py, errors.py; binding.py and storage.py below them.

Public: `Runtime`, `resolve_device`, `available_bytes`, `check_arena_fits`; and, for the names users import
from here, `Session`, `StepError`, `SessionFailed`, `SessionsFailed`, `CaptureWarning`, `RuntimeReport`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.plans.off_plan import OffPlanStep
from duplexcadence.interpreter.plans.plan import Plan, make_plan
from duplexcadence.interpreter.plans.trace import Firing
from duplexcadence.interpreter.runtime import capture as capture_strategies
from duplexcadence.interpreter.runtime.binding import (
    Attribute,
    ObjectSource,
    StageCallable,
    bind_objects,
    bind_program,
    host_counters,
)
from duplexcadence.interpreter.runtime.body import first_call_object
from duplexcadence.interpreter.runtime.capture import CaptureStrategy, off_plan_templates, templates_of
from duplexcadence.interpreter.runtime.capture.graphs import capture_slot
from duplexcadence.interpreter.runtime.errors import CaptureWarning, SessionFailed, SessionsFailed, StepError
from duplexcadence.interpreter.runtime.lanes import lane_stream, step_many
from duplexcadence.interpreter.runtime.replay import resolve_all
from duplexcadence.interpreter.runtime.reports import Counters, RegionReport, RuntimeReport
from duplexcadence.interpreter.runtime.rng import lane_rng_states
from duplexcadence.interpreter.runtime.session import Session
from duplexcadence.interpreter.runtime.storage import TORCH_DTYPES, DeviceArena

__all__ = [
    "CaptureWarning",
    "Runtime",
    "RuntimeReport",
    "Session",
    "SessionFailed",
    "SessionsFailed",
    "StepError",
    "available_bytes",
    "check_arena_fits",
    "resolve_device",
]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch.device with its index (the current CUDA device for a bare "cuda"); None: CUDA
    when there is one, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def host_available_bytes() -> int | None:
    """The host memory available to a new allocation (MemAvailable of /proc/meminfo, or psutil's), None
    where neither tells."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def available_bytes(device: torch.device) -> tuple[int, int] | None:
    """(free on the device, cached by PyTorch's allocator but unused) for a CUDA device; for the CPU, (the
    host's available memory, 0); None elsewhere, or where the host does not tell. The allocator returns
    its cached blocks to the driver before it gives up on an allocation, so both count as available."""
    if device.type == "cpu":
        free = host_available_bytes()
        return None if free is None else (free, 0)
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


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_counts(sessions: Any, lanes: Any, max_graphs: Any) -> None:
    """ValueError for a `sessions`, `lanes` or `max_graphs` of the wrong type or out of range."""
    if not _whole(sessions) or sessions < 1:
        raise ValueError(f"sessions must be a whole number of at least 1 (an int), not {sessions!r}")
    if not _whole(lanes) or not 1 <= lanes <= sessions:
        raise ValueError(
            f"lanes must be a whole number from 1 to sessions ({sessions}), not {lanes!r}: a lane "
            "without a session slot would hold a scratch block nothing uses"
        )
    if max_graphs is not None and (not _whole(max_graphs) or max_graphs < 0):
        raise ValueError(f"max_graphs must be None (no budget) or a whole number of at least 0, not {max_graphs!r}")


class Runtime:
    """A plan bound to a model on one device, with an arena for `sessions` session slots in `lanes`
    lanes: slot i belongs to lane i % lanes; each lane has its own scratch block, graph memory pool
    and (on CUDA) stream, so sessions of different lanes can be stepped concurrently (`step_many`).

    Threads: the sessions of one lane share its scratch block, and all sessions share the double
    buffers and the model's bound attributes, so `lock` serialises steps (and resets, closes,
    captures, reports): any thread may step any session, one call at a time. For steps that run in
    parallel, use lanes and `step_many` from one thread, or load one runtime per thread, each on its
    own model instance (binding sets the model's attributes).

    What the sessions share (read it, do not assign it): `plan`, `program`, `callables` and `attributes`
    (the binding), `capture` (the capture strategy), `templates` (every planned instant), `blocked` (the
    stages that run eagerly, with why), `pools` (each lane's CUDA graph memory pool, None without
    graphs), `lane_rng_states`, `slot_graphs` (each slot's graphs, runs and resolved replays), `pruned_inputs`
    and `pruned_given` (the input and `start given` regions the plan pruned: a step or a session takes them
    and ignores them, `without_pruned`).
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
        capture: CaptureStrategy | None = None,
        object_sources: dict[str, ObjectSource] | None = None,
        check_finite: bool = False,
        lane_threads: bool | None = None,
    ):
        self.plan = plan
        self.program: Program = plan.program
        self.model = model
        self.device = device
        self.callables = callables
        self.attributes = attributes
        self.graphs_enabled = graphs
        self.capture = capture or capture_strategies.get(capture_strategies.DEFAULT)
        self.on_reset = on_reset
        self.lanes = lanes
        self.object_sources = dict(object_sources or {})
        self.check_finite = check_finite
        self.host_counters = host_counters(self.program, attributes, self.object_sources, model)
        """The counters bound to an attribute that holds a Python int: set to the host value before each firing."""
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
        self.eager_lock = threading.RLock()
        """Held around every eager firing: the binding sets the model's attributes, so eager firings of
        lanes stepped from threads of their own take turns (graph replays do not need it)."""
        self.lane_threads = device.type == "cuda" and lanes > 1 if lane_threads is None else bool(lane_threads)
        """Whether `step_many` steps each lane from a thread of its own (see there)."""
        self.lane_workers: ThreadPoolExecutor | None = None
        self.free_slots = list(range(sessions))
        self.blocked: dict[str, Diagnostic] = {}
        self.obstacles: dict[str, tuple[Diagnostic, ...]] = {}
        """Per blocked stage, every obstacle to its capture the warm-up found (capture/obstacles.py)."""
        # graphs share a private memory pool only within a lane: the pool's allocator assumes its graphs
        # replay one after another, which holds within a lane (one stream) but not across lanes
        self.pools = [torch.cuda.graph_pool_handle() for _ in range(lanes)] if graphs else [None] * lanes
        self.pool = self.pools[0]
        self.pool_bytes: dict[int, int] = {}
        """What each lane's graph pool reserves (the graphs' working memory), measured after each capture."""
        # each lane's graphs draw random numbers through their own CUDA generator state (rng.lane_rng_states)
        self.lane_rng_states: list[Any] = lane_rng_states(device, lanes)
        self.first_firing: dict[tuple, Firing] = {}
        for firing in plan.trace.firings:
            self.first_firing.setdefault(firing.signature, firing)
        self.graph_key = {g.signature: g.key for g in plan.capture.graphs if g.captured}
        # an on-plan step repeats a traced instant: its firings, graph keys and input shapes, precomputed
        self.templates = templates_of(plan)
        self.off_plan_templates = off_plan_templates(plan)
        self.declared_instants = frozenset(template.key for template in self.templates + self.off_plan_templates)
        """The firings' signatures of every planned and declared off-plan instant (a step's `undeclared`)."""
        self.off_plan_blocked: dict[bool, dict[str, Diagnostic]] = {}
        """Stages that run eagerly at off-plan instants only (by whether the instant is a stream's last)."""
        self.off_plan_probed: set[tuple[str, bool]] = set()
        """The (stage, last) kinds of off-plan firing probed for capture (once for every slot)."""
        self.storage_dtypes = {name: TORCH_DTYPES[r.dtype] for name, r in plan.program.regions.items()}
        self.pruned_inputs = frozenset(r.name for r in plan.pruning.regions if r.input)
        self.pruned_given = frozenset(
            r.name for r in plan.pruning.regions if plan.pruning.source.regions[r.name].start == "given"
        )
        instants = plan.clocks.instants
        self._prefix_counts: list[Counter[str]] = [Counter() for _ in range(len(instants) + 1)]
        for phase, instant in enumerate(instants):
            self._prefix_counts[phase + 1] = self._prefix_counts[phase] + Counter(instant.stages)
        self.sessions: list[Session] = []
        self.closed_counters = Counters()
        # graphs bake in addresses, and addresses belong to a slot: a later session in the slot reuses them
        self.slot_graphs: dict[int, tuple[dict, dict, dict]] = {}  # slot -> its graphs, runs and resolved replays
        self.capture_seconds = 0.0
        self.graphs_captured = 0

    def without_pruned(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` (step inputs or initial values by region) without the regions the plan pruned: a pruned
        input or `start given` region is taken and ignored, so a caller passes what the program declares."""
        pruned = self.pruned_inputs | self.pruned_given
        return {name: value for name, value in values.items() if name not in pruned}

    def lane_of(self, slot: int) -> int:
        """The lane of session slot `slot`: slots are dealt to lanes round-robin."""
        return slot % self.lanes

    def lane_stream(self, lane: int):
        """Lane `lane`'s CUDA stream: its graphs are captured on it and `step_many` runs it on it."""
        return lane_stream(self.device, lane)

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
        capture: str | None = None,
        objects: Mapping[str, Any] | None = None,
        check_finite: bool = False,
        prune: bool = True,
        lane_threads: bool | None = None,
        off_plan: Sequence[OffPlanStep] = (),
    ) -> Runtime:
        """Check the `.clock` file, plan it, bind it to `model`, and allocate the arena.

        `params` override the file's params (values as Python numbers or `.clock` text).
        `capture`: the capture strategy by name (`capture.available()`): "fused" (the default) captures an
        instant's consecutive capturable firings as one CUDA graph, "per-stage" one graph per firing,
        "eager" none. Graphs are captured on a CUDA device only; elsewhere every firing runs eagerly.
        `graphs`: False (or "off", "never") is `capture="eager"`; "auto" follows `capture`.
        `lanes`: how many sessions `step_many` can run at once (1 to `sessions`); each lane adds one
        copy of the scratch block to the arena and has its own graph pool and CUDA stream.
        `lane_threads`: `step_many` steps each lane from a thread of its own (default: on CUDA with more
        than one lane), so that one lane's graph launches and host waits overlap the others'; False
        interleaves the lanes run by run on the caller's thread.
        `objects`: the caller-owned objects the `.clock` declares without a factory (`object NAME`), by name.
        `check_finite`: refuse step inputs with NaN or infinite values (StepError); by default they propagate.
        `prune`: leave out the stages no output sees, and the regions, counters and objects only they touch
        (`plan.pruning` lists them): they never run, are not bound and have no arena bytes; `prune=False`
        runs every stage, for a caller that reads their state (`Session.region`).
        `off_plan`: the steps off the plan a session may take (`OffPlanStep`s: a flush of a short input, the
        last instant); every instant they lead to is captured like a planned one (`plan.off_plan`).
        Raises `ClockError` with located diagnostics when the file, the binding or the budget fails, and
        ValueError for arguments of the wrong type or out of range, or off-plan steps it cannot take.
        """
        _check_counts(sessions, lanes, max_graphs)
        if graphs in (False, "off", "never"):
            if capture not in (None, "eager"):
                raise ValueError(
                    f"graphs={graphs!r} runs every firing eagerly, which is capture='eager', not capture={capture!r}; "
                    "give one of the two"
                )
            capture = "eager"
        strategy = capture_strategies.get(capture or capture_strategies.DEFAULT)
        device = resolve_device(device)
        program = (
            clock if isinstance(clock, Program) else load_program(clock, {k: str(v) for k, v in (params or {}).items()})
        )
        plan = make_plan(program, max_graphs=max_graphs, prune=prune, off_plan=off_plan)
        counted = plan.program.run_time_count()
        if counted is not None:
            raise ClockError([messages.engine_only(*counted)])
        callables, attributes = bind_program(plan.program, model, hooks, device)

        def stage_made(name: str, others: dict[str, Any]) -> Any:  # `object NAME from stage STAGE`
            stage = plan.program.objects[name].stage
            firing = next(f for f in plan.trace.firings if f.stage == stage)
            return first_call_object(plan.program, firing, callables[firing.stage], model, name, others, device)

        sources = bind_objects(plan.program, model, hooks, objects, device, stage_made)
        check_arena_fits(plan, sessions, device, lanes)
        use_graphs = device.type == "cuda" and strategy.graphs
        return cls(
            plan,
            model,
            device,
            callables,
            attributes,
            sessions,
            use_graphs,
            on_reset,
            lanes,
            strategy,
            sources,
            bool(check_finite),
            lane_threads,
        )

    def session(
        self, initial: Mapping[str, torch.Tensor] | None = None, seed: int = 0, check_finite: bool | None = None
    ) -> Session:
        """A new session in a free slot: its regions at their start, its own RNG state from `seed`;
        `check_finite` (default: the runtime's) refuses step inputs with NaN or infinite values."""
        with self.lock:
            if not self.free_slots:
                raise RuntimeError(
                    f"all {self.arena.sessions} session slots are in use; close a session or load "
                    f"the runtime with sessions={self.arena.sessions + 1}"
                )
            slot = self.free_slots[0]
            session = Session(
                self, slot, initial, seed, check_finite
            )  # raises before taking the slot on bad initial values
            if self.graphs_enabled:
                if slot not in self.slot_graphs:
                    capture_slot(session, self.capture)  # an error here leaves the slot free
                    session.replays = resolve_all(self.program, session.storage, session.graphs, session.runs)
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
        slot) and no session changes. Sessions of one lane share its scratch block: they run one after
        another in the lane, on its CUDA stream. With `lane_threads` (on CUDA with lanes, by default)
        each lane is stepped from a thread of its own, so one lane's graph launches (a launch of a large
        graph holds the host for milliseconds) and host waits (`torch.istft`'s check) overlap the other
        lanes'; eager firings take turns (`eager_lock`: the binding sets the model's attributes) and graph
        replays do not. Otherwise the host interleaves the sessions run by run: the first run (a fused
        graph replay or an eager firing) of every lane's session, then the second, and so on, so a host
        wait in one lane comes after the other lanes' work is queued; off the CUDA device, one run at a
        time. Each lane's stream first waits on the caller's current stream, and the caller's current
        stream waits on every lane before this returns, so the inputs may come from, and the outputs be
        used on, the current stream. A stage that raises fails its session only: the others complete
        their instant and `SessionsFailed` is raised with their outputs.
        """
        with self.lock:
            if self.lane_threads and self.lane_workers is None:
                self.lane_workers = ThreadPoolExecutor(self.lanes, thread_name_prefix="duplexcadence-lane")
            return step_many(self, self.device, steps, self.lane_workers if self.lane_threads else None)

    # --- reporting -------------------------------------------------------------------------------

    def report(self) -> RuntimeReport:
        """Its regions, graphs, and the counters of its open and closed sessions, now."""
        with self.lock:
            regions = tuple(
                RegionReport(r.name, r.bytes, r.stock_bytes, r.double_buffer_bytes)
                for r in self.plan.schedule.regions.values()
            )
            totals = attrs.evolve(self.closed_counters)
            for session in self.sessions:
                totals.add_totals(session.counters)
            planned = {g.signature for g in self.plan.capture.graphs}
            covered = {signature for graphs, _, _ in self.slot_graphs.values() for key in graphs for signature in key}
            off_plan_graphs = max(
                (
                    len(set(graphs) - {run.key for instant in runs.values() for run in instant})
                    for graphs, runs, _ in self.slot_graphs.values()
                ),
                default=0,
            )
            return RuntimeReport(
                str(self.device),
                self.arena.sessions,
                self.arena.nbytes,
                self.plan.arena.session_bytes,
                self.plan.arena.scratch_bytes,
                regions,
                len(self.plan.capture.graphs),
                self.graphs_captured,
                len(covered & planned),
                self.capture_seconds,
                tuple(d for name, first in self.blocked.items() for d in self.obstacles.get(name, (first,))),
                totals.replays,
                totals.eager_planned,
                totals.eager_off_plan,
                self.lanes,
                totals.short_path_steps,
                self.capture.name,
                len(self.plan.off_plan.instants),
                off_plan_graphs,
                totals.replays_off_plan,
                totals.undeclared_steps,
                sum(self.pool_bytes.values()),
                self.plan.arena.reserved_bytes(self.arena.sessions, self.lanes),
                tuple(d for blocked in self.off_plan_blocked.values() for d in blocked.values()),
            )

    def verify(self, stock, inputs, ticks: int | None = None, seed: int = 0, deterministic: bool = False):
        """Run stock eager and a fresh session side by side, under the process's cuDNN settings (the stock loop's)
        or, with `deterministic`, deterministic cuDNN; see `duplexcadence.interpreter.runtime.verify`."""
        from duplexcadence.interpreter.runtime.verify import verify

        return verify(self, stock, inputs, ticks=ticks, seed=seed, deterministic=deterministic)
