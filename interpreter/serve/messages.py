"""Every word the serving layer says to a user: admission refusals, protocol error codes and their texts,
websocket close codes. The pool, the ASGI app, the client and the CLI format nothing themselves.

Error codes travel in JSON error frames (`{"type": "error", "code": CODE, "message": TEXT}`); docs/serving.md
has a section for each (tests/serve/test_messages.py checks it).
"""

from __future__ import annotations

import errno
from collections.abc import Iterable

# --- websocket close codes (RFC 6455 section 7.4; 4000-4999 are private) ---------------------------------

CLOSE_NORMAL = 1000
"""The session closed as asked (a `close` control frame), or the client closed."""
CLOSE_GOING_AWAY = 1001
"""The server is shutting down: the pool stopped."""
CLOSE_POLICY = 1008
"""The client broke the protocol before a session was opened (a query parameter that is not valid)."""
CLOSE_INTERNAL = 1011
"""The server failed (a bug): the session is gone."""
CLOSE_TRY_AGAIN_LATER = 1013
"""Admission refused: the pool is at capacity or draining; the reason says which, with the numbers."""
CLOSE_IDLE = 4408
"""The session sent nothing for the pool's idle timeout: its slot was freed."""
CLOSE_TOO_SLOW = 4409
"""A lockstep member kept its group waiting past the tick period too many times in a row: its slot was freed."""
CLOSE_UNREAD_ANSWERS = 4429
"""The client left an answer unread past the server's answer timeout: its slot was freed."""

CLOSE_REASON_BYTES = 123
"""A close frame's reason is at most 123 bytes of UTF-8 (RFC 6455 section 5.5)."""

# --- error codes ------------------------------------------------------------------------------------

BAD_MAGIC = "bad-magic"
BAD_VERSION = "bad-version"
BAD_FLAGS = "bad-flags"
UNKNOWN_DTYPE = "unknown-dtype"
TRUNCATED = "truncated"
BAD_FRAME = "bad-frame"
UNKNOWN_INPUT = "unknown-input"
MISSING_INPUT = "missing-input"
WRONG_DTYPE = "wrong-dtype"
WRONG_SHAPE = "wrong-shape"
BAD_INPUT = "bad-input"
STAGE_FAILED = "stage-failed"
SESSION_FAILED = "session-failed"
FINISHED = "finished"
QUEUE_FULL = "queue-full"
FRAME_TOO_LARGE = "frame-too-large"
TOO_SLOW = "too-slow"
UNAUTHORIZED = "unauthorized"
FORBIDDEN_ORIGIN = "forbidden-origin"
UNTRUSTED_HOST = "untrusted-host"
NOT_FOUND = "not-found"
UNREAD_ANSWERS = "unread-answers"
BAD_CONTROL = "bad-control"
AT_CAPACITY = "at-capacity"
DRAINING = "draining"
IDLE_TIMEOUT = "idle-timeout"
SHUTTING_DOWN = "shutting-down"
INTERNAL = "internal"

CLIENT_CLOSED = "closed"
"""Why a session closed when its client asked (a close reason, never an error frame's code)."""
DISCONNECTED = "disconnected"
"""Why a session closed when its client went away without a close frame."""

