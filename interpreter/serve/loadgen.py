"""A load generator: N concurrent sessions over websockets, each T ticks, with bounded loops.

Every session opens (a refusal is counted with its reason), then all start together. Paced (the default), a
session sends tick t at start + t x the tick period, as a live stream would, keeping at most the server's queue
depth of ticks unanswered (a send that had to wait is counted as blocked); unpaced, it sends the next tick
when the last is answered. A tick's latency runs from its send to its answer. With `record`, the outputs of
the first `record` sessions are kept; `verify` then compares every recorded output with `torch.equal`:

* sessions in lanes (their own runtime session each): with that session's inputs run alone through the
  tail's stock loop (`ServedTail.stock`), seeded as the runtime seeds the session;
* sessions in the rows of lockstep groups: with the tail's own batched decode of the group
  (`ServedTail.stock_group`): every row of the group fed its member's inputs (idle rows zeros), as the server
  batches them. A row equals that, not necessarily a batch-1 decode of the same session (other kernels run at
  another batch); `compare_with_stock` gives that count too, as information. The group reference needs every
  member of the group to be one of this run's sessions (they join together, before the first tick).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from duplexcadence.interpreter.serve import numerics
from duplexcadence.interpreter.serve.client import (
    Refused,
    ServerError,
    SessionClient,
    SessionClosedByServer,
    bundle_url,
)
from duplexcadence.interpreter.serve.deadlines import quantile
from duplexcadence.interpreter.serve.numerics import Numerics
from duplexcadence.interpreter.serve.tail import SeededStock, ServedTail, deterministic_cudnn

Inputs = Callable[[int, int], Mapping[str, torch.Tensor]]


@attrs.frozen
class SessionLoad:
    """One driven session: its seed, ticks answered with outputs, error codes, latencies (seconds), blocked
    sends, whether it was refused (with the reason), its recorded outputs (`record`), the replica that held
    it (through a cluster; None for a single server), and its lockstep group and row (None in lanes)."""

    seed: int
    ticks: int
    errors: tuple[str, ...]
    latencies: tuple[float, ...]
    blocked: int
    refused: str | None = None
    outputs: tuple[dict[str, torch.Tensor], ...] = attrs.field(default=(), repr=False)
    replica: str | None = None
    group: int | None = None
    row: int | None = None


@attrs.frozen
class LoadReport:
    """What a run measured: the sessions asked for, opened and refused (reasons counted), ticks answered,
    their latency p50 / p99 / max, ticks over the tick period (missed), errors by code, blocked sends, the
    wall time, and the comparison with stock (None without `verify`; `verified_against` says with what:
    "stock alone" in lanes, "the group's batched stock" in lockstep)."""

    url: str
    sessions: int
    ticks_per_session: int
    paced: bool
    tick_period_s: float | None
    opened: int
    refused: dict[str, int]
    ticks: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None
    missed: int
    errors: dict[str, int]
    blocked: int
    wall_s: float
    verified_sessions: int | None = None
    verified_ticks: int | None = None
    unequal_ticks: int | None = None
    verified_against: str | None = None
    verified_settings: str | None = None
    """The server's numeric settings the comparison ran at (None: not known, this process's own)."""
    unmatched_settings: tuple[str, ...] = ()
    """The server's settings the comparison could not take (another torch, another device kind)."""
    per_session: tuple[SessionLoad, ...] = attrs.field(default=(), repr=False)

    def to_json(self) -> dict:
        data = attrs.asdict(self, recurse=False)
        data["per_session"] = [
            {
                "seed": s.seed,
                "ticks": s.ticks,
                "errors": list(s.errors),
                "blocked": s.blocked,
                "refused": s.refused,
                "latencies_s": list(s.latencies),
                "replica": s.replica,
                "group": s.group,
                "row": s.row,
            }
            for s in self.per_session
        ]
        return data

    def lines(self) -> list[str]:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.1f} ms"

        refusals = ", ".join(f"{n} {reason}" for reason, n in sorted(self.refused.items())) or "none"
        errors = ", ".join(f"{n} {code}" for code, n in sorted(self.errors.items())) or "none"
        period = "-" if self.tick_period_s is None else f"{self.tick_period_s * 1000:g} ms"
        lines = [
            f"sessions: {self.opened} of {self.sessions} opened; refused: {refusals}",
            f"ticks: {self.ticks} answered ({self.ticks_per_session} per session, {'paced' if self.paced else 'unpaced'}) "
            f"in {self.wall_s:.1f} s; errors: {errors}; blocked sends: {self.blocked}",
            f"tick latency: p50 {ms(self.latency_p50_s)}, p99 {ms(self.latency_p99_s)}, max {ms(self.latency_max_s)}; "
            f"missed (over the {period} period): {self.missed}",
        ]
        if self.verified_sessions is not None:
            at = f" at the server's settings ({self.verified_settings})" if self.verified_settings else ""
            lines.append(
                f"verify: {self.verified_ticks} ticks of {self.verified_sessions} sessions compared with "
                f"{self.verified_against or 'stock alone'}{at}, {self.unequal_ticks} not torch.equal"
            )
            if self.unmatched_settings:
                lines.append(
                    f"verify: {'; '.join(self.unmatched_settings)}: ticks that differ may differ by these settings, "
                    "not by the server"
                )
        return lines


