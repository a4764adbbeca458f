"""The replica: one Ray Serve replica per GPU, owning that GPU's `SessionPool` and serving its ASGI app.

`DuplexReplica` is a Serve deployment whose ingress is the pool's Starlette app (`make_app`), built on the
replica (`__serve_build_asgi_app__`) once the pool has started: Serve marks the replica running only then, so
the pool has loaded, warmed its slots and calibrated before a session is routed to it, and a pool that cannot
start fails the replica with its own error (Serve's deployment status shows it). The rest is Serve's replica
protocol:

* `record_routing_stats`: the pool's `capacity()` (with the replica's name and when it was recorded), which the
  controller polls and the `FreeCapacityRouter` of every proxy places sessions by;
* `check_health`: the device thread answers a probe within the health-check timeout (a hung round or a CUDA
  fault fails it; Serve then replaces the replica, and its sessions close with `CLOSE_REPLICA_LOST`);
* graceful shutdown (a scale-down, a redeploy, `serve.shutdown`): Serve routes nothing new to the replica,
  waits up to `graceful_shutdown_timeout_s` for its websockets (its sessions) to end, then calls `__del__`,
  which stops the pool: any session left is closed with 1001 and the reason;
* `drain(replica_id=...)` and `capacity(replica_id=...)`: handle calls the router pins to the named replica.

Every websocket accept carries the header `x-duplexcadence-replica` naming the replica: the client names it in
the error of a lost session, and the proxy's middleware in the close reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs
from ray import serve

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.access import AccessPolicy
from duplexcadence.interpreter.serve.conversations import (
    ConversationPool,
    ConversationPoolConfig,
    engine_factory,
    engine_name,
)
from duplexcadence.interpreter.serve.pool import PoolConfig, SessionPool

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

HEALTH_PROBE_TIMEOUT_S = 20.0
"""How long the device thread may take to answer the health probe (it waits behind the round in flight)."""
DRAIN_REPORTS = 2
"""Routing-stats reports a drain waits for: after the second, the controller has taken the first, which says
`draining`, and broadcast it to the routers."""


class ReplicaNotServing(LookupError):
    """A handle call for a replica that is not running (gone, or not started yet)."""


@attrs.frozen
class PoolSpec:
    """What every replica serves: a registered tail (`target`, its options in `params`) or a `.clock` file with
    the model builder `model` (`MODULE:FUNCTION`), on the replica's device, with the pool's `config`; or, with
    `conversations`, that many conversations of the conversation engine `target` (a registered engine or
    `MODULE:FUNCTION`, its keywords in `params`) over `/v1/realtime`, `config` a `ConversationPoolConfig`.
    `cpu_threads`: torch's intra-op threads of a CPU replica (replicas sharing a host's cores); `access`: who may
    use each replica's routes (`dsl serve`'s `--api-key`, `--trusted-host`, `--allowed-origin`, `--open-route`,
    `--hide-route`)."""

    target: str
    model: str | None = None
    params: dict[str, str] = attrs.field(factory=dict)
    config: PoolConfig | ConversationPoolConfig = attrs.field(factory=PoolConfig)
    cpu_threads: int | None = None
    conversations: int | None = None
    access: AccessPolicy = attrs.field(factory=AccessPolicy)

    @property
    def path(self) -> str:
        """The websocket route of what is served."""
        return "/v1/session" if self.conversations is None else "/v1/realtime"


class ReplicaHeader:
    """ASGI middleware: every websocket accept carries `x-duplexcadence-replica: <replica>`."""

    def __init__(self, app: ASGIApp, replica: str):
        self.app = app
        self.header = (messages.REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def named_send(message: Message) -> None:
            if message["type"] == "websocket.accept":
                message = {**message, "headers": [*(message.get("headers") or ()), self.header]}
            await send(message)

        await self.app(scope, receive, named_send)


def replica_device() -> str:
    """The replica's device: the GPU Ray assigned it (`num_gpus=1` sets CUDA_VISIBLE_DEVICES), else the CPU."""
    import ray
    import torch

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