ERROR_CODES: dict[str, str] = {
    BAD_MAGIC: "a binary frame that does not start with the magic bytes",
    BAD_VERSION: "a binary frame of a protocol version this server does not speak",
    BAD_FLAGS: "a binary frame with a flag bit this version does not define",
    UNKNOWN_DTYPE: "a tensor whose dtype code is not in the table",
    TRUNCATED: "a binary frame shorter than its header says",
    BAD_FRAME: "a binary frame whose header cannot be read otherwise (a name that is not UTF-8, extra bytes)",
    UNKNOWN_INPUT: "a tensor whose name is not an input of the tail",
    MISSING_INPUT: "a tick without one of the tail's inputs",
    WRONG_DTYPE: "an input of another dtype than the tail's region",
    WRONG_SHAPE: "an input whose shape the tail's region cannot take",
    BAD_INPUT: "an input the runtime refused at this instant (StepError); nothing changed",
    STAGE_FAILED: "a stage raised during the tick: the session needs a reset",
    SESSION_FAILED: "a tick sent to a failed session before its reset",
    FINISHED: "a tick sent after the stream's last tick, before a reset",
    QUEUE_FULL: "more ticks queued than the pool holds per session",
    FRAME_TOO_LARGE: "a binary frame longer than any tick of the tail can be (refused before it is read)",
    UNREAD_ANSWERS: "the client left an answer unread past the answer timeout: the session is closed",
    TOO_SLOW: "a lockstep member whose ticks keep its group waiting past the tick period (close 4409)",
    UNAUTHORIZED: "a request without the server's API key (HTTP 401)",
    FORBIDDEN_ORIGIN: "a browser's request from an origin the server does not allow (HTTP 403)",
    UNTRUSTED_HOST: "a request whose Host header names no trusted host (HTTP 400)",
    NOT_FOUND: "a route the server hides (HTTP 404)",
    BAD_CONTROL: "a text frame that is not a control frame this server knows",
    AT_CAPACITY: "admission refused: no slot, or the predicted tick would pass the budget",
    DRAINING: "admission refused: the pool is draining",
    IDLE_TIMEOUT: "the session sent nothing for the idle timeout and was closed",
    SHUTTING_DOWN: "the server is stopping; the session is closed",
    INTERNAL: "a server fault (a bug): the session is closed",
}

# --- numbers ----------------------------------------------------------------------------------------


def milliseconds(seconds: float) -> str:
    """`861 ms`, `12.4 ms`: whole milliseconds from 100 ms up, one decimal below."""
    value = seconds * 1000
    return f"{value:.0f} ms" if abs(value) >= 100 else f"{value:.1f} ms"


def percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


# --- admission ---------------------------------------------------------------------------------------


def at_capacity(
    active: int,
    capacity: int,
    predicted_s: float,
    period_s: float,
    headroom: float,
    slots_full: bool,
    session_slots: int,
    budget_s: float,
    client: str = "session",
) -> str:
    """The refusal of a session (a `client`: "conversation" for a conversation pool) the pool has no room for.
    `predicted_s`: the tick predicted with it admitted."""
    clients = f"{client}s"
    held = (
        f"{active} of {capacity} {clients}" if active <= capacity else f"{active} {clients} open (room for {capacity})"
    )
    head = (
        f"at capacity: {held}, predicted tick {milliseconds(predicted_s)} of "
        f"{milliseconds(period_s)} (headroom {percent(headroom)})"
    )
    if slots_full:
        return f"{head}; all {session_slots} {client} slots are taken"
    return f"{head}; one more {client} would pass the budget of {milliseconds(budget_s)}"


def latency_over_budget(
    active: int,
    observed_p99_s: float,
    window_s: float,
    period_s: float,
    headroom: float,
    budget_s: float,
    client: str = "session",
) -> str:
    """The refusal of a session while the ticks the pool answers run over the budget, whatever the model says."""
    return (
        f"at capacity: {plural(active, client)} open, their ticks' p99 latency over the last "
        f"{milliseconds(window_s)} is {milliseconds(observed_p99_s)} of {milliseconds(period_s)}, over the budget "
        f"of {milliseconds(budget_s)} (headroom {percent(headroom)}); the pool admits again once it is under"
    )


def draining(active: int, client: str = "session") -> str:
    return f"draining: this pool admits no new {client} while its {plural(active, client)} finish"


def shutting_down() -> str:
    return "the server is shutting down: this pool admits no session and closes the ones it has"


# --- protocol ----------------------------------------------------------------------------------------


def bad_magic(found: bytes, magic: bytes) -> str:
    return f"the frame starts with {found!r}, not the magic {magic!r}: it is not a DuplexCadence tensor frame"