async def drive_session(
    url: str,
    seeds: list[int],
    ticks: int,
    inputs: Inputs,
    start: asyncio.Event,
    opened: asyncio.Queue,
    paced: bool,
    record: int,
) -> list[SessionLoad]:
    """One session (one seed), or a bundle of sessions (several: `/v1/bundle`, a tick's inputs stacked in seed
    order): open, wait for the common start, send `ticks` ticks, close. A load per session; the outputs of
    the first `record` sessions are kept."""
    bundled = len(seeds) > 1
    try:
        client = await SessionClient.connect(bundle_url(url, len(seeds)) if bundled else url, seed=seeds[0])
    except Refused as refusal:
        await opened.put(None)
        return [SessionLoad(seed, 0, (), (), 0, refused=f"{refusal.code}: {refusal.message}") for seed in seeds]
    await opened.put(client)
    await start.wait()
    period = client.tick_period_s
    window = int(client.ready.get("queue_depth", 1)) if paced else 1  # unpaced: the next tick after the answer
    sent_at: collections.deque[float] = collections.deque()
    latencies: list[float] = []
    errors: list[tuple[str, list[int] | None]] = []  # a code, and the bundle's members it is for (None: all)
    outputs: list[dict[str, torch.Tensor]] = []
    failed_members: list[set[int]] = []  # per recorded answer: the bundle's members it has no rows of
    blocked = 0
    began = time.perf_counter()
    slots = asyncio.Semaphore(window)
    closed_early = asyncio.Event()

    async def receive_all() -> None:
        for _ in range(ticks):
            try:
                answer = await client.receive()
            except SessionClosedByServer as closed:
                errors.append((closed.code, None))
                closed_early.set()
                for _ in range(window):  # wake the sender: it stops
                    slots.release()
                return
            except ServerError as error:
                errors.append((error.code, error.members))
                sent_at.popleft()
                slots.release()
                if record:  # a bundle's members that stepped the tick have their rows (the failed ones none)
                    outputs.append(error.outputs or {})
                    failed_members.append(set(error.members or ()))
                continue
            latencies.append(time.perf_counter() - sent_at.popleft())
            slots.release()
            if record:
                outputs.append(answer)
                failed_members.append(set())

    def tick_inputs(tick: int) -> dict[str, torch.Tensor]:
        if not bundled:
            return dict(inputs(seeds[0], tick))
        rows = [inputs(seed, tick) for seed in seeds]
        return {name: torch.stack([row[name] for row in rows]) for name in rows[0]}

    receiver = asyncio.create_task(receive_all())
    try:
        for tick in range(ticks):
            if closed_early.is_set():
                break
            if paced:
                delay = began + tick * period - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            if paced and slots.locked():
                blocked += 1
            await slots.acquire()
            if closed_early.is_set():
                break
            sent_at.append(time.perf_counter())
            try:
                await client.send(tick_inputs(tick))
            except SessionClosedByServer:  # the receiver records why
                break
        await receiver
    finally:
        receiver.cancel()
        if not closed_early.is_set():
            with contextlib.suppress(ServerError, OSError):
                await client.close()
        else:
            await client.connection.close()
    members = client.ready.get("members") or [client.ready]
    return [
        SessionLoad(
            seed,
            len(latencies),
            tuple(code for code, members in errors if members is None or index in members),
            tuple(latencies),
            blocked if index == 0 else 0,  # a bundle's blocked sends are counted once, on its first member
            None,
            member_outputs(outputs, failed_members, index, bundled) if index < record else (),
            client.replica,
            member.get("group"),
            member.get("row"),
        )
        for index, (seed, member) in enumerate(zip(seeds, members, strict=True))
    ]