class DuplexReplica:
    """One pool on this replica's device (see the module docstring); `DEPLOYMENT` is its Serve deployment."""

    def __init__(self, spec: PoolSpec):
        import torch

        from duplexcadence.interpreter.serve.tail import served_tail

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.device = replica_device()
        if self.device == "cpu" and spec.cpu_threads:
            torch.set_num_threads(spec.cpu_threads)
        self.pool: SessionPool | ConversationPool
        if spec.conversations is not None:
            assert isinstance(spec.config, ConversationPoolConfig)
            build = engine_factory(spec.target, self.device, spec.conversations, spec.params)
            self.pool = ConversationPool(build, engine_name(spec.target), spec.config)
        else:
            assert isinstance(spec.config, PoolConfig)
            self.pool = SessionPool(served_tail(spec.target, spec.model, spec.params, self.device), spec.config)
        self.spec = spec
        self.reports = 0
        self.reported: asyncio.Condition | None = None

    async def __serve_build_asgi_app__(self) -> ASGIApp:
        await self.pool.start()
        return replica_app(self.pool, self.spec.access, self.replica_id)

    def started(self) -> bool:
        pool = self.pool
        return pool.rule is not None

    async def __del__(self) -> None:
        if self.started():
            await self.pool.stop()

    def stats(self) -> dict[str, Any]:
        if not self.started():  # the pool has not started yet
            return {"replica": self.replica_id, "device": self.device, "starting": True}
        import torch

        pool = self.pool
        snapshot = pool.capacity_json() if isinstance(pool, ConversationPool) else pool.capacity().to_json()
        where = {"replica": self.replica_id, "device": self.device, "threads": torch.get_num_threads()}
        return {**snapshot, **where, "recorded_at": time.time()}

    async def record_routing_stats(self) -> dict[str, Any]:
        stats = self.stats()
        self.reports += 1
        if self.reported is None:
            self.reported = asyncio.Condition()
        async with self.reported:
            self.reported.notify_all()
        return stats

    async def check_health(self) -> None:
        pool = self.pool
        if not self.started():
            return
        if pool.stopping:
            return  # stopped on purpose (the cluster's shutdown): nothing to replace
        try:
            await asyncio.wait_for(pool.run_on_device(device_probe, self.device), HEALTH_PROBE_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(
                f"replica {self.replica_id}: the device thread did not answer within {HEALTH_PROBE_TIMEOUT_S:g} s"
            ) from None

    def check_target(self, replica_id: str) -> None:
        if replica_id != self.replica_id:
            raise ReplicaNotServing(messages.replica_not_serving(replica_id))

    async def capacity(self, replica_id: str) -> dict[str, Any]:
        """This replica's routing stats (the pool's capacity)."""
        self.check_target(replica_id)
        return self.stats()

    async def drain(self, replica_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Admit no new session here; return once the routers have been told (`DRAIN_REPORTS` stats reports,
        or `timeout_s`). The sessions here keep running until they close."""
        self.check_target(replica_id)
        self.pool.drain()
        if self.reported is None:
            self.reported = asyncio.Condition()
        target = self.reports + DRAIN_REPORTS
        async with self.reported:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.reported.wait_for(lambda: self.reports >= target), timeout_s)
        return self.stats()

    async def stop_pool(self, replica_id: str) -> None:
        """Stop this replica's pool: a session left is closed with 1001 and the reason (the cluster's shutdown,
        after its drain)."""
        self.check_target(replica_id)
        if self.started():
            await self.pool.stop()

    async def metrics_text(self, replica_id: str) -> str:
        """This replica's Prometheus exposition (`/metrics` through the proxy reaches one replica)."""
        self.check_target(replica_id)
        assert self.pool.metrics is not None
        return self.pool.exposition().decode()


def replica_app(pool: SessionPool | ConversationPool, access: AccessPolicy, replica_id: str) -> ASGIApp:
    """The ASGI app of a replica's started `pool` under `access`, its websocket accepts naming `replica_id`."""
    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.realtime.app import make_conversation_app

    if isinstance(pool, ConversationPool):
        return ReplicaHeader(make_conversation_app(pool, manage_pool=False, access=access), replica_id)
    return ReplicaHeader(make_app(pool, manage_pool=False, access=access), replica_id)


def device_probe(device: str) -> None:
    """On the device thread: a tiny op, synchronised (a CUDA fault raises here)."""
    import torch

    value = torch.ones(1, device=device) + 1
    if device != "cpu":
        torch.cuda.synchronize()
    del value


DEPLOYMENT_NAME = "DuplexReplica"
DEPLOYMENT = serve.deployment(name=DEPLOYMENT_NAME)(serve.ingress()(DuplexReplica))
"""The Serve deployment of `DuplexReplica`, its ingress the pool's app (`Deployment.options` sets the rest)."""