def bad_version(found: int, versions: Iterable[int]) -> str:
    spoken = ", ".join(str(v) for v in versions)
    return f"protocol version {found} is not spoken here; this server speaks version {spoken}"


def bad_flags(flags: int, known: int) -> str:
    return f"flags 0x{flags:04x} set bits this version does not define (known: 0x{known:04x})"


def unknown_dtype(code: int, name: str, table: dict[int, str]) -> str:
    known = ", ".join(f"{c} {n}" for c, n in sorted(table.items()))
    return f"tensor '{name}' has dtype code {code}, which is not in the table ({known})"


def truncated(needed: int, found: int, what: str) -> str:
    return f"the frame ends after {found} bytes, inside {what} (it needs {needed})"


def trailing_bytes(extra: int) -> str:
    return f"the frame has {plural(extra, 'byte')} after the data of its tensors"


def bad_name(index: int) -> str:
    return f"the name of tensor {index} is not UTF-8 text"


def bad_bool() -> str:
    return "a bool tensor holds a byte other than 0 or 1"


def empty_shape_too_large(name: str, shape: tuple[int, ...], most: int) -> str:
    return f"tensor '{name}' has shape {list(shape)}: its dimensions other than the empty one hold more than {most} elements"


def duplicate_name(name: str) -> str:
    return f"tensor '{name}' appears twice in the frame"


def too_many_dims(name: str, ndim: int, most: int) -> str:
    return f"tensor '{name}' has {ndim} dimensions; a frame carries at most {most}"


def too_many_tensors(count: int, most: int) -> str:
    return f"the frame names {count} tensors; at most {most}"


def name_too_long(length: int, most: int) -> str:
    return f"a tensor name of {length} bytes; at most {most}"


def unknown_input(name: str, inputs: Iterable[str]) -> str:
    return f"'{name}' is not an input of this tail; its inputs are {', '.join(inputs)}"


def missing_input(names: Iterable[str], inputs: Iterable[str]) -> str:
    return f"the tick has no {', '.join(repr(n) for n in names)}; every tick gives {', '.join(inputs)}"


def wrong_dtype(name: str, found: str, expected: str) -> str:
    return f"input '{name}' is {found}; the tail's region is {expected}"


def wrong_shape(name: str, found: tuple[int, ...], expected: str, why: str) -> str:
    return f"input '{name}' has shape {list(found)}; the tail takes {expected} ({why})"


def bundle_shape(name: str, found: list[int], count: int) -> str:
    return (
        f"input '{name}' of a bundle of {plural(count, 'session')} has shape {found}; a bundle's inputs stack its "
        f"sessions' on a leading axis of {count}"
    )


def bundle_refused(count: int, opened: int, refusal: str) -> str:
    return (
        f"a bundle of {plural(count, 'session')} does not fit ({opened} fitted, none is kept): the next one was "
        f"refused: {refusal}"
    )


def bundle_over_slots(count: int, free: int, slots: int) -> str:
    return (
        f"a bundle of {plural(count, 'session')} does not fit: {free} of the pool's {plural(slots, 'session slot')} "
        f"{'is' if free == 1 else 'are'} free"
    )


def bad_bundle_size(text: str) -> str:
    return (
        f"the query parameter sessions={text!r} is not a whole number of 1 or more; /v1/bundle?sessions=N "
        "opens N sessions as one bundle"
    )


def bad_control(problem: str) -> str:
    return f'{problem}; control frames are JSON objects: {{"type": "reset"}} or {{"type": "close"}}'


def queue_full(depth: int) -> str:
    return (
        f"the session already has {plural(depth, 'tick')} queued, the most this pool holds per session; "
        "wait for an output before sending the next tick"
    )


def resets_queue_full(depth: int) -> str:
    return (
        f"the session already has {plural(depth, 'reset')} queued, the most this pool holds per session; "
        "wait for a reset to be done before sending the next"
    )