def member_outputs(
    outputs: list[dict[str, torch.Tensor]], failed: list[set[int]], index: int, bundled: bool
) -> tuple[dict, ...]:
    """A session's recorded outputs (an error's: {}); a bundle's answers stack its members' on the leading axis,
    and an answer that failed for some members (`failed`, per answer) has none of theirs."""
    if not bundled:
        return tuple(outputs)
    return tuple(
        {} if index in missing else {name: tensor[index] for name, tensor in answer.items()}
        for answer, missing in zip(outputs, failed, strict=True)
    )


async def run_load(
    url: str,
    sessions: int,
    ticks: int,
    inputs: Inputs,
    paced: bool = True,
    record: int = 0,
    first_seed: int = 0,
    before_start: Callable[[], Awaitable[None]] | None = None,
    bundle: int = 1,
) -> LoadReport:
    """Drive `sessions` sessions (seeds `first_seed`, `first_seed` + 1, ...) for `ticks` ticks each, each over
    its own websocket, or with `bundle` > 1 in bundles of that many (`/v1/bundle`; the last one smaller),
    each bundle over one websocket. `before_start` is awaited once every session is open (or refused), before
    the first tick (a barrier across processes). `record`: the first that many sessions' outputs are kept."""
    start = asyncio.Event()
    opened: asyncio.Queue = asyncio.Queue()
    seeds = [first_seed + i for i in range(sessions)]
    bundles = [seeds[i : i + bundle] for i in range(0, sessions, max(1, bundle))]
    tasks = [
        asyncio.create_task(
            drive_session(url, members, ticks, inputs, start, opened, paced, max(0, record - members[0] + first_seed))
        )
        for members in bundles
    ]
    clients = [await opened.get() for _ in bundles]
    period = next((c.tick_period_s for c in clients if c is not None), None)
    if before_start is not None:
        await before_start()
    began = time.perf_counter()
    start.set()
    loads = [load for driven in await asyncio.gather(*tasks) for load in driven]
    wall = time.perf_counter() - began
    latencies = [value for load in loads for value in load.latencies]
    refused = collections.Counter(load.refused.partition(":")[0] for load in loads if load.refused)
    errors = collections.Counter(code for load in loads for code in load.errors)
    return LoadReport(
        url=url,
        sessions=sessions,
        ticks_per_session=ticks,
        paced=paced,
        tick_period_s=period,
        opened=sum(1 for load in loads if load.refused is None),
        refused=dict(refused),
        ticks=len(latencies),
        latency_p50_s=quantile(latencies, 0.5),
        latency_p99_s=quantile(latencies, 0.99),
        latency_max_s=max(latencies) if latencies else None,
        missed=sum(1 for value in latencies if period is not None and value > period),
        errors=dict(errors),
        blocked=sum(load.blocked for load in loads),
        wall_s=wall,
        per_session=tuple(loads),
    )


def compare_with_stock(served: ServedTail, load: SessionLoad) -> tuple[int, int]:
    """(ticks compared, ticks with an output not `torch.equal` to stock's): the session's inputs run alone
    through the stock loop, seeded as the runtime seeds the session."""
    if served.stock is None:
        raise ValueError(f"the '{served.name}' tail has no stock loop to verify against")
    stock = SeededStock(served.stock(load.seed), load.seed, served.device)
    stock.reset()
    compared = unequal = 0
    inputs = served.inputs
    assert inputs is not None
    with deterministic_cudnn(), torch.no_grad():
        for tick, outputs in enumerate(load.outputs):
            expected = stock.step(**{name: t.to(served.device) for name, t in inputs(load.seed, tick).items()})
            if not outputs:  # an error frame: nothing to compare (the report counts the error)
                continue
            expected_named = expected if isinstance(expected, Mapping) else {next(iter(outputs)): expected}
            compared += 1
            unequal += any(
                name not in outputs or not torch.equal(value.to("cpu"), outputs[name])
                for name, value in expected_named.items()
            )
    return compared, unequal


