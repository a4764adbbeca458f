"""Several server processes on one host and port: `dsl serve --workers N`.

One process's event loop receives, decodes, queues, encodes and sends every frame of every session; past a
few hundred sessions it, not the device, sets the limit. `serve_workers` runs N full servers instead, each in
a process of its own (started with multiprocessing's `spawn`): its own `SessionPool` on the same device with
1/N of the slots and lanes, its own device thread and event loop.

The parent binds N sockets to the one port, each with SO_REUSEPORT, and gives one to each worker, which
listens on it once its pool has started. The kernel then hashes each new connection to one of the listening
sockets, so a burst of connections spreads over the workers whatever each is doing, and a session lives in
the worker that accepted its websocket. The parent starts the pools one at a time (each calibrates its tick
model with the device otherwise idle), prints each worker's start-up lines and one `serving on` line once
all serve, forwards SIGINT, SIGTERM and SIGHUP (a closed terminal) to them as SIGTERM, and stops them all,
exiting non-zero, when one exits without being asked to.

Placement: the workers share a board of their loads (`placement.PlacementBoard`), and a worker leaves a new
session to another that takes it at a lower cost (a free row in a running lockstep group, or fewer units to
step), refusing it with `other-worker`; the client connects again.

Metrics: the parent makes a folder for prometheus-client's multiprocess mode (`metrics.MULTIPROCESS_DIR`) and
removes it at the end, so `/metrics` on any worker is the sum over the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.placement import PlacementBoard

if TYPE_CHECKING:  # the pool imports torch; `dsl serve` imports this module before it needs torch
    from duplexcadence.interpreter.serve.pool import PoolConfig

STOP_TIMEOUT_S = 60.0
"""How long a worker may take to close its sessions and exit once told to stop."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops the parent, and with it the workers."""

BIND_TRIES = 5
"""How many free ports port 0 tries, each taken by another process between its probe and the shared binds."""


def split_problems(slots: int, lanes: int, workers: int) -> list[str]:
    """Why `slots` and `lanes` (the server's) do not give each of `workers` workers as many, at least 1."""
    if workers < 1:
        return [messages.too_few_workers(workers)]
    return [
        messages.uneven_split(option, total, workers)
        for option, total in (("--slots", slots), ("--lanes", lanes))
        if total % workers or total < workers
    ]