def session_failed(cause: str) -> str:
    return f'the session failed ({cause}); send {{"type": "reset"}} to start it again'


def finished() -> str:
    return 'the session\'s stream has finished (a last tick was sent); send {"type": "reset"} to start the next one'


def bad_seed(text: str, limit: int) -> str:
    shown = text if len(text) <= 40 else text[:40] + "..."
    return (
        f"the query parameter seed={shown!r} is not a whole number from 0 to {limit - 1}; /v1/session?seed=N seeds "
        "the session"
    )


def unauthorized(variable: str) -> str:
    return (
        "this server needs an API key: send 'Authorization: Bearer KEY' (a browser's websocket: the subprotocol "
        f"'openai-insecure-api-key.KEY'); the server's key is its --api-key or {variable}"
    )


def forbidden_origin(origin: str) -> str:
    return (
        f"a request from the web page of {origin[:120]!r}, which this server does not allow: serve it with "
        "--allowed-origin for that origin"
    )


def untrusted_host(host: str, trusted: tuple[str, ...]) -> str:
    return f"the Host header {host[:120]!r} names no host this server trusts ({', '.join(trusted)}; --trusted-host)"


def route_hidden(path: str) -> str:
    return f"{path[:120]} is not served here"


def out_of_bounds(name: str, found: float, least: int, most: int) -> str:
    return (
        f"input '{name}' holds {found:g}, outside {least} to {most}: refused before the lockstep group's step, "
        "where it would fail every row"
    )


def too_slow(misses: int, period_s: float) -> str:
    return (
        f"this session's tick came over a tick period ({milliseconds(period_s)}) after the rest of its lockstep "
        f"group's {misses} times in a row: it is closed so that the group goes on"
    )


def frame_too_large(found: int, most: int) -> str:
    return f"a binary frame of {found} bytes; a tick of this tail is at most {most} bytes: the frame was not read"


def unread_answers(seconds: float) -> str:
    return f"an answer waited {seconds:g} s to be sent: the client does not read its answers; the session is closed"


def no_last_in_lockstep() -> str:
    return "a session in a lockstep group has no last tick (its group steps on); send a reset to start over"


def disconnected() -> str:
    return "the client went away"


def idle_timeout(seconds: float) -> str:
    return f"the session sent nothing for {seconds:g} s (the pool's idle timeout) and was closed; its slot is free"


def group_failed(cause: str) -> str:
    return (
        f"a stage failed in the lockstep group of this session ({cause}); the group was reset: send "
        '{"type": "reset"} to start this session again'
    )


def session_closed(reason: str) -> str:
    return f"the session is closed ({reason})"


def internal(error: BaseException) -> str:
    return f"a server fault: {type(error).__name__}: {error}; this is a bug in DuplexCadence"


def close_reason(message: str) -> str:
    """`message` cut to fit a websocket close frame (123 bytes of UTF-8, whole characters)."""
    data = message.encode("utf-8")
    if len(data) <= CLOSE_REASON_BYTES:
        return message
    return data[: CLOSE_REASON_BYTES - 3].decode("utf-8", errors="ignore") + "..."


# --- start-up and the CLI ----------------------------------------------------------------------------


def lockstep_refused(rows: int, problem: str) -> str:
    return f"--lockstep {rows}: this plan cannot take a session into a running group: {problem}"


def no_serve_adapter(tail: str) -> str:
    return (
        f"the '{tail}' tail declares no serving adapter (its Tail record has no `serve`); serve its .clock with "
        "--model MODULE:FUNCTION, or add one (docs/serving.md)"
    )


def needs_initial(regions: Iterable[str]) -> str:
    return (
        f"the .clock declares region(s) {', '.join(regions)} `start given`: a session needs initial values, "
        "which a bare model builder does not give; make MODULE:FUNCTION return a ServedTail (docs/serving.md)"
    )


def calibration_line(fixed_s: float, per_unit_s: float, unit: str, points: str) -> str:
    return f"calibrated tick: {milliseconds(fixed_s)} + {milliseconds(per_unit_s)} per {unit} (timed at {points})"


