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
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import torch

from ..dsl import messages
from ..dsl.compiler import load_program
from ..dsl.diagnostics import ClockError, Diagnostic
from ..dsl.program import Program
from .binding import Attribute, StageCallable, bind_program, describe
from .plan import Plan, make_plan
from .storage import TORCH_DTYPES, DeviceArena, RegionStorage
from .trace import Firing, Simulator, View


class StepError(ValueError):
    """A `step()` call with bad inputs; the session's state is exactly as before the call."""


class SessionFailed(RuntimeError):
    """A stage raised during a step: the session refuses further steps until `reset()`."""


class CaptureWarning(UserWarning):
    """A stage could not be captured into a CUDA graph and runs eagerly."""


@attrs.define
class StageGraph:
    key: int
    graph: Any
    module_outputs: dict[str, torch.Tensor]
    capture_seconds: float


@attrs.define
class Counters:
    """What a session did: graph replays, eager firings (planned, e.g. over budget; or off-plan)."""

    steps: int = 0
    replays: int = 0
    eager_planned: int = 0
    eager_off_plan: int = 0
    per_graph: Counter = attrs.field(factory=Counter)


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
    capture_seconds: float
    blocked: tuple[Diagnostic, ...]
    replays: int
    eager_planned: int
    eager_off_plan: int

    @property
    def stock_bytes(self) -> int:
        return sum(r.stock_bytes for r in self.regions if r.stock_bytes is not None)

    @property
    def compared_bytes(self) -> int:
        return sum(r.bytes for r in self.regions if r.stock_bytes is not None)

    def __str__(self) -> str:
        from .plan_report import human_bytes

        lines = [f"DuplexCadence runtime on {self.device}: {self.sessions} session slot(s)",
                 f"  arena {human_bytes(self.arena_bytes)} in one allocation ({human_bytes(self.session_bytes)} "
                 f"per session + {human_bytes(self.scratch_bytes)} shared scratch)"]
        if self.stock_bytes:
            lines.append(f"  regions with a stock allocation: {human_bytes(self.compared_bytes)} vs stock "
                         f"{human_bytes(self.stock_bytes)} per session")
        lines.append(f"  graphs: {self.graphs_captured} captured of {self.graphs_planned} planned in "
                     f"{self.capture_seconds:.2f} s; replays {self.replays}; eager firings {self.eager_planned} "
                     f"planned + {self.eager_off_plan} outside the plan")
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