@attrs.frozen
class ServeSpec:
    """What `serve_workers` serves: `target`, a registered tail or (with `model`, `MODULE:FUNCTION`) a `.clock`
    file, with its `params`, on `device`; `pool` is the whole server's `PoolConfig`, whose slots and lanes are
    split evenly over `workers`; `host` and `port` (0: a free one) where every worker listens."""

    target: str
    pool: PoolConfig
    workers: int = 1
    model: str | None = None
    params: tuple[tuple[str, str], ...] = ()
    device: str = "cpu"
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"

    def problems(self) -> list[str]:
        """Why the slots or lanes do not split over the workers (empty: they do)."""
        return split_problems(self.pool.slots, self.pool.lanes, self.workers)

    def worker_pool(self) -> PoolConfig:
        """Each worker's `PoolConfig`: 1/N of the slots and of the lanes."""
        return attrs.evolve(self.pool, slots=self.pool.slots // self.workers, lanes=self.pool.lanes // self.workers)

    def describe(self) -> str:
        pool = self.worker_pool()
        return messages.worker_split(self.workers, pool.slots, pool.lanes, pool.lockstep)


@attrs.frozen
class WorkerStarted:
    """A worker's word to the parent once it serves."""

    index: int
    pid: int
    pool_lines: str
    """The worker's pool's start-up lines (`SessionPool.describe()`)."""
    model: TickModel | None = None
    """The worker's tick model (its calibration, or the one given)."""


@attrs.frozen
class WorkerFailed:
    """A worker's word to the parent when it cannot start: `reason`; `usage` when it is the command line's
    fault (a lockstep the plan refuses, a bad tail option, a `.clock` problem)."""

    reason: str
    usage: bool


class WorkersFailed(Exception):
    """The workers could not start, or one stopped: `message` says which and why; `usage` when it is the
    command line's fault (a lockstep the plan refuses, a port taken), as the single server reports it."""

    def __init__(self, message: str, usage: bool = False):
        super().__init__(message)
        self.message = message
        self.usage = usage


# --- the parent -----------------------------------------------------------------------------------


def bind_sockets(host: str, port: int, count: int, option: str = "--workers") -> list[socket.socket]:
    """`count` sockets bound to `host`:`port` (0: a free port, the same for all), not yet listening. The port
    is first bound alone, without SO_REUSEPORT, so that a port another server holds is refused rather than
    shared; with port 0 the shared sockets then take the port that bind got, and a port taken in between is
    tried again with another. `option`: the command-line option that asked for the processes (`--workers`
    or `--fronts`), named in the errors."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "SO_REUSEPORT"):
        raise WorkersFailed(messages.workers_need_reuseport(sys.platform, option), usage=True)
    who = "the workers" if option == "--workers" else "the fronts"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(BIND_TRIES if port == 0 else 1):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
                free = probe.getsockname()[1]
        except OSError as error:
            raise cannot_bind(host, port, error, who) from None
        try:
            return shared_sockets(family, host, free, count)
        except OSError as error:
            if port != 0 or error.errno != errno.EADDRINUSE:
                raise cannot_bind(host, free, error, who) from None
    raise cannot_bind(host, 0, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE)), who)


def shared_sockets(family: int, host: str, port: int, count: int) -> list[socket.socket]:
    """`count` sockets bound to `host`:`port` with SO_REUSEPORT; OSError (none left open) when one cannot."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def cannot_bind(host: str, port: int, error: OSError, who: str = "the workers") -> WorkersFailed:
    reason = error.strerror or str(error)
    return WorkersFailed(messages.workers_cannot_bind(host, port, reason, error.errno, who), True)


@contextlib.contextmanager
def signals_ignored(numbers: tuple[int, ...]) -> Iterator[None]:
    """SIG_IGN for `numbers` while started children inherit it (a Ctrl-C, or the hang-up of a closed terminal,
    reaches the whole process group; the parent alone takes it and stops the workers). Only from the main thread; elsewhere nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


class WorkerGroup:
    """The parent's side of `serve_workers`: `start()` the workers, `wait()` while they serve, `stop()`."""

    def __init__(self, spec: ServeSpec, say: Callable[[str], None]):
        problems = spec.problems()
        if problems:
            raise WorkersFailed("; ".join(problems), usage=True)
        self.spec = spec
        self.say = say
        self.port = spec.port
        self.processes: list[Any] = []
        self.started: list[WorkerStarted] = []
        self.ready: set[int] = set()
        self.metrics_dir: str | None = None

    @property
    def ws_url(self) -> str:
        host = f"[{self.spec.host}]" if ":" in self.spec.host else self.spec.host
        return f"ws://{host}:{self.port}/v1/session"

    def start(self, stop: threading.Event) -> bool:
        """Bind, start every worker, wait until all serve (False: `stop` was set first). WorkersFailed when
        one does not start."""
        from duplexcadence.interpreter.serve.metrics import MULTIPROCESS_DIR

        spec = self.spec
        sockets = bind_sockets(spec.host, spec.port, spec.workers)
        self.port = sockets[0].getsockname()[1]
        self.metrics_dir = tempfile.mkdtemp(prefix="duplexcadence-metrics-")
        context = multiprocessing.get_context("spawn")
        turn = context.Lock()
        board = PlacementBoard(spec.workers, context)
        receivers = []
        previous = os.environ.get(MULTIPROCESS_DIR)
        os.environ[MULTIPROCESS_DIR] = self.metrics_dir
        try:
            with signals_ignored((signal.SIGINT, signal.SIGHUP)):
                for index, sock in enumerate(sockets):
                    receiver, sender = context.Pipe(duplex=False)
                    process = context.Process(
                        target=worker_main,
                        args=(spec, index, sock, sender, turn, board),
                        name=f"duplexcadence-worker-{index}",
                    )
                    process.start()
                    sender.close()
                    receivers.append(receiver)
                    self.processes.append(process)
        finally:
            if previous is None:
                os.environ.pop(MULTIPROCESS_DIR, None)
            else:
                os.environ[MULTIPROCESS_DIR] = previous
            for sock in sockets:
                sock.close()
        waiting = dict(enumerate(receivers))
        started: dict[int, WorkerStarted] = {}
        while waiting:
            if stop.is_set():
                return False
            sentinels = {self.processes[index].sentinel: index for index in waiting}
            ready = multiprocessing.connection.wait([*waiting.values(), *sentinels], timeout=0.2)
            for index, receiver in list(waiting.items()):
                if receiver not in ready:
                    continue
                try:
                    said = receiver.recv()
                except EOFError:  # the worker ended without a word: its sentinel says how
                    self.processes[index].join(5)
                    raise WorkersFailed(self.died(index, starting=True)) from None
                if isinstance(said, WorkerFailed):
                    reason = said.reason if said.usage else messages.worker_failed(index, said.reason)
                    raise WorkersFailed(reason, said.usage)
                started[index] = said
                self.ready.add(index)
                del waiting[index]
            for sentinel, index in sentinels.items():
                if sentinel in ready and index in waiting and not waiting[index].poll():
                    self.processes[index].join(5)
                    raise WorkersFailed(self.died(index, starting=True))
        self.started = [started[index] for index in range(spec.workers)]
        return True

    def died(self, index: int, starting: bool) -> str:
        process = self.processes[index]
        return messages.worker_died(index, process.pid, process.exitcode, starting)

    def wait(self, stop: threading.Event) -> str | None:
        """Until `stop` is set (None), or a worker exits unasked (what to say about it)."""
        sentinels = {process.sentinel: index for index, process in enumerate(self.processes)}
        while not stop.is_set():
            ended = multiprocessing.connection.wait(list(sentinels), timeout=0.2)
            if ended and not stop.is_set():
                index = sentinels[ended[0]]
                self.processes[index].join(5)
                return self.died(index, starting=False)
        return None

    def stop(self) -> None:
        """SIGTERM to every serving worker (each closes its sessions, 1001, and exits), SIGKILL to any still
        starting (it has no session; its pool may wait for another's turn); a worker not gone within
        `STOP_TIMEOUT_S` is killed. Removes the metrics folder."""
        for index, process in enumerate(self.processes):
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM if index in self.ready else signal.SIGKILL)
        for process in self.processes:
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join(5)
        if self.metrics_dir is not None:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            self.metrics_dir = None


