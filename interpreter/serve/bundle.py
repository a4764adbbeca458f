"""Bundles: sessions of one pool opened together and stepped as one (`SessionPool.open_bundle`).

A tick's inputs stack the members' on a new leading axis, in member order, and its outputs stack theirs. In
lockstep, a bundle whose members fill whole groups in row order queues one item a group on the group's
first member (its lead), for every member of the group (`Item.covers`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from duplexcadence.interpreter.serve import codec, messages
from duplexcadence.interpreter.serve.scheduler import RESET, TICK, ClosingState, Item, TickError


class BundleTickError(TickError):
    """A bundle's tick that did not run for some of its members: the first one's code and message; `members`:
    the indexes of those members, in the bundle; `outputs`: the tick's stacked outputs when the others stepped
    it (the failed members' rows zeros), else None."""

    def __init__(self, code: str, message: str, members: list[int], outputs: dict[str, torch.Tensor] | None = None):
        super().__init__(code, message)
        self.members = members
        self.outputs = outputs


class Bundle(ClosingState):
    """Sessions of one pool opened together and stepped as one (`SessionPool.open_bundle`): a tick's inputs
    stack the members' on a new leading axis, in member order, and its outputs stack theirs the same way. Each
    member is a `PooledSession` of its own (its slot, its lockstep row, its accounting); the bundle submits a
    tick to every member or to none, and closes them together: when one closes (the idle timeout, a fault, the
    pool stopping), the others close with its reason.

    In lockstep, a bundle whose members fill whole groups, in row order (`fused`), queues one item a group:
    the group's batched inputs, stepped whole, its outputs unbatched once, instead of a tick a member."""

    def __init__(self, pool: Any, members: list[Any], fused: list[list[Any]] | None):
        """`pool`: a started `pool.SessionPool`; `members`: its `PooledSession`s; `fused`: the members cut into
        the lockstep groups they fill whole (None: stepped member by member)."""
        self.pool = pool
        self.members = members
        self.fused = fused
        self.closing = None
        self.closed_event = asyncio.Event()
        self._pending: set[asyncio.Future] = set()
        for group in fused or ():
            group[0].fused = group
            for member in group[1:]:
                member.queued_on = group[0]
        self._watch = pool.loop.create_task(self._close_together(), name="duplexcadence-bundle")

    @property
    def id(self) -> int:
        """The bundle's id: its first member's."""
        return self.members[0].id

    def info(self) -> dict:
        """What the `ready` frame says of the bundle: its size and each member's session."""
        return {"bundle": len(self.members), "members": [member.info() for member in self.members]}

    def submit(self, inputs: Mapping[str, torch.Tensor], last: bool = False) -> asyncio.Future:
        """Queue one tick of every member (`inputs[name][i]` is member i's); a future of the stacked outputs.
        Raises TickError before queueing for inputs a member cannot take, a member's full queue or a closed
        bundle: every member is then unchanged."""
        self.check_open()
        count = len(self.members)
        for name, tensor in inputs.items():
            if tensor.dim() == 0 or tensor.shape[0] != count:
                found = list(tensor.shape)
                raise TickError(messages.WRONG_SHAPE, messages.bundle_shape(name, found, count))
        # the members' inputs share dtypes and shapes: one member's check is every member's, but its values'
        self.pool.check_inputs({name: tensor[0] for name, tensor in inputs.items()}, last)
        self.pool.check_values(inputs)
        depth = self.pool.config.queue_depth
        for member in self.members:
            member.check_open()
            queued = member.queued(TICK)
            if queued >= depth:
                raise TickError(messages.QUEUE_FULL, messages.queue_full(queued))
        loop, now = self.pool.loop, time.perf_counter()  # checked above for every member: queued as they are
        if self.fused is None:
            rows: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
            for name, tensor in inputs.items():
                for row, member_input in zip(rows, tensor.unbind(0), strict=True):
                    row[name] = member_input
            ticks = [
                member.enqueue(Item(TICK, loop.create_future(), row, last, now))
                for member, row in zip(self.members, rows, strict=True)
            ]
            return self._joined(ticks, [[index] for index in range(count)], self._stacked)
        axes = self.pool.mode.axes
        futures: list[asyncio.Future] = []
        owners: list[list[int]] = []
        first = 0
        for group in self.fused:
            size = len(group)
            batch = {
                name: tensor[first : first + size].squeeze(axes[name] + 1).movedim(0, axes[name]).contiguous()
                for name, tensor in inputs.items()
            }
            active_at = time.monotonic()
            for member in group:
                member.last_activity = active_at  # its ticks are queued on the group's lead
            futures.append(group[0].enqueue(Item(TICK, loop.create_future(), batch, last, now, covers=group)))
            owners.append(list(range(first, first + size)))
            first += size
        return self._joined(futures, owners, self._unbatched)

    def submit_frame(self, data: bytes | bytearray | memoryview) -> asyncio.Future:
        """Queue one tick sent as a tensor frame (`codec`) of the stacked inputs: decoded, then `submit`."""
        try:
            frame = codec.decode(data)
            return self.submit(frame.tensors, frame.last)
        except (codec.FrameError, TickError) as error:
            for member in self.members:
                member.errors += 1
            if self.pool.metrics is not None:
                self.pool.metrics.tick_errors.labels(error.code).inc(len(self.members))
            raise

    def reset(self) -> asyncio.Future:
        """Barge-in of every member, after the ticks queued before it (a future, done when all are)."""
        self.check_open()
        depth = self.pool.config.queue_depth
        for member in self.members:
            member.check_open()
            if member.queued(RESET) >= depth:
                raise TickError(messages.QUEUE_FULL, messages.queue_full(len(member.queue)))
        if self.fused is None:
            resets = [member.reset() for member in self.members]
            return self._joined(resets, [[index] for index in range(len(self.members))], None)
        loop, first = self.pool.loop, 0
        futures: list[asyncio.Future] = []
        owners: list[list[int]] = []
        for group in self.fused:
            active_at = time.monotonic()
            for member in group:
                member.last_activity = active_at
            futures.append(group[0].enqueue(Item(RESET, loop.create_future(), covers=group)))
            owners.append(list(range(first, first + len(group))))
            first += len(group)
        return self._joined(futures, owners, None)

    async def close(self) -> None:
        """Close every member after the ticks queued before it; their slots are free when this returns."""
        if self.closing is None:
            self.closing = (messages.CLIENT_CLOSED, "closed by the client")
            if self._pending:  # a fused group's items are queued on its lead alone: let them run first
                await asyncio.wait(list(self._pending))
            await asyncio.gather(*(member.close() for member in self.members))
        await self.closed_event.wait()

    def abort(self, code: str, message: str) -> None:
        """Close every member now (the client gone, the pool stopping): as `PooledSession.abort`."""
        if self.closing is None or self.closing[0] == messages.CLIENT_CLOSED:
            self.closing = (code, message)
        for member in self.members:
            member.abort(code, message)

    def stats_json(self) -> dict:
        return {"members": [member.stats_json() for member in self.members]}

    async def _close_together(self) -> None:
        waits = [asyncio.ensure_future(member.closed_event.wait()) for member in self.members]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            first = next(member for member, wait in zip(self.members, waits, strict=True) if wait in done)
            code, message = first.closing or (messages.CLIENT_CLOSED, "closed by the client")
            if self.closing is None:
                self.closing = (code, message)
            for member in self.members:
                if member.closing is None:
                    member.abort(code, message)
            await asyncio.gather(*waits)
        finally:
            for wait in waits:
                wait.cancel()
            self.closed_event.set()

    @staticmethod
    def _stacked(results: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {name: torch.stack([result[name] for result in results]) for name in results[0]}

    def _unbatched(self, results: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Fused groups' batched outputs as the members' stacked: the batch axis moved to the front, each
        member's batch axis of 1 in its place."""
        axes = self.pool.mode.axes
        parts = {
            name: [result[name].movedim(axes[name], 0).unsqueeze(axes[name] + 1) for result in results]
            for name in results[0]
        }
        return {name: tensors[0] if len(tensors) == 1 else torch.cat(tensors) for name, tensors in parts.items()}

    def _joined(
        self,
        futures: list[asyncio.Future],
        owners: list[list[int]],
        outputs: Callable[[list[dict[str, torch.Tensor]]], dict[str, torch.Tensor]] | None,
    ) -> asyncio.Future:
        """A future done when every one of `futures` is (`owners[i]`: the members future i is for): the
        `outputs` of their results, or None; else a BundleTickError naming the members whose item failed (the
        first one's code and message), with the `outputs` of the others (zeros in the failed members' rows)."""
        joined = self.pool.loop.create_future()
        left = [len(futures)]

        def one_done(_: asyncio.Future) -> None:
            left[0] -= 1
            if left[0] or joined.done():
                return
            failed = [
                (owner, None if f.cancelled() else f.exception())
                for owner, f in zip(owners, futures, strict=True)
                if f.cancelled() or f.exception() is not None
            ]
            if failed:
                errors = [error for _, error in failed if isinstance(error, TickError)]
                code, message = (errors[0].code, errors[0].message) if errors else (messages.INTERNAL, "cancelled")
                members = [index for owner, _ in failed for index in owner]
                stepped = [None if f.cancelled() or f.exception() is not None else f.result() for f in futures]
                partial = None
                if outputs is not None and any(result is not None for result in stepped):
                    template = next(result for result in stepped if result is not None)
                    zeros = {name: torch.zeros_like(tensor) for name, tensor in template.items()}
                    partial = outputs([zeros if result is None else result for result in stepped])
                joined.set_exception(BundleTickError(code, message, members, partial))
                joined.exception()  # retrieved: a closed bundle's answers may have no reader
            elif outputs is not None:
                joined.set_result(outputs([f.result() for f in futures]))
            else:
                joined.set_result(None)

        for future in futures:
            future.add_done_callback(one_done)
            if self.fused is not None:
                self._pending.add(future)
                future.add_done_callback(self._pending.discard)
        return joined