class Runtime:
    """A plan bound to a model on one device, with an arena for `sessions` session slots."""

    def __init__(self, plan: Plan, model: Any, device: torch.device, callables: dict[str, StageCallable],
                 attributes: dict[str, Attribute], sessions: int, graphs: bool,
                 on_reset: Callable[[Any], None] | None):
        self.plan = plan
        self.program: Program = plan.program
        self.model = model
        self.device = device
        self.callables = callables
        self.attributes = attributes
        self.graphs_enabled = graphs
        self.on_reset = on_reset
        self.arena = DeviceArena(plan.arena, sessions, device)
        self.lock = threading.RLock()
        self.free_slots = list(range(sessions))
        self.blocked: dict[str, Diagnostic] = {}
        self.pool = torch.cuda.graph_pool_handle() if graphs else None
        self.first_firing: dict[tuple, Firing] = {}
        for firing in plan.trace.firings:
            self.first_firing.setdefault(firing.signature, firing)
        self.graph_key = {g.signature: g.key for g in plan.capture.graphs if g.captured}
        self.sessions: list[Session] = []
        self.closed_counters = Counters()
        # graphs bake in addresses, and addresses belong to a slot: a later session in the slot reuses them
        self.slot_graphs: dict[int, dict[int, StageGraph]] = {}
        self.capture_seconds = 0.0
        self.graphs_captured = 0

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    def load(cls, clock: str | Path | Program, model: Any, params: Mapping[str, Any] | None = None,
             device: str | torch.device | None = None, hooks: Mapping[str, Callable] | None = None,
             sessions: int = 1, graphs: bool | str = "auto", max_graphs: int | None = None,
             on_reset: Callable[[Any], None] | None = None) -> Runtime:
        """Check the `.clock` file, plan it, bind it to `model`, and allocate the arena.

        `params` override the file's params (values as Python numbers or `.clock` text).
        `graphs`: "auto" captures CUDA graphs on a CUDA device; False runs every firing eagerly.
        Raises `ClockError` with located diagnostics when the file, the binding or the budget fails.
        """
        device = _device(device)
        if sessions < 1:
            raise ValueError(f"sessions must be at least 1, not {sessions}")
        program = clock if isinstance(clock, Program) else load_program(
            clock, {k: str(v) for k, v in (params or {}).items()})
        plan = make_plan(program, max_graphs=max_graphs)
        callables, attributes = bind_program(program, model, hooks, device)
        needed = plan.arena.total_bytes(sessions)
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            if needed > free:
                raise ClockError([messages.arena_does_not_fit(needed, free, str(device))])
        use_graphs = device.type == "cuda" and graphs not in (False, "off", "never")
        return cls(plan, model, device, callables, attributes, sessions, use_graphs, on_reset)

    def session(self, initial: Mapping[str, torch.Tensor] | None = None, seed: int = 0) -> Session:
        """A new session in a free slot: its regions at their start, its own RNG state from `seed`."""
        with self.lock:
            if not self.free_slots:
                raise RuntimeError(f"all {self.arena.sessions} session slots are in use; close a session or load "
                                   f"the runtime with sessions={self.arena.sessions + 1}")
            slot = self.free_slots[0]
            session = Session(self, slot, initial, seed)  # raises before taking the slot on bad initial values
            self.free_slots.pop(0)
            if self.graphs_enabled:
                if slot not in self.slot_graphs:
                    session._capture_graphs()
                    self.slot_graphs[slot] = session.graphs
                session.graphs = self.slot_graphs[slot]
            self.sessions.append(session)
            return session

    # --- reporting -------------------------------------------------------------------------------

    def report(self) -> RuntimeReport:
        schedule = self.plan.schedule
        regions = tuple(RegionReport(r.name, r.bytes, r.stock_bytes, r.double_buffer_bytes)
                        for r in schedule.regions.values())
        totals = attrs.evolve(self.closed_counters)
        for session in self.sessions:
            totals.replays += session.counters.replays
            totals.eager_planned += session.counters.eager_planned
            totals.eager_off_plan += session.counters.eager_off_plan
        return RuntimeReport(str(self.device), self.arena.sessions, self.arena.nbytes, self.plan.arena.session_bytes,
                             self.plan.arena.scratch_bytes, regions, len(self.plan.capture.graphs),
                             self.graphs_captured, self.capture_seconds, tuple(self.blocked.values()),
                             totals.replays, totals.eager_planned, totals.eager_off_plan)

    def verify(self, stock, inputs, ticks: int | None = None, seed: int = 0):
        """Run stock eager and a fresh session side by side; see `duplexcadence.interpreter.verify`."""
        from .verify import verify

        return verify(self, stock, inputs, ticks=ticks, seed=seed)


