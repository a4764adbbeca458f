"""Lockstep groups: independent sessions in the rows of one batched session, one replay per instant.

A `.clock` whose regions carry a batch dimension (`param B`) already describes B streams decoded
together. A :class:`LockstepGroup` serves independent conversations from those rows: each
:class:`Member` owns one row of every batched region, and one `step` of the group runs one instant of
every member with a single graph replay at batch B, instead of B replays at batch 1.

Members may join later than the group's start when the program and its plan allow it
(`LockstepGroup.join_problem` says why not): every state region has a row and starts as zeros, no
hook reads the clock's firing and no `on_reset` rebuilds model state, and the planned shapes and
region lengths from that instant on are those from instant 0. Then a fresh member differs from a
fresh session only in its data (its row of every state region is zeroed), and everything that tells
instants apart (ring offsets, positions) lives in that data. Mimi's decoder is such a plan (its ring
keeps its shapes from the first frame and keeps per-row offsets), so a member may join at any instant.
A plan whose shapes change during warm-up (a cache that grows to its window) takes members only at the
group's start.

Bits: the rows are computed by kernels chosen for batch B. Whether a row equals the same
conversation decoded alone at batch 1 depends on those kernels (cuDNN and cuBLAS may pick other
algorithms for another batch); the benchmarks measure it (`docs/benchmarks.md`), and this mode is
opt-in. Stages that draw random numbers draw them for all rows at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch

from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.program import Program
from duplexcadence.interpreter.runtime.errors import StepError
from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.interpreter.runtime.session import Session


class LockstepError(ValueError):
    """A lockstep group cannot do what was asked (a join the plan does not allow, a full group, a
    region without a batch dimension, a member that is not the group's)."""


def batch_axes(program: Program, batch_param: str) -> dict[str, int | None]:
    """Each region's batch axis: the dimension that is `batch_param` itself, found by resolving the
    same file with the param one larger (None for a region without one). A region whose dimensions
    follow the param without one of them being it (`2 * B`, `B * H`) has no row either: it counts as
    shared by the rows."""
    if batch_param not in program.params:
        raise LockstepError(
            f"{program.path} has no param '{batch_param}' (its params: "
            f"{', '.join(sorted(program.params)) or 'none'}); name the param that sets the batch"
        )
    rows = program.params[batch_param]
    # Keep what the runtime was loaded with: a param that differs from the file's own value at this batch was
    # overridden (re-applied below); one that does not follows the file, so a param derived from the batch
    # (`param N = B`) follows it into the wider program.
    as_filed = load_program(program.path, {batch_param: str(rows)})
    overrides = {
        name: str(value)
        for name, value in program.params.items()
        if "." not in name and as_filed.params.get(name) != value
    }
    overrides[batch_param] = str(rows + 1)
    wider = load_program(program.path, overrides)
    axes: dict[str, int | None] = {}
    for name, region in program.regions.items():
        changed = [axis for axis, (a, b) in enumerate(zip(region.shape, wider.regions[name].shape)) if a != b]
        is_row = (
            len(changed) == 1 and region.shape[changed[0]] == rows and wider.regions[name].shape[changed[0]] == rows + 1
        )
        axes[name] = changed[0] if is_row else None
    return axes


@attrs.define(eq=False)
class Member:
    """One conversation in one row of a lockstep group. `instant` counts its own steps."""

    group: LockstepGroup = attrs.field(repr=False)
    row: int
    joined_at: int
    active: bool = True
    left_at: int | None = None

    @property
    def instant(self) -> int:
        end = self.group.session.instant if self.left_at is None else self.left_at
        return end - self.joined_at

    def leave(self) -> None:
        """Give the row back (its row keeps being computed, on zero inputs, until a member joins it)."""
        self.group._leave(self)


class LockstepGroup:
    """Up to `rows` members in the rows of one session of `runtime`, stepped together.

    `runtime` is loaded with its batch param (`batch_param`, "B" by default) at the number of rows and
    a free session slot; the group takes that slot (`initial` and `seed` as for `Runtime.session`, for
    all rows together). Inputs and outputs are given per member with a batch of 1 on the region's
    batch axis.
    """

    def __init__(
        self, runtime: Runtime, batch_param: str = "B", seed: int = 0, initial: Mapping[str, torch.Tensor] | None = None
    ):
        program = runtime.program
        self.runtime = runtime
        self.axes = batch_axes(program, batch_param)
        self.rows: int = program.params[batch_param]
        self.batch_param = batch_param
        io = [name for name, region in program.regions.items() if region.role in ("input", "output")]
        unbatched_io = [name for name in io if self.axes[name] is None]
        if unbatched_io:
            raise LockstepError(
                f"input/output region(s) {', '.join(unbatched_io)} have no dimension that is "
                f"'{batch_param}': a lockstep group cannot hand each member its row"
            )
        persistent = [name for name in program.regions if runtime.plan.schedule.regions[name].persistent]
        self.shared_state = [name for name in persistent if self.axes[name] is None]
        self.row_state = [name for name in persistent if self.axes[name] is not None]
        self.session: Session = runtime.session(initial, seed=seed)
        self.members: list[Member | None] = [None] * self.rows
        self.closed = False
        self._signatures = [tuple(f.signature for f in firings) for firings in runtime.plan.trace.by_instant()]

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this lockstep group is closed")

    # --- members ---------------------------------------------------------------------------------

    def join(self) -> Member:
        """A new member in the first free row, at its start. At the group's first instant every row is
        at its start already; later, the row's state is zeroed, which the plan must allow (see the
        module docstring); raises LockstepError when it does not or when every row is taken."""
        with self.runtime.lock:
            self._check_open()
            if self.session.failed is not None:
                raise LockstepError(
                    f"a member cannot join a failed group ({self.session.failed!r}); reset() the group first"
                )
            free = [row for row, member in enumerate(self.members) if member is None]
            if not free:
                raise LockstepError(
                    f"all {self.rows} rows of the group are taken; load the runtime with a larger "
                    f"'{self.batch_param}' or wait for a member to leave"
                )
            row = free[0]
            instant = self.session.instant
            if instant:
                problem = self.join_problem(instant)
                if problem:
                    raise LockstepError(f"a member cannot join at instant {instant}: {problem}")
                self._zero_row(row)
            member = Member(self, row, instant)
            self.members[row] = member
            return member

    def join_problem(self, instant: int) -> str | None:
        """Why a member could not start at group instant `instant` (None: it can)."""
        if self.shared_state:
            return (
                f"region(s) {', '.join(self.shared_state)} are shared by all rows (no dimension is "
                f"'{self.batch_param}'), so one row cannot start over alone; members join at the group's start"
            )
        bad_start = [name for name in self.row_state if self.runtime.program.regions[name].start != "zeros"]
        if bad_start:
            return (
                f"region(s) {', '.join(bad_start)} do not start as zeros, so a zeroed row is not a fresh one; "
                "members join at the group's start"
            )
        # State a zeroed row cannot restart: what hooks read from the clock, what on_reset rebuilds in the model
        clocked = [name for name, call in self.runtime.callables.items() if call.is_hook and call.wants_firing]
        if clocked:
            return (
                f"stage(s) {', '.join(clocked)} take the firing (the group's instant and counts, not a new "
                "member's); members join at the group's start"
            )
        if self.runtime.on_reset is not None:
            return (
                "the runtime has an on_reset callback (model state outside the regions, reset for all rows "
                "at once); members join at the group's start"
            )
        if not self._repeats_instant_0(instant):
            following = next(
                (n for n in range(instant + 1, instant + 1 + len(self._signatures)) if self._repeats_instant_0(n)), None
            )
            when = (
                f"the next instant that does is {following}"
                if following is not None
                else "no later instant of the plan does"
            )
            return (
                f"the plan's shapes and lengths from instant {instant} on are not those from instant 0 ({when}); "
                "members join at the group's start, or at an instant that repeats instant 0"
            )
        return None

    def _repeats_instant_0(self, instant: int) -> bool:
        """Whether the plan runs the same shapes, with the same region lengths, from `instant` as from 0."""
        trace = self.runtime.plan.trace
        index = trace.planned_index(instant)
        if index is None or trace.states[index][0] != trace.states[0][0]:
            return False
        ahead = (trace.planned_index(instant + k) for k in range(len(self._signatures)))
        return all(i is not None and self._signatures[i] == signature for i, signature in zip(ahead, self._signatures))

    def _zero_row(self, row: int) -> None:
        for name in self.row_state:
            axis = self.axes[name]
            assert axis is not None, "row state: the persistent regions with a batch axis"
            self.session.region(name).select(axis, row).zero_()

    def _leave(self, member: Member) -> None:
        with self.runtime.lock:
            self._check_open()
            if member.group is not self or not member.active or self.members[member.row] is not member:
                raise LockstepError(f"{member!r} is not an active member of this group")
            member.active = False
            member.left_at = self.session.instant
            self.members[member.row] = None

    # --- stepping --------------------------------------------------------------------------------

    def step(self, inputs: Mapping[Member, Mapping[str, torch.Tensor] | torch.Tensor]) -> dict[Member, Any]:
        """One instant of every member (every active member must be given its inputs): one step of the
        group's session at batch `rows`; returns {member: outputs} (a tensor, or a dict by output
        name), each a view of the member's row. Rows without a member are fed zeros."""
        with self.runtime.lock:
            self._check_open()
            active = [m for m in self.members if m is not None]
            if not active:
                raise StepError("lockstep step: the group has no member; join() one first")
            foreign = [m for m in inputs if not isinstance(m, Member) or m not in active]
            missing = [m for m in active if m not in inputs]
            if foreign or missing:
                parts = []
                if missing:
                    parts.append(f"missing the inputs of row(s) {', '.join(str(m.row) for m in missing)}")
                if foreign:
                    parts.append(f"{len(foreign)} input(s) for something that is not an active member")
                raise StepError(f"lockstep step: {'; '.join(parts)}; every active member steps at every instant")
            named = {member: self._named(member, value) for member, value in inputs.items()}
            names = {tuple(sorted(value)) for value in named.values()}
            if len(names) > 1:
                raise StepError(f"lockstep step: members name different inputs ({sorted(names)}); give each the same")
            batched = {
                name: self._batch(name, {m: value[name] for m, value in named.items()})
                for name in (names.pop() if names else ())
            }
            written = self._outputs_written()
            result = self.session.step(**batched)
            if not isinstance(result, dict):
                result = {written[0]: result}
            split = {m: {name: t.narrow(self.axes[name], m.row, 1) for name, t in result.items()} for m in inputs}
            return {m: next(iter(rows.values())) if len(rows) == 1 else rows for m, rows in split.items()}

    def _outputs_written(self) -> list[str]:
        """The output regions this instant writes, in order (from its planned firings)."""
        program = self.runtime.program
        index = self.runtime.plan.trace.planned_index(self.session.instant)
        if index is None or index >= len(self.runtime.templates):
            return [name for name, region in program.regions.items() if region.role == "output"]
        return [
            v.region
            for f in self.runtime.templates[index].firings
            for v in f.views
            if v.kind == "write" and program.regions[v.region].role == "output"
        ]

    def _named(self, member: Member, value) -> dict[str, torch.Tensor]:
        if isinstance(value, torch.Tensor):
            templates = self.runtime.templates
            index = self.runtime.plan.trace.planned_index(self.session.instant)
            expected = list(templates[index].inputs) if index is not None and index < len(templates) else []
            if len(expected) != 1:
                raise StepError(
                    f"lockstep step: pass row {member.row}'s inputs by name: this instant takes "
                    f"{', '.join(expected) or 'no input'}"
                )
            return {expected[0]: value}
        if not isinstance(value, Mapping):
            raise StepError(
                f"lockstep step: row {member.row}'s inputs are a {type(value).__name__}; give a tensor or a "
                "dict of tensors by input name"
            )
        return dict(value)

    def _batch(self, name: str, rows: dict[Member, torch.Tensor]) -> torch.Tensor:
        axis = self.axes.get(name)
        if axis is None:
            raise StepError(f"lockstep step: '{name}' is not an input region with a batch axis")
        first = next(iter(rows.values()))
        declared = self.runtime.storage_dtypes.get(name)
        for member, tensor in rows.items():
            if isinstance(tensor, torch.Tensor) and (tensor.dtype != declared or tensor.device != self.runtime.device):
                region = self.runtime.program.regions[name]
                raise StepError(
                    f"lockstep step: row {member.row}'s '{name}' is {_described(tensor)}; the region is "
                    f"{region.dtype} on {self.runtime.device}"
                )
            if not isinstance(tensor, torch.Tensor) or tensor.dim() <= axis or tensor.shape[axis] != 1:
                shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise StepError(
                    f"lockstep step: row {member.row}'s '{name}' is {shape}; a member's input has a batch "
                    f"of 1 on axis {axis}"
                )
            if (tensor.shape, tensor.dtype, tensor.device) != (first.shape, first.dtype, first.device):
                raise StepError(
                    f"lockstep step: row {member.row}'s '{name}' is {_described(tensor)} where another "
                    f"row's is {_described(first)}; members step in lockstep, with equal shapes"
                )
        parts = [rows[m] if m is not None and m in rows else torch.zeros_like(first) for m in self.members]
        return torch.cat(parts, dim=axis)

    # --- whole group -----------------------------------------------------------------------------

    @property
    def instant(self) -> int:
        return self.session.instant

    def reset(self) -> None:
        """Every row back to its start (the members keep their rows and start over at instant 0)."""
        with self.runtime.lock:
            self._check_open()
            self.session.reset()
            for member in self.members:
                if member is not None:
                    member.joined_at = 0

    def close(self) -> None:
        """Give the session slot back; the group and its members can no longer step."""
        with self.runtime.lock:
            self.closed = True
            for member in self.members:
                if member is not None:
                    member.active = False
                    member.left_at = self.session.instant
            self.members = [None] * self.rows
            self.session.close()


def _described(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device}"
