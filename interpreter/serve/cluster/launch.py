"""Start the replicas of one tail on a Ray cluster and hold them: `start(spec, config)` -> `DuplexCluster`.

    cluster = start(PoolSpec("moshi", config=PoolConfig(slots=20, lanes=4)), ClusterConfig(replicas=4))
    print(cluster.ws_url)            # ws://127.0.0.1:8000/v1/session, through the Serve proxy
    cluster.capacities()             # {replica: its pool's capacity}
    cluster.drain(replica)           # no new session there; its sessions finish
    cluster.shutdown()

Without `address` the code starts a local Ray (`ray.init(address="local")`) and sets the proxy's middleware
(`proxy.PROXY_CALLBACK`) in the environment its processes inherit; with one it connects to that cluster
(`ray.init(address=...)`), whose nodes set the middleware themselves (docs/serving.md, "Across GPUs and
nodes"). Serve is started with the HTTP proxy on `host:port`, and the replicas are one Serve application:
`replicas` copies of `DuplexReplica`, each with `gpus_per_replica` GPUs (1: one GPU each) or, on CPU,
`cpus_per_replica` CPUs, routed by the `FreeCapacityRouter`.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import attrs

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.cluster import proxy
from duplexcadence.interpreter.serve.cluster.replica import DEPLOYMENT, DEPLOYMENT_NAME, PoolSpec
from duplexcadence.interpreter.serve.pool import PoolConfig

REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"
SERVE_NAMESPACE = "serve"
ROUTER_CLASS = "duplexcadence.interpreter.serve.cluster.router:FreeCapacityRouter"
PROXY_BIND_FAILURE = "Failed to bind to address"  # the text of the Serve proxy's error when it cannot bind
PROXY_START_ATTEMPTS = 3  # with port 0: how many free ports are tried, should another process take one first
# A starting Ray binds ports at random from the kernel's ephemeral range and up (as does any bind to port 0), and
# `ray start` gives its workers 10002-19999: a port from between the two is one that no starting Ray takes.
FREE_PORT_LOW = 20000
EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@attrs.frozen
class ClusterConfig:
    """Where and how the replicas run.

    `replicas`: how many (None: one per GPU of the cluster, or one without GPUs); `address`: an existing Ray
    cluster (`auto`, `HOST:PORT`, `ray://...`; None: a local one with `local_cpus` CPUs (None: every core) and the GPUs it finds);
    `gpus_per_replica`: None takes 1 when the cluster has GPUs, else 0 (a CPU replica with `cpus_per_replica`);
    `runtime_env`: the replicas' Ray runtime environment (a `working_dir` for a model builder of your own);
    `host`/`port`: the Serve HTTP proxy (port 0: a free one, which `DuplexCluster.config.port` then holds);
    `stats_period_s`: how often each replica's capacity is polled for the router; `drain_timeout_s`: how long a
    replica Serve stops (scale-down, redeploy, shutdown) waits for its sessions; `health_check_period_s`: how
    often its device thread is probed; `start_attempts`: how often Serve starts a replica whose pool fails to
    start before the deployment fails; `max_ongoing_requests`: requests a replica takes at once (its sessions
    and HTTP calls; None: the pool's slots (rows) + 16, so the pool's admission, not Serve's queue, refuses).
    """

    replicas: int | None = None
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    gpus_per_replica: float | None = None
    cpus_per_replica: float = 1.0
    runtime_env: dict[str, Any] | None = None
    local_cpus: int | None = None
    stats_period_s: float = 0.25
    drain_timeout_s: float = 600.0
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    max_ongoing_requests: int | None = None
    start_attempts: int = 2
    app_name: str = "duplexcadence"

    def problems(self) -> list[str]:
        found = []
        if self.replicas is not None and self.replicas < 1:
            found.append(f"replicas must be at least 1, not {self.replicas}")
        if (self.gpus_per_replica or 0) < 0 or self.cpus_per_replica < 0:
            found.append("gpus and cpus per replica cannot be negative")
        if self.gpus_per_replica == 0 and self.cpus_per_replica == 0:
            found.append("a replica needs a GPU or a share of a CPU (gpus_per_replica or cpus_per_replica above 0)")
        if not 0 <= self.port <= 65535:
            found.append(f"the proxy's port must be 0 (a free one) to 65535, not {self.port}")
        if not self.stats_period_s > 0:
            found.append(f"the routing-stats period must be above 0 s, not {self.stats_period_s}")
        return found


def sessions_per_replica(spec: PoolSpec) -> int:
    if spec.conversations is not None:
        return spec.conversations
    assert isinstance(spec.config, PoolConfig)
    return spec.config.slots * (spec.config.lockstep or 1)


def deployment_options(spec: PoolSpec, config: ClusterConfig) -> dict[str, Any]:
    """The Serve options of the replicas' deployment (`Deployment.options`)."""
    actor: dict[str, Any] = {"num_cpus": config.cpus_per_replica}
    if config.gpus_per_replica:
        actor["num_gpus"] = config.gpus_per_replica
    if config.runtime_env:
        actor["runtime_env"] = config.runtime_env
    return {
        "num_replicas": config.replicas,
        "ray_actor_options": actor,
        "max_ongoing_requests": config.max_ongoing_requests or sessions_per_replica(spec) + 16,
        "graceful_shutdown_timeout_s": config.drain_timeout_s,
        "graceful_shutdown_wait_loop_s": 1.0,
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
        "max_constructor_retry_count": config.start_attempts,
        "request_router_config": {  # a `ray.serve.config.RequestRouterConfig`
            "request_router_class": ROUTER_CLASS,
            "request_routing_stats_period_s": config.stats_period_s,
            "request_routing_stats_timeout_s": max(10.0, 4 * config.stats_period_s),
        },
    }


def init_ray(config: ClusterConfig) -> bool:
    """Connect to `config.address`, or start a local Ray; True when this call started Ray."""
    import ray

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's share of Serve's INFO lines
    if ray.is_initialized():
        return False
    if config.address is not None:
        ray.init(address=config.address, include_dashboard=False, log_to_driver=False)
        return True
    os.environ.setdefault(proxy.PROXY_CALLBACK_VARIABLE, proxy.PROXY_CALLBACK)
    ray.init(
        address="local",
        num_cpus=config.local_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return True


class ClusterStartError(RuntimeError):
    """The replicas did not start: the first replica's own error, or the proxy's port was taken."""


def ephemeral_port_floor() -> int:
    """The lowest port the kernel hands out for a bind to port 0 (Linux's default where it cannot be read)."""
    try:
        return int(EPHEMERAL_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_range() -> range:
    """Where port 0 draws the proxy's port: from FREE_PORT_LOW to the kernel's ephemeral floor, or, where the
    kernel's range starts below that, to the last port (a port taken first is then retried)."""
    floor = ephemeral_port_floor()
    return range(FREE_PORT_LOW, floor if floor > FREE_PORT_LOW + 1000 else 65536)


def bind_error(host: str, port: int) -> OSError | None:
    """Why a socket cannot bind `host:port` now (None: it can)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return error
    return None


def cannot_bind(host: str, port: int, error: OSError) -> ClusterStartError:
    if error.errno == errno.EADDRINUSE:
        return ClusterStartError(messages.proxy_port_taken(host, port))
    return ClusterStartError(messages.proxy_cannot_bind(host, port, error.strerror or str(error), error.errno))


def free_proxy_port(host: str) -> int:
    """A port on `host` that is free now, from `free_port_range()` (ports that neither the kernel nor a
    starting Ray hands out). The probe binds here: with a remote cluster (`address`) the proxies bind on its
    nodes, and a port taken there is retried by `start_proxy`."""
    ports = free_port_range()
    for _ in range(200):
        port = random.choice(ports)
        error = bind_error(host, port)
        if error is None:
            return port
        if error.errno != errno.EADDRINUSE:  # not this port: the host (an address not of this machine, ...)
            raise cannot_bind(host, port, error)
    raise ClusterStartError(messages.no_free_port(host, ports.start, ports.stop))


def running_proxy_port() -> int | None:
    """The port of the proxies of a Serve already running on the connected cluster (None without one): a second
    `serve.start` keeps the first one's HTTP options. Serve has no public call for it; its client holds them."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        return None if client is None else int(client.http_config.port)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def start_proxy(config: ClusterConfig) -> ClusterConfig:
    """Start Serve with its HTTP proxy on `config.host:config.port` and return `config` with the port it listens
    on. Port 0 takes a free port, and another should a process take the first before the proxy binds it. With
    Serve already running, its port, or a ClusterStartError if `config.port` names another."""
    from ray import serve

    running = running_proxy_port()
    if running is not None:
        if config.port not in (0, running):
            raise ClusterStartError(messages.serve_already_running(running, config.port))
        return attrs.evolve(config, port=running)
    chosen = config
    for _ in range(PROXY_START_ATTEMPTS if config.port == 0 else 1):
        if config.port == 0:
            chosen = attrs.evolve(config, port=free_proxy_port(config.host))
        try:
            serve.start(http_options={"host": chosen.host, "port": chosen.port})
            return chosen
        except Exception as error:  # a RayTaskError wrapping the proxy's RuntimeError, which hides the OSError
            if PROXY_BIND_FAILURE not in str(error):
                raise
            serve.shutdown()
        why = bind_error(chosen.host, chosen.port)
        if why is not None and why.errno != errno.EADDRINUSE:
            raise cannot_bind(chosen.host, chosen.port, why)
    if config.port != 0:
        raise ClusterStartError(messages.proxy_port_taken(chosen.host, chosen.port))
    raise ClusterStartError(messages.proxy_port_taken(chosen.host, chosen.port, PROXY_START_ATTEMPTS))


def start_error(app_name: str) -> ClusterStartError:
    """Why the application's deployment failed, from Serve's status (the replica's exception, last line)."""
    from ray import serve

    status = serve.status().applications.get(app_name)
    detail = status.deployments[DEPLOYMENT_NAME].message if status and DEPLOYMENT_NAME in status.deployments else ""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    return ClusterStartError(messages.replicas_failed(lines[-1] if lines else "no reason given"))


class DuplexCluster:
    """The running replicas of one application: its address, each replica's capacity, drain, shutdown."""

    def __init__(self, spec: PoolSpec, config: ClusterConfig, started_ray: bool):
        self.spec = spec
        self.config = config
        self.started_ray = started_ray
        self.stopped = False

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.config.host}:{self.config.port}{self.spec.path}"

    def handle(self) -> Any:
        from ray import serve

        return serve.get_app_handle(self.config.app_name)

    def replicas(self) -> list[str]:
        """The replicas of the application (their Serve ids), running or starting."""
        import ray

        prefix = f"{REPLICA_ACTOR_PREFIX}{self.config.app_name}#{DEPLOYMENT_NAME}#"
        names = [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)]
        return sorted(name[len(prefix) :] for name in names if name.startswith(prefix))

    def capacity(self, replica: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """A replica's routing stats: its pool's capacity, `replica`, `device`, `recorded_at`."""
        return self.handle().capacity.remote(replica_id=replica).result(timeout_s=timeout_s)

    def capacities(self, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
        """Every running replica's capacity (a replica that is not running yet is left out)."""
        from duplexcadence.interpreter.serve.cluster.replica import ReplicaNotServing

        found = {}
        for replica in self.replicas():
            try:
                found[replica] = self.capacity(replica, timeout_s)
            except ReplicaNotServing:
                continue
            except Exception as error:  # a RayTaskError wrapping ReplicaNotServing, or a replica that just died
                if isinstance(getattr(error, "cause", None), ReplicaNotServing) or "not serving" in str(error):
                    continue
                raise
        return found

    def drain(self, replica: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Admit no new session on `replica` (the routers know when this returns); its sessions finish."""
        return self.handle().drain.remote(replica_id=replica, timeout_s=timeout_s).result(timeout_s=timeout_s + 30)

    def metrics_text(self, replica: str, timeout_s: float = 30.0) -> str:
        return self.handle().metrics_text.remote(replica_id=replica).result(timeout_s=timeout_s)

    def kill(self, replica: str) -> None:
        """Kill a replica's process now (fault injection: its sessions are lost; Serve starts a replacement)."""
        import ray

        name = f"{REPLICA_ACTOR_PREFIX}{self.config.app_name}#{DEPLOYMENT_NAME}#{replica}"
        ray.kill(ray.get_actor(name, namespace=SERVE_NAMESPACE), no_restart=True)

    def wait_serving(self, replicas: int | None = None, timeout_s: float = 600.0) -> dict[str, dict[str, Any]]:
        """Wait until `replicas` (default: all) replicas run and have reported their capacity to the router."""
        wanted = replicas if replicas is not None else self.config.replicas or 1
        deadline = time.monotonic() + timeout_s
        while True:
            found = {name: stats for name, stats in self.capacities().items() if not stats.get("starting")}
            if len(found) >= wanted:
                time.sleep(2 * self.config.stats_period_s + 0.2)  # one report at least reaches every router
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(messages.replicas_not_serving(len(found), wanted, timeout_s))
            time.sleep(0.2)

    def shutdown(self, drain_timeout_s: float | None = None) -> None:
        """Drain every replica and wait up to `drain_timeout_s` (default the config's) for their sessions to end,
        stop the pools (a session left is closed with 1001 and the reason), then Serve, and Ray if this process
        started it. (`serve.shutdown` alone stops the proxies at once: every open session would be cut.)"""
        import ray
        from ray import serve

        if self.stopped:
            return
        self.stopped = True
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        deadline = time.monotonic() + timeout
        try:
            replicas = list(self.capacities())
            for replica in replicas:
                self.handle().drain.remote(replica_id=replica, timeout_s=0.0).result(timeout_s=30)
            while time.monotonic() < deadline and any(stats["sessions"] for stats in self.capacities().values()):
                time.sleep(0.2)
            for replica in replicas:
                self.handle().stop_pool.remote(replica_id=replica).result(timeout_s=60)
        finally:
            serve.shutdown()
            if self.started_ray:
                ray.shutdown()


def resolve(config: ClusterConfig) -> ClusterConfig:
    """`config` with its defaults taken from the cluster Ray is connected to: a GPU per replica when it has
    GPUs, and one replica per GPU (or one)."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    per_replica = config.gpus_per_replica if config.gpus_per_replica is not None else (1.0 if gpus else 0.0)
    replicas = config.replicas
    if replicas is None:
        replicas = max(1, int(gpus // per_replica)) if per_replica else 1
    return attrs.evolve(config, gpus_per_replica=per_replica, replicas=replicas)


def start(spec: PoolSpec, config: ClusterConfig, wait: bool = True) -> DuplexCluster:
    """Deploy `config.replicas` replicas of `spec` (see the module docstring); with `wait`, return once every
    replica serves."""
    problems = config.problems() + spec.config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    from ray import serve

    started_ray = init_ray(config)
    try:
        config = start_proxy(resolve(config))
        application = DEPLOYMENT.options(**deployment_options(spec, config)).bind(spec)
        try:
            serve.run(application, name=config.app_name, route_prefix="/")
        except RuntimeError:
            raise start_error(config.app_name) from None
        cluster = DuplexCluster(spec, config, started_ray)
        if wait:
            cluster.wait_serving()
    except BaseException:
        if started_ray:
            import ray

            serve.shutdown()
            ray.shutdown()
        raise
    return cluster
