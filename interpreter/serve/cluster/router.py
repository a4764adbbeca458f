"""The request router of the replica deployment: a new session goes where the most free predicted capacity is.

Ray Serve asks a deployment's `RequestRouter` (`ray.serve.request_router`) for a replica each time a request
reaches a proxy or a `DeploymentHandle`. A websocket is one request for its whole life: the proxy pins it to
the replica that accepted it, so every later frame of a session stays there without help from this router.
What this router decides is the first placement, from each replica's routing stats: the dict its
`record_routing_stats` returns, the pool's `Capacity` (`free`, `draining`, `sessions`, `capacity`) stamped
with `recorded_at`, which the Serve controller polls every `request_routing_stats_period_s` and broadcasts
to every router.

Stats are up to a period old, and several sessions may be routed between two snapshots (a burst of
connections is routed concurrently). So the router counts its own placements: when it ranks a session it
reserves the first choice (`choose_replicas`), moves the reservation where the session was accepted
(`on_request_routed`) and drops it when the session ends (`on_request_completed`). A replica's `free` is taken
less the placements not yet in its stats: those made later than `SETTLE_S` before the stats were recorded.

Ranks, best first (`rank`): replicas that admit (free > 0) by free capacity, most first; replicas whose stats
have not arrived yet; full replicas; draining replicas last. Every replica stays in the ranking: when none
has room, the session still reaches a pool, whose refusal names the numbers (a session never waits in a
proxy queue for a capacity that may not come).

A handle call that names a replica (`replica_id=` keyword: the cluster's `drain`, `capacity` and
`metrics_text`) goes to that replica; a name that is not running goes to any replica, which says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

SETTLE_S = 1.0
"""How long after its placement a session may take to appear in its replica's stats (the proxy's hop and the
pool's admission); a placement is counted by the router until a snapshot recorded this much later."""

FORGET_S = 60.0
"""Placements older than this are forgotten (a session's stats have long counted it; a request that was never
accepted leaves its reservation behind)."""

TARGET_KEYWORD = "replica_id"
"""The keyword of a handle call that names the replica it is for."""


@attrs.frozen
class Standing:
    """What the router knows of one replica: its stats (None: not arrived yet) and its placements not yet in them."""

    replica: str
    free: int | None
    sessions: int
    draining: bool
    placed: int

    def key(self) -> tuple[int, int, int, str]:
        if self.draining:
            group = 3
        elif self.free is None:
            group = 1
        elif self.free - self.placed > 0:
            group = 0
        else:
            group = 2
        free = (self.free or 0) - self.placed
        return (group, -free, self.sessions + self.placed, self.replica)


def standing(replica: str, stats: Mapping[str, Any], placements: Iterable[float]) -> Standing:
    """A replica's standing from its routing stats and the wall-clock times of this router's placements there."""
    if "free" not in stats:
        return Standing(replica, None, 0, False, len(list(placements)))
    recorded_at = float(stats.get("recorded_at", 0.0))
    unseen = sum(1 for placed_at in placements if placed_at + SETTLE_S > recorded_at)
    return Standing(replica, int(stats["free"]), int(stats.get("sessions", 0)), bool(stats.get("draining")), unseen)


def rank(standings: Iterable[Standing]) -> list[Standing]:
    """Best placement first: admitting replicas by free capacity (then fewest sessions), replicas without stats,
    full replicas, draining replicas."""
    return sorted(standings, key=Standing.key)


def target_of(pending_request: PendingRequest | None) -> str | None:
    """The replica a handle call names (`replica_id=`), or None."""
    if pending_request is None:
        return None
    target = pending_request.kwargs.get(TARGET_KEYWORD)
    return target if isinstance(target, str) else None


@attrs.frozen
class Placement:
    replica: str
    at: float


class FreeCapacityRouter(RequestRouter):
    """Places a new session on the replica with the most free predicted capacity (see the module docstring)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self.placements: dict[str, Placement] = {}  # by the request's internal id

    def standings(self, candidates: Iterable[RunningReplica], now: float) -> list[Standing]:
        for request, placement in list(self.placements.items()):
            if now - placement.at > FORGET_S:
                del self.placements[request]
        by_replica: dict[str, list[float]] = {}
        for placement in self.placements.values():
            by_replica.setdefault(placement.replica, []).append(placement.at)
        return [
            standing(
                replica.replica_id.unique_id, replica.routing_stats, by_replica.get(replica.replica_id.unique_id, ())
            )
            for replica in candidates
        ]

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        target = target_of(pending_request)
        if target is not None and target in by_id:
            return [[by_id[target]]]
        now = time.time()
        ranked = rank(self.standings(candidate_replicas, now))
        if pending_request is not None and target is None and ranked:
            self.placements[pending_request.metadata.internal_request_id] = Placement(ranked[0].replica, now)
        return [[by_id[entry.replica]] for entry in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        if target_of(pending_request) is not None:
            return
        request = pending_request.metadata.internal_request_id
        reserved = self.placements.get(request)
        self.placements[request] = Placement(replica_id.unique_id, reserved.at if reserved else time.time())

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.placements.pop(internal_request_id, None)
