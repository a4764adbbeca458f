"""Sessions and the step path: one conversation's state in its arena slot, and how one instant runs.

A step (`Session.step`, `Session.finish`) runs one instant of the plan in two halves: `begin` decides
everything before anything changes (the inputs checked, else `StepError`; the runs chosen) and
`execute` runs the runs, yielding between two of them (`Runtime.step_many` interleaves sessions there),
then commits the instant and returns the outputs. An on-plan instant made only of graph runs takes a
short path instead: its graph runs replayed on addresses resolved when the slot captured (replay.py).

A step is atomic: it commits its instant (regions, clock position, counters, `last_outputs`) or leaves
the session failed. The session is marked failed before a run changes anything and the mark is cleared
by the commit's last store (`_commit`), so an exception that arrives anywhere in between, a
KeyboardInterrupt or what a signal handler raises included, leaves it failed (`reset()` restores it);
one that arrives after finds the step committed, its outputs in `last_outputs`; one that arrives
before finds the session as it was.

Public: `Session`, `PendingStep`, `call_in_session`, `replay_in_session`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

import attrs
import torch

from duplexcadence.interpreter.plans.off_plan import back_on_plan
from duplexcadence.interpreter.plans.trace import Firing, Simulator, counter_values
from duplexcadence.interpreter.runtime.body import Body
from duplexcadence.interpreter.runtime.capture.strategy import Run
from duplexcadence.interpreter.runtime.errors import SessionFailed, StepError
from duplexcadence.interpreter.runtime.inputs import check_initial, plan_instant, refuse_non_finite, template_index
from duplexcadence.interpreter.runtime.replay import GraphReplay, StageGraph, matching_runs
from duplexcadence.interpreter.runtime.reports import Counters
from duplexcadence.interpreter.runtime.rng import call_with_rng, replay_with_lane_rng, seeded_rng_state
from duplexcadence.interpreter.runtime.storage import RegionStorage

Result = TypeVar("Result")


@attrs.frozen
class PendingStep:
    """A step whose inputs were checked and whose runs were chosen, before anything changed: the
    runs (graph replays and eager firings), the inputs by name, the simulator after an off-plan
    instant (None on the plan), the bound lengths at the start of the instant, and whether it is an
    instant off the plan that no declared step leads to (`undeclared`: it runs eagerly)."""

    runs: tuple[Run, ...] = attrs.field(repr=False)
    inputs: dict[str, torch.Tensor] = attrs.field(repr=False)
    simulator: Simulator | None = attrs.field(repr=False)
    off_plan: bool
    last: bool
    bound_lengths: dict[str, int] = attrs.field(repr=False)
    undeclared: bool = False


class Session:
    """One conversation's state: its regions in its arena slot, its clock position and RNG state. `runtime`
    is the `Runtime` (runtime.py) that made it.

    `last_outputs`: what the last committed step returned (a tensor, or a dict by output name; None
    after `reset()`): when a step raised an interrupt after committing its instant, its outputs are here.

    What the step path keeps (read it, do not assign it): `storage` (each region's storage), `body` (its
    stage bodies), `graphs`, `runs` and `replays` (its slot's captured graphs, each planned instant's runs,
    and their resolved replays), `counters`, `failed` (the exception that failed it, else None),
    `finished`, `rng_state`, and the clock position: `simulator` (stale after on-plan steps, which skip
    it), `on_plan` (whether its state is the planned state of its instant: false after a step off the plan
    until one brings it back, plans/off_plan.back_on_plan)."""

    last_outputs: Any = None
    failed: BaseException | None = None

    def __init__(
        self,
        runtime: Any,
        slot: int,
        initial: Mapping[str, torch.Tensor] | None,
        seed: int,
        check_finite: bool | None = None,
    ):
        self.runtime = runtime
        self.slot = slot
        self._lane = runtime.lane_of(slot)
        self.seed = seed
        self.check_finite = runtime.check_finite if check_finite is None else bool(check_finite)
        """Refuse inputs with NaN or infinite values (StepError), at the cost of one host read per input;
        by default they propagate, as in the stock model."""
        self.objects: dict[str, Any] = {}
        """The session's caller-owned objects by name (`object` in the .clock), made again at each reset."""
        program = runtime.program
        self.storage: dict[str, RegionStorage] = {}
        for name, region in program.regions.items():
            persistent = runtime.plan.schedule.regions[name].persistent
            flat = runtime.arena.block(name, slot if persistent else None, self.lane)
            double = None
            if runtime.plan.schedule.regions[name].double_buffer_bytes:
                double = runtime.arena.block(f"{name}~double", None, self.lane)
            self.storage[name] = RegionStorage(region, flat, double)
        self.body = Body(
            program,
            runtime.model,
            runtime.callables,
            runtime.attributes,
            self.storage,
            self.objects,
            runtime.host_counters,
        )
        self.graphs: dict[tuple, StageGraph] = {}
        self.runs: dict[int, tuple[Run, ...]] = {}
        self.replays: dict[int, tuple[GraphReplay, ...] | None] = {}  # by template index, resolved after capture
        self.counters = Counters()
        self.failed: BaseException | None = None
        self.last_outputs: Any = None
        self._unfinished = SessionFailed("a step was interrupted before it committed its instant")
        self.closed = False
        self.initial = runtime.without_pruned(initial or {})
        check_initial(program, self.initial, runtime.device)
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
        """Back to the declared start (barge-in, new turn); every address stays where it was. A reset that
        raises part-way (in `on_reset`, or interrupted) leaves the session failed: reset it again."""
        runtime = self.runtime
        with runtime.lock:
            if self.closed:  # its slot may be another session's now: resetting would overwrite that one
                raise RuntimeError("this session is closed")
            if initial is not None:
                initial = runtime.without_pruned(initial)
                check_initial(runtime.program, initial, runtime.device)
                self.initial = initial
            self.failed = SessionFailed("reset() did not complete")
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
            self.finished = False
            self.last_outputs = None
            self.rng_state = seeded_rng_state(self.seed, runtime.device)
            for name, source in runtime.object_sources.items():  # in place: the body holds this dict
                self.objects[name] = source.make(runtime.model)
            self.body.bind_current(self.simulator.length)
            if runtime.on_reset is not None:
                runtime.on_reset(runtime.model)
            self.failed = None

    def step(self, *args: torch.Tensor, **inputs: torch.Tensor):
        """Run one instant. Inputs by input-region name (or one positional tensor when the instant has
        one input). Returns the output regions written at this instant: a tensor, or a dict when
        there are several. On bad inputs raises StepError and leaves the session untouched.

        An input with fewer units than the plan expects (a flush of a short input) makes the
        instant cover that fraction of its planned time: every advance of the instant scales with
        it (StepError if one comes out fractional). Such an instant is off the plan: it replays the
        graphs captured for it when the runtime's declared steps lead to it (`Runtime.load(off_plan=...)`),
        else its firings run eagerly (`counters.undeclared_steps`)."""
        return self._step(args, inputs, last=False)

    def finish(self, *args: torch.Tensor, **inputs: torch.Tensor):
        """Run the last instant of the stream: like `step`, and the lookahead the reads held back is
        consumed too and every write's latency is released, except a `latency L dropped` (stages see
        `firing.last`). The session then refuses steps until `reset()`."""
        return self._step(args, inputs, last=True)

    def region(self, name: str) -> torch.Tensor:
        """The current exact view of a region (for inspection; do not keep it across steps: a scratch
        region's view is shared by the runtime's sessions). KeyError for a region the plan pruned."""
        with self.runtime.lock:
            if self.closed:  # its slot may be another session's now
                raise RuntimeError("this session is closed")
            reason = self.runtime.plan.pruning.reason_for(name)
            if reason is not None and name not in self.storage:
                raise KeyError(f"region '{name}' was pruned: {reason}; load the runtime with prune=False to keep it")
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

    # --- the step path ---------------------------------------------------------------------------

    def begin(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool = False) -> PendingStep:
        """The first half of a step: everything it decides before it changes anything (the session may
        step, the inputs are checked, the runs chosen). Raises RuntimeError (closed), SessionFailed
        (failed) or StepError (finished, bad inputs); a positional input is named in `inputs`."""
        self._check_steppable()
        inputs = self.runtime.without_pruned(inputs)
        return self._begin(args, inputs, last, self._planned_index(args, inputs, last))

    def execute(self, step: PendingStep) -> Generator[None, None, Any]:
        """The second half: run a begun step, yielding between its runs (`Runtime.step_many` interleaves
        sessions there), commit it and return its outputs. A stage that raises fails the session
        (SessionFailed)."""
        self.failed = self._unfinished  # until the commit: see the module docstring
        self.body.bound_lengths = step.bound_lengths
        outputs: dict[str, torch.Tensor] = {}
        firing = None
        try:
            for position, run in enumerate(step.runs):
                if position:
                    yield
                firing = run.firings[0]
                self._execute_run(run, step.inputs, outputs, step.off_plan)
        except Exception as error:
            self.failed = error
            assert firing is not None, "it came from a run, or between two: one has started"
            raise self._stage_failed(firing, error) from error
        except BaseException as error:  # KeyboardInterrupt inside a run, or closed by abandon (which recorded it)
            if self.failed is self._unfinished:
                self.failed = error
            raise
        if step.undeclared:
            self.counters.undeclared_steps += 1
        return self._commit(outputs, step.last, step.simulator, step.off_plan)

    def abandon(self, runs: Generator, error: BaseException) -> None:
        """A step stopped between two of its runs (`runs`, from `execute`) by an exception that is not a
        stage's (KeyboardInterrupt, a signal handler's): part of the instant ran, so the session fails as if
        a stage had raised. A step that had not started its first run leaves the session as it was."""
        if inspect.getgeneratorstate(runs) == inspect.GEN_SUSPENDED:
            self.failed = error
            runs.close()

    def _step(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool):
        with self.runtime.lock:
            self._check_steppable()
            if self.runtime.pruned_inputs:
                inputs = self.runtime.without_pruned(inputs)
            index = self._planned_index(args, inputs, last)
            if index is not None and self.check_finite:
                refuse_non_finite(inputs)
            replays = None if index is None else self.replays.get(index)
            if replays is not None:
                return self._replay(replays, inputs)
            runs = self.execute(self._begin(args, inputs, last, index))
            try:
                while True:
                    next(runs)
            except StopIteration as done:
                return done.value
            except BaseException as error:
                self.abandon(runs, error)
                raise

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
        """The planned instant this step repeats (`template_index`), None when it takes the general path."""
        if not self.on_plan or last:
            return None
        runtime = self.runtime
        return template_index(runtime.plan, runtime.templates, runtime.device, self._instant, args, inputs)

    def _begin(self, args: tuple, inputs: dict[str, torch.Tensor], last: bool, index: int | None) -> PendingStep:
        runtime = self.runtime
        if index is not None:
            if self.check_finite:
                refuse_non_finite(inputs)
            runs = self.runs.get(index) or matching_runs(self.graphs, runtime.templates[index].firings)
            return PendingStep(runs, inputs, None, False, last, dict(runtime.plan.trace.states[index][0]))
        self._sync_simulator()
        lengths = dict(self.simulator.length)
        firings, simulator, off_plan = plan_instant(
            runtime.plan, runtime.device, self.simulator, self._instant, args, inputs, last
        )
        if self.check_finite:
            refuse_non_finite(inputs)
        undeclared = off_plan and tuple(f.signature for f in firings) not in runtime.declared_instants
        return PendingStep(matching_runs(self.graphs, firings), inputs, simulator, off_plan, last, lengths, undeclared)

    def _replay(self, replays: tuple[GraphReplay, ...], inputs: Mapping[str, torch.Tensor]):
        """An on-plan step made only of graph runs, on addresses resolved before (replay.py): per run,
        copy the inputs in, replay, clone the outputs out; what `execute` does for such a step, on the
        same views, with the same counters, failure handling and commit."""
        self.failed = self._unfinished  # until the commit: see the module docstring
        outputs: dict[str, torch.Tensor] = {}
        counters = self.counters
        run = None
        try:
            for run in replays:
                for name, target in run.feeds:
                    tensor = inputs[name]
                    target.copy_(tensor.detach() if tensor.requires_grad else tensor)
                replay_in_session(self, run.rng, run.graph.graph.replay)
                counters.replays += len(run.firings)
                counters.per_graph[run.graph.key] += 1
                for name, source in run.outputs:
                    outputs[name] = source.clone()
            return self._commit(outputs, last=False, short_path=True)
        except Exception as error:
            self.failed = error
            assert run is not None, "a short-path step has at least one graph run"
            raise self._stage_failed(run.firings[0], error) from error
        except BaseException as error:  # KeyboardInterrupt: part of the instant ran, or it committed
            if self.failed is self._unfinished:
                self.failed = error
            raise

    def _execute_run(
        self, run: Run, inputs: Mapping[str, torch.Tensor], outputs: dict[str, torch.Tensor], off_plan: bool
    ) -> None:
        """Feed, then replay one graph run (or run one firing eagerly), then collect outputs."""
        runtime = self.runtime
        for firing in run.firings:
            for view in firing.views:
                if view.kind == "feed":
                    self.storage[view.region].append(view.offset, 0, inputs[view.region].detach())
        uses_rng = any(runtime.program.stages[f.stage].rng for f in run.firings)
        if run.kind == "graph":
            assert run.key is not None, "a graph run is keyed by its firings' signatures"
            graph = self.graphs[run.key]
            replay_in_session(self, uses_rng, graph.graph.replay)
            module_outputs = graph.module_outputs
            self.counters.replays += len(run.firings)
            self.counters.per_graph[graph.key] += 1
            if off_plan:
                self.counters.replays_off_plan += len(run.firings)
        else:
            firing = run.firings[0]
            if firing.instant != self._instant:  # a template: hooks see the real instant and count
                counts = runtime.counts_before(self._instant)
                firing = attrs.evolve(
                    firing,
                    instant=self._instant,
                    count=counts[firing.stage],
                    time=runtime.plan.clocks.instant_time(self._instant),
                    counters=counter_values(runtime.program, counts),
                )
            with runtime.eager_lock:  # the binding sets the model's attributes: one eager firing at a time
                module_outputs = call_in_session(self, uses_rng, self.body.run, firing)
            if not off_plan and firing.signature in runtime.first_firing:
                self.counters.eager_planned += 1
            else:
                self.counters.eager_off_plan += 1
        for firing in run.firings:
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

    def _commit(
        self,
        outputs: dict[str, torch.Tensor],
        last: bool,
        simulator: Simulator | None = None,
        off_plan: bool = False,
        short_path: bool = False,
    ):
        """Commit a step whose runs all ran and return its outputs: a tensor, or a dict when there are
        several. `failed` is cleared by the last store, after the outputs, the clock position and the
        counters: the step counts from that store on (an exception before it leaves the session failed)."""
        result = next(iter(outputs.values())) if len(outputs) == 1 else outputs
        self.last_outputs = result
        if simulator is not None:  # off the plan: the simulator traced this instant
            self.simulator = simulator
            self.simulator_stale = False
            runtime = self.runtime
            self.on_plan = not last and (
                (self.on_plan and not off_plan)
                or back_on_plan(runtime.program, runtime.plan.clocks, runtime.plan.trace, simulator, self._instant + 1)
            )
        else:
            self.simulator_stale = True
        self.counters.steps += 1
        if short_path:
            self.counters.short_path_steps += 1
        self.finished = last
        self._instant += 1
        self.failed = None
        return result

    def _stage_failed(self, firing: Firing, error: Exception) -> SessionFailed:
        return SessionFailed(
            f"stage '{firing.stage}' ({self.body.call_text(firing)}) raised at instant "
            f"{self._instant}: {error!r}; the session refuses further steps until reset()"
        )

    def _sync_simulator(self) -> None:
        """Bring the simulator to the current instant after on-plan steps (which skip it)."""
        if not self.simulator_stale:
            return
        runtime = self.runtime
        index = runtime.plan.trace.planned_index(self._instant)
        lengths, fills = runtime.plan.trace.states[index]
        pending = runtime.plan.trace.pending_at(index)
        self.simulator.restore(lengths, fills, runtime.counts_before(self._instant), pending)
        self.simulator_stale = False


def call_in_session(session: Session, uses_rng: bool, fn: Callable[..., Result], *args: Any) -> Result:
    """`fn(*args)`, drawing from `session`'s generator state when `uses_rng` (rng.call_with_rng, on its
    lane's generator state); the state it leaves becomes the session's."""
    if not uses_rng:
        return fn(*args)
    runtime = session.runtime
    lane_state = runtime.lane_rng_states[session.lane]
    result, session.rng_state = call_with_rng(runtime.device, session.rng_state, lane_state, fn, *args)
    return result


def replay_in_session(session: Session, uses_rng: bool, replay: Callable[[], Result]) -> Result:
    """A graph `replay()` of `session`'s slot: as `call_in_session`, except that on a lane with a generator
    state of its own the session's state is set there alone (rng.replay_with_lane_rng), without the lock
    the default generator needs."""
    if not uses_rng:
        return replay()
    runtime = session.runtime
    lane_state = runtime.lane_rng_states[session.lane]
    if lane_state is None:
        return call_in_session(session, uses_rng, replay)
    result, session.rng_state = replay_with_lane_rng(session.rng_state, lane_state, replay)
    return result
