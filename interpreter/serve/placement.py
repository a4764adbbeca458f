"""Where a new session goes among the workers of one port (`dsl serve --workers N`).

The kernel hashes each new connection to one of the workers whatever their load, so on its own it spreads N
sessions unevenly (in lockstep, into more groups than the sessions need: each worker opens a group for its
first session). Each worker therefore publishes its load on a board the workers share (`PlacementBoard`,
shared memory written only by its owner), and before admitting a session checks the others': it admits only
when no worker would take the session at a lower cost (`better_worker`). The cost of a session on a worker
is whether it starts a new unit there (a lockstep group, or in lanes a session: every session is a unit)
and how many units that worker then steps. A worker that leaves a session to another refuses it with
`other-worker` (close 1013), and the client connects again; each new connection is hashed anew.

The workers share the device too, so each counts the units the others step in its predicted tick
(`BoardSeat.shared_units`, admission.py).

The rule needs no lock: two workers that admit at the same moment from the same board each take one session,
which at worst leaves the spread one session from the best, as without the board.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

FIELDS = 3
"""Numbers a worker publishes: whether it admits, its units, its free rows in running groups."""


@attrs.frozen
class WorkerLoad:
    """One worker's load as the board holds it. `admits`: it has room and is not draining or stopping;
    `units`: the units it steps (lockstep groups with members, or sessions); `open_rows`: free rows in
    groups that already have members (always 0 in lanes)."""

    admits: bool
    units: int
    open_rows: int = 0

    def cost(self) -> tuple[int, int]:
        """(1 if a new session starts a unit here, the units stepped then): lower is better."""
        starts = 0 if self.open_rows > 0 else 1
        return starts, self.units + starts


def better_worker(here: int, loads: Sequence[WorkerLoad]) -> int | None:
    """The worker that takes a new session at a lower cost than worker `here` (the lowest such, by cost then
    index), or None when `here` costs no more than any other worker that admits."""
    mine = loads[here].cost()
    best = min(
        ((load.cost(), index) for index, load in enumerate(loads) if load.admits and index != here),
        default=None,
    )
    if best is None or best[0] >= mine:
        return None
    return best[1]


class PlacementBoard:
    """The workers' loads in shared memory: made by the parent, given to every worker process, each writing
    only its own entry (`seat`). A worker that has not published yet is read as admitting nothing."""

    def __init__(self, workers: int, context: Any):
        self.workers = workers
        self.numbers = context.RawArray("q", workers * FIELDS)

    def seat(self, index: int) -> BoardSeat:
        return BoardSeat(self, index)

    def loads(self) -> list[WorkerLoad]:
        numbers = list(self.numbers)
        return [
            WorkerLoad(bool(numbers[at]), numbers[at + 1], numbers[at + 2])
            for at in range(0, self.workers * FIELDS, FIELDS)
        ]


@attrs.frozen
class BoardSeat:
    """One worker's place on the board: what a `SessionPool` is given as its `placement`."""

    board: PlacementBoard
    index: int

    @property
    def workers(self) -> int:
        return self.board.workers

    def publish(self, load: WorkerLoad) -> None:
        at = self.index * FIELDS
        self.board.numbers[at : at + FIELDS] = [int(load.admits), load.units, load.open_rows]

    def shared_units(self) -> int:
        """The units the other workers step on the device (their published loads)."""
        return sum(load.units for index, load in enumerate(self.board.loads()) if index != self.index)

    def better_worker(self, load: WorkerLoad) -> int | None:
        """The worker that should take a new session instead of this one (None: this one), with this
        worker's own `load` as it is now."""
        loads = self.board.loads()
        loads[self.index] = load
        return better_worker(self.index, loads)