def capacity_line(capacity: int, active: int, slots: int, predicted_s: float, period_s: float, headroom: float) -> str:
    return (
        f"capacity: {plural(capacity, 'session')} of {slots} slots ({active} active), predicted tick at capacity "
        f"{milliseconds(predicted_s)} of {milliseconds(period_s)} (headroom {percent(headroom)})"
    )


# --- across replicas (Ray Serve: `interpreter/serve/cluster`) -----------------------------------------

CLOSE_REPLICA_LOST = 1014
"""RFC 6455 "bad gateway": the Serve proxy relayed the session to a replica that stopped; the session is lost."""
REPLICA_LOST = "replica-lost"
"""Why a session ended when the replica holding it stopped (a client-side code, never an error frame's)."""
REPLICA_HEADER = "x-duplexcadence-replica"
"""The header of a replica's websocket accept that names it (the proxy passes it to the client)."""


def replica_lost(replica: str | None) -> str:
    """The close reason the proxy sends when the replica of a session stops."""
    name = f"replica {replica}" if replica else "the replica"
    return f"{name} stopped; this session's state was on it and is lost"


def connection_lost(replica: str | None, code: int | None) -> str:
    """A session whose connection ended without the server closing it (no close frame, or another code)."""
    name = f"replica {replica}" if replica else "the server"
    how = "without a close frame" if code is None else f"with code {code}"
    return f"the connection to {name} ended {how}; this session's state was there and is lost"


def replica_not_serving(replica: str) -> str:
    return f"replica {replica} is not serving (it stopped, or has not started yet)"


def replicas_not_serving(found: int, wanted: int, timeout_s: float) -> str:
    return (
        f"{found} of {wanted} replicas serve after {timeout_s:g} s (the replicas' logs are in the Ray session's logs)"
    )


def replicas_failed(reason: str) -> str:
    return f"the replicas did not start: {reason}"


def proxy_port_taken(host: str, port: int, tries: int | None = None) -> str:
    """`tries`: how many free ports were tried (port 0), the last being `port`."""
    if tries is not None:
        return f"the Serve proxy could not bind a free port on {host}: each of {tries} was taken first (last {port})"
    return f"the Serve proxy cannot listen on {host}:{port}: the port is in use (another port, or 0 for a free one)"


def no_free_port(host: str, low: int, high: int) -> str:
    return f"no free port on {host} from {low} to {high - 1} for the Serve proxy"


def proxy_cannot_bind(host: str, port: int, reason: str, code: int | None) -> str:
    """`reason`: the OSError's text; `code`: its errno."""
    hint = {
        errno.EADDRNOTAVAIL: f" ({host} is not an address of this machine)",
        errno.EACCES: " (a port below 1024 needs privileges: another port, or 0 for a free one)",
    }.get(code or 0, "")
    return f"the Serve proxy cannot listen on {host}:{port}: {reason}{hint}"


def serve_already_running(running: int, asked: int) -> str:
    return (
        f"Serve already runs on this Ray cluster with its proxies on port {running}, not {asked}: give port "
        f"{running} (or 0), or stop that Serve first (serve shutdown)"
    )


def lanes_over_slots(lanes: int, slots: int) -> str:
    return f"--lanes {lanes} is more than --slots {slots}: a lane needs a slot"


def clock_problem(target: str, problem: str) -> str:
    """A `.clock` file's first problem (its diagnostic's message), naming the file `target`."""
    return f"{target}: {problem}"


def header_timeout(seconds: float) -> str:
    return f"a connection sent no complete request headers within {seconds:g} s: cut"


def repeats_held(count: int, interval_s: float) -> str:
    return f"{count} more like it in the last {interval_s:g} s not logged"


def serve_error(message: str) -> str:
    """A `dsl serve` failure that is not the command line's fault, on stderr."""
    return f"dsl serve: error: {message}"