def compare_groups_with_stock(served: ServedTail, loads: Sequence[SessionLoad], rows: int) -> tuple[int, int, int]:
    """(sessions compared, ticks compared, ticks with an output not `torch.equal` to the reference): each
    lockstep group holding a recorded session is run through the tail's batched stock (`stock_group`) with its
    members' inputs in their rows (idle rows zeros), every member joined at the start. A group is left out
    when one of its members did not answer every tick (an error, a refusal): its rows' inputs are not known."""
    if served.stock_group is None:
        raise ValueError(f"the '{served.name}' tail has no batched stock loop to verify lockstep rows against")
    inputs = served.inputs
    assert inputs is not None
    groups: dict[int, list[SessionLoad]] = collections.defaultdict(list)
    for load in loads:
        if load.refused is None and load.group is not None and load.row is not None:
            groups[load.group].append(load)
    sessions = compared = unequal = 0
    for members in groups.values():
        recorded = [load for load in members if load.outputs]
        ticks = {load.ticks for load in members}
        if not recorded or len(ticks) != 1 or any(load.errors for load in members):
            continue
        (count,) = ticks
        stock = served.stock_group(rows)
        seeded = SeededStock(stock, 0, served.device)  # a group's session is seeded 0
        seeded.reset()
        with deterministic_cudnn(), torch.no_grad():
            for load in members:
                stock.join(load.row)
            for tick in range(count):
                fed = {
                    load.row: {name: t.to(served.device) for name, t in inputs(load.seed, tick).items()}
                    for load in members
                }
                with seeded.installed():
                    expected = stock.step(fed)
                for load in recorded:
                    compared += 1
                    outputs = load.outputs[tick]
                    unequal += any(
                        name not in outputs or not torch.equal(value.to("cpu"), outputs[name])
                        for name, value in expected[load.row].items()
                    )
        sessions += len(recorded)
    return sessions, compared, unequal


def verify(
    served: ServedTail,
    report: LoadReport,
    lockstep_rows: int | None = None,
    server_numerics: Mapping[str, Any] | None = None,
) -> LoadReport:
    """The report with every recorded session compared with stock alone (lanes), or with the batched stock of
    its lockstep group (`lockstep_rows`: the server's rows a group), at the server's numeric settings (the
    `ready` frame's `numerics`: its torch threads and deterministic flags, applied here meanwhile); the
    settings this process cannot take are named in the report."""
    settings = Numerics.from_json(server_numerics) if server_numerics else None
    with numerics.applied(settings) if settings is not None else contextlib.nullcontext():
        if lockstep_rows is not None:
            sessions, compared, unequal = compare_groups_with_stock(served, report.per_session, lockstep_rows)
            against = "the batched stock of their lockstep groups"
        else:
            recorded = [load for load in report.per_session if load.outputs]
            sessions, compared, unequal = len(recorded), 0, 0
            for load in recorded:
                done, differ = compare_with_stock(served, load)
                compared += done
                unequal += differ
            against = "stock alone"
    return attrs.evolve(
        report,
        verified_sessions=sessions,
        verified_ticks=compared,
        unequal_ticks=unequal,
        verified_against=against,
        verified_settings=settings.describe() if settings is not None else None,
        unmatched_settings=tuple(numerics.unmatched(settings, served.device)) if settings is not None else (),
    )


def zeros_inputs(ready: dict) -> Inputs:
    """Zeros of the shapes the server's `ready` frame gives (a tail without an input generator)."""
    from duplexcadence.interpreter.serve.codec import TORCH_DTYPES

    specs = [(spec["name"], tuple(spec["shape"]), TORCH_DTYPES[spec["dtype"]]) for spec in ready["inputs"]]
    return lambda seed, tick: {name: torch.zeros(shape, dtype=dtype) for name, shape, dtype in specs}


async def probe(url: str) -> dict:
    """The `ready` frame of a session opened and closed at once (what the server serves)."""
    client = await SessionClient.connect(url, seed=0)
    try:
        return client.ready
    finally:
        await client.close()


def served_for(ready: dict, device: str | None = None) -> ServedTail | None:
    """The registered tail the server serves, built on `device` (the server's by default), for inputs and
    verification; None when the server's tail is not registered here."""
    from duplexcadence.interpreter import tails
    from duplexcadence.interpreter.serve.tail import served_tail

    if ready["tail"] not in tails.available():
        return None
    return served_tail(ready["tail"], params=ready.get("options") or {}, device=device or ready["device"])


def describe_ready(ready: dict) -> str:
    inputs = ", ".join(f"{s['name']} {s['dtype']}{s['shape']}" for s in ready["inputs"])
    return (
        f"serving '{ready['tail']}' on {ready['device']}: a tick every {ready['tick_period_s'] * 1000:g} ms of {inputs}"
    )