class Session:
    """One conversation's state: its regions in its arena slot, its clock position and RNG state."""

    def __init__(self, runtime: Runtime, slot: int, initial: Mapping[str, torch.Tensor] | None, seed: int):
        self.runtime = runtime
        self.slot = slot
        self.seed = seed
        program = runtime.program
        self.storage: dict[str, RegionStorage] = {}
        for name, region in program.regions.items():
            flat = runtime.arena.block(name, slot if runtime.plan.schedule.regions[name].persistent else None)
            double = None
            if runtime.plan.schedule.regions[name].double_buffer_bytes:
                double = runtime.arena.block(f"{name}~double", None)
            self.storage[name] = RegionStorage(region, flat, double)
        self.graphs: dict[int, StageGraph] = {}
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

    def reset(self, initial: Mapping[str, torch.Tensor] | None = None) -> None:
        """Back to the declared start (barge-in, new turn); every address stays where it was."""
        runtime = self.runtime
        with runtime.lock:
            if initial is not None:
                self._check_initial(initial)
                self.initial = dict(initial)
            for name, storage in self.storage.items():
                if runtime.plan.schedule.regions[name].persistent:
                    storage.fill_zero()
                    region = runtime.program.regions[name]
                    if region.start == "given":
                        source = self.initial[name]
                        storage.view(None if region.fixed else region.start_length).copy_(source)
            self.simulator = Simulator(runtime.program, runtime.plan.clocks)
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
        consumed too and every write's latency is released (stages see `firing.last`). The session
        then refuses steps until `reset()`."""
        return self._step(args, inputs, last=True)

    def _step(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool):
        runtime = self.runtime
        if self.closed:
            raise RuntimeError("this session is closed")
        if self.failed is not None:
            raise SessionFailed(f"the session failed at instant {self._instant} ({self.failed!r}); "
                                "call reset() to start it again") from self.failed
        if self.finished:
            raise StepError(f"the session finished its stream at instant {self._instant - 1}; call reset() to "
                            "start the next one")
        with runtime.lock:
            firings, simulator = self._plan_step(args, inputs, last)
            outputs: dict[str, torch.Tensor] = {}
            try:
                for firing in firings:
                    self._execute(firing, inputs, outputs)
            except Exception as error:
                self.failed = error
                raise SessionFailed(f"stage '{firing.stage}' raised at instant {self._instant}: {error!r}; "
                                    "the session refuses further steps until reset()") from error
            self.simulator = simulator
            self._instant += 1
            self.counters.steps += 1
            self.finished = last
        if len(outputs) == 1:
            return next(iter(outputs.values()))
        return outputs

    def region(self, name: str) -> torch.Tensor:
        """The current exact view of a region (for inspection; do not keep it across steps)."""
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
                    runtime.closed_counters.replays += self.counters.replays
                    runtime.closed_counters.eager_planned += self.counters.eager_planned
                    runtime.closed_counters.eager_off_plan += self.counters.eager_off_plan

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

    def _plan_step(self, args: tuple, inputs: dict[str, torch.Tensor],
                   last: bool = False) -> tuple[list[Firing], Simulator]:
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
            raise StepError(f"step() at instant {self._instant}: {'; '.join(parts)}; this instant takes "
                            f"{_names(expected)}")
        override: dict[str, int] = {}
        probe = self.simulator.copy()
        planned = {v.region: v for f in probe.copy().run_instant(self._instant) for v in f.views if v.kind == "feed"}
        for name, tensor in inputs.items():
            region = runtime.program.regions[name]
            problem = _input_problem(region, tensor, runtime.device)
            if problem:
                raise StepError(f"step() input '{name}': {problem}; expected {_expected(region, planned[name].length)} "
                                f"on {runtime.device}")
            units = tensor.shape[region.time_axis]
            if units != planned[name].length:
                override[name] = units
        try:
            firings = probe.run_instant(self._instant, override, last=last)
        except ValueError as error:
            raise StepError(f"step() at instant {self._instant}: {error}") from error
        return firings, probe

    def _execute(self, firing: Firing, inputs: Mapping[str, torch.Tensor], outputs: dict) -> None:
        runtime = self.runtime
        stage = runtime.program.stages[firing.stage]
        for view in firing.views:
            if view.kind == "feed":
                self.storage[view.region].append(view.offset, 0, inputs[view.region].detach())
        key = runtime.graph_key.get(firing.signature)
        graph = self.graphs.get(key) if key is not None else None
        rng = self._rng_scope(stage.rng)
        with rng:
            if graph is not None:
                graph.graph.replay()
                module_outputs = graph.module_outputs
                self.counters.replays += 1
                self.counters.per_graph[key] += 1
            else:
                module_outputs = self._run_body(firing)
                if firing.signature in runtime.first_firing:
                    self.counters.eager_planned += 1
                else:
                    self.counters.eager_off_plan += 1
        for view in firing.views:
            region = runtime.program.regions[view.region]
            if view.kind == "write" and region.role == "output":
                if view.length is None:
                    outputs[view.region] = module_outputs[view.region].clone()
                else:
                    outputs[view.region] = self.storage[view.region].view(view.transient).narrow(
                        region.time_axis, view.offset, view.length).clone()

    def _run_body(self, firing: Firing) -> dict[str, torch.Tensor]:
        """Bind, call, store, trim: what a graph captures and what eager execution runs."""
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
            if not isinstance(value, torch.Tensor) or value.dtype != TORCH_DTYPES[region.dtype]:
                raise TypeError(f"stage '{stage.name}' wrote {describe(value)} to region '{name}', declared "
                                f"{region.dtype}[{_dims(region)}]")
            self.storage[name].append(view.offset, 0, value)
        for view in firing.views:
            if view.kind in ("feed", "write") and view.kept is not None and view.length is not None:
                region = program.regions[view.region]
                self.storage[view.region].trim(view.transient, region.retention)
        self._bind_current(after=firing)
        return module_outputs

    def _store(self, stage: str, view: View, version: Any) -> None:
        """Keep the retained part of a stage's new version; it must agree with the plan's lengths."""
        region = self.runtime.program.regions[view.region]
        if (not isinstance(version, torch.Tensor) or version.dim() != len(region.shape)
                or version.dtype != TORCH_DTYPES[region.dtype]
                or (region.fixed and tuple(version.shape) != tuple(region.shape))):
            raise TypeError(f"stage '{stage}' gave {describe(version)} as the new version of region "
                            f"'{view.region}', declared {region.dtype}[{_dims(region)}]")
        kept = self.storage[view.region].store_version(version, region.retention)
        if region.fixed:
            return
        if kept != view.kept:
            units = version.shape[region.time_axis]
            raise ValueError(
                f"stage '{stage}' returned {units} units of region '{view.region}'; the .clock says it held "
                f"{view.length} and advances {view.transient - view.length} per firing, so it keeps {view.kept}, "
                f"not {kept} ({region.retention.describe()}); check its `start` and `update` declarations")

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
        """Point every bound attribute at its region's current view (lengths after `after`)."""
        runtime = self.runtime
        lengths = dict(self.simulator.length) if after is None else {}
        if after is not None:
            lengths = dict(self.simulator.length)
            for view in after.views:
                if view.kind == "update" and view.kept is not None:
                    lengths[view.region] = view.kept
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
        saved = _get_rng(device)
        _set_rng(device, self.rng_state)
        try:
            yield
        finally:
            self.rng_state = _get_rng(device)
            _set_rng(device, saved)

    # --- graphs ----------------------------------------------------------------------------------

    def _capture_graphs(self) -> None:
        """Capture every planned graph for this session's addresses (ahead of time, at session start)."""
        runtime = self.runtime
        stream = torch.cuda.Stream(device=runtime.device)
        for graph_plan in runtime.plan.capture.captured:
            firing = runtime.first_firing[graph_plan.signature]
            stage = runtime.program.stages[firing.stage]
            if stage.name in runtime.blocked:
                continue
            for storage in self.storage.values():
                storage.fill_zero()
            started = time.perf_counter()
            stream.wait_stream(torch.cuda.current_stream(runtime.device))
            try:
                with torch.cuda.stream(stream), self._rng_scope(stage.rng):
                    with _sync_debug("error"):
                        self._run_body(firing)  # warm-up, and the probe for host syncs inside the stage
            except Exception as error:  # a sync or host copy: plan this stage eager, say where
                torch.cuda.synchronize(runtime.device)
                diagnostic = messages.capture_blocked(stage.name, _first_line(error), stage.span)
                runtime.blocked[stage.name] = diagnostic
                warnings.warn(f"{diagnostic.message}; it runs eagerly", CaptureWarning, stacklevel=3)
                continue
            torch.cuda.current_stream(runtime.device).wait_stream(stream)
            torch.cuda.synchronize(runtime.device)
            graph = torch.cuda.CUDAGraph()
            try:
                with self._rng_scope(stage.rng):
                    with torch.cuda.graph(graph, pool=runtime.pool, stream=stream):
                        module_outputs = self._run_body(firing)
            except Exception as error:
                torch.cuda.synchronize(runtime.device)
                diagnostic = messages.capture_blocked(stage.name, _first_line(error), stage.span)
                runtime.blocked[stage.name] = diagnostic
                warnings.warn(f"{diagnostic.message}; it runs eagerly", CaptureWarning, stacklevel=3)
                continue
            torch.cuda.synchronize(runtime.device)
            self.graphs[graph_plan.key] = StageGraph(graph_plan.key, graph, module_outputs,
                                                     time.perf_counter() - started)
            runtime.capture_seconds += self.graphs[graph_plan.key].capture_seconds
        runtime.graphs_captured = max(runtime.graphs_captured, len(self.graphs))
        self.reset()

    def _check_initial(self, initial: Mapping[str, torch.Tensor]) -> None:
        runtime = self.runtime
        given = {n: r for n, r in runtime.program.regions.items() if r.start == "given"}
        family_given = {r.family for r in given.values() if r.family}
        for name in initial:
            if name not in given:
                raise StepError(f"initial value for '{name}', which is not a region declared `start given`; "
                                f"those are: {_names(given) or 'none'}")
        missing = sorted(set(given) - set(initial))
        if missing:
            raise StepError(f"the session needs initial values for {', '.join(missing)} (declared `start given`)")
        for name, tensor in initial.items():
            region = given[name]
            length = None if region.fixed else region.start_length
            want = region.shape if region.fixed else region.shape_at(length)
            if (not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(want)
                    or tensor.dtype != TORCH_DTYPES[region.dtype]):
                raise StepError(f"initial value for '{name}' is {describe(tensor)}; expected {region.dtype}"
                                f"[{', '.join(map(str, want))}]")
        del family_given


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
        raise TypeError(f"stage '{stage}' must return {count} tensors (its unbound updates and writes, in "
                        f"declared order), got {type(result).__name__}")
    return tuple(result)


def _seeded_rng_state(seed: int, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        saved = torch.cuda.get_rng_state(device)
        torch.cuda.manual_seed(seed)
        state = torch.cuda.get_rng_state(device)
        torch.cuda.set_rng_state(saved, device)
        return state
    saved = torch.get_rng_state()
    torch.manual_seed(seed)
    state = torch.get_rng_state()
    torch.set_rng_state(saved)
    return state


def _get_rng(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


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