def serve_workers(
    spec: ServeSpec,
    say: Callable[[str], None],
    started: Callable[[WorkerGroup], None] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve `spec` from `spec.workers` processes until SIGINT, SIGTERM or SIGHUP (or `stop` is set), then stop
    them: 0. WorkersFailed when they cannot start, or when one exits unasked (the others are stopped first).
    `say` gets the start-up lines (each worker's, then `serving on N worker(s) through URL`); `started(group)`
    is called once all serve."""
    stop = stop or threading.Event()
    group = WorkerGroup(spec, say)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {number: signal.signal(number, lambda *_: stop.set()) for number in STOP_SIGNALS}
    try:
        say(spec.describe())
        if not group.start(stop):
            return 0
        for worker in group.started:
            say(messages.worker_ready(worker.index, worker.pid))
            for line in worker.pool_lines.splitlines():
                say(f"  {line}")
        say(messages.serving_on_workers(spec.workers, group.ws_url))
        if started is not None:
            started(group)
        problem = group.wait(stop)
        if problem is not None:
            raise WorkersFailed(problem)
        say(messages.workers_stopping(spec.workers))
        return 0
    finally:
        group.stop()
        for number, handler in previous.items():
            signal.signal(number, handler)


# --- a worker -------------------------------------------------------------------------------------


def worker_main(
    spec: ServeSpec, index: int, sock: socket.socket, parent: Any, turn: Any, board: PlacementBoard
) -> None:
    """A worker process: its pool (started in its turn, seated on the workers' placement `board`), then
    uvicorn on `sock` until SIGTERM."""
    threading.Thread(target=exit_with_parent, name="duplexcadence-parent-watch", daemon=True).start()
    try:
        code = asyncio.run(serve_one(spec, index, sock, parent, turn, board))
    except Exception as error:  # a fault (a bug): say it to the parent, whose message names this worker
        with contextlib.suppress(OSError):
            parent.send(WorkerFailed(messages.internal(error), usage=False))
        raise
    sys.exit(code)


def exit_with_parent() -> None:
    """A worker's watch: when its parent is gone (killed), the worker stops too."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)


async def serve_one(
    spec: ServeSpec, index: int, sock: socket.socket, parent: Any, turn: Any, board: PlacementBoard
) -> int:
    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.pool import SessionPool
    from duplexcadence.interpreter.serve.server import ChildServer, serve_pool, server_config, start_problem
    from duplexcadence.interpreter.serve.tail import served_tail

    with turn:
        try:
            served = served_tail(spec.target, spec.model, dict(spec.params), spec.device)
            pool = SessionPool(served, spec.worker_pool(), placement=board.seat(index))
            await pool.start()
        except Exception as error:
            problem = start_problem(spec.target, error)
            if problem is None:
                raise
            parent.send(WorkerFailed(problem, usage=True))
            return 2
    server = ChildServer(
        server_config(make_app(pool, manage_pool=False, worker=(index, spec.workers)), log_level=spec.log_level)
    )
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    started = WorkerStarted(index, os.getpid(), pool.describe(), pool.model)
    await serve_pool(pool, server, lambda _: parent.send(started), [sock])
    return 0
