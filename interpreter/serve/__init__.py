"""Serving: one tail's duplex sessions at the cadence on one device (`duplexcadence.interpreter.serve`).

    from duplexcadence.interpreter.serve import PoolConfig, SessionPool, make_app, served_tail

    pool = SessionPool(served_tail("moshi", device="cuda"), PoolConfig(slots=20, lanes=4, lockstep=32))
    app = make_app(pool)              # Starlette: /v1/session (websocket), /v1/capacity, /healthz, /metrics

- the scheduler core (`scheduler.py`): `Scheduler` (rounds through a `RoundRunner` on one device thread,
  admission, drain, shut_down, the idle reaper, metrics), `Client`, `Round`, `RoundOutcome`, `TickError`;
- the pool (`pool.py`): `SessionPool`, the scheduler of a tail's sessions (start, open, open_bundle, capacity,
  drain, drained, deadlines, stop, run_on_device), `PooledSession` (submit, step, reset, close, abort, stats),
  `PoolConfig`; `Bundle` (`bundle.py`);
- admission (`admission.py`): `TickModel`, `Capacity`, `AdmissionRefused`, `AdmissionRule`;
- what is served (`tail.py`): `ServedTail`, `LoadedTail`, `served_tail`, `SeededStock`;
- the protocol (`codec.py`, `messages.py`): `encode`, `decode`, `Frame`, `FrameError`, error and close codes;
- the front (`app.py`, `server.py`, `access.py`): `make_app`, `FrontLimits`, `AccessPolicy`, `ServerThread`,
  `ConnectionLimits`; the client (`client.py`): `SessionClient`,
  `ServerError`, `Refused`; the load generator (`loadgen.py`): `run_load`, `verify`, `LoadReport`.

Names are imported on first use (PEP 562): the pool needs torch and prometheus-client, the front Starlette
and uvicorn, the client websockets (`pip install "duplexcadence[serve]"`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SessionPool": "pool",
    "PooledSession": "pool",
    "PoolConfig": "pool",
    "Bundle": "bundle",
    "Scheduler": "scheduler",
    "Client": "scheduler",
    "Round": "scheduler",
    "RoundOutcome": "scheduler",
    "RoundRunner": "scheduler",
    "SessionClosed": "scheduler",
    "DeadlineReport": "deadlines",
    "SessionStats": "deadlines",
    "TickError": "scheduler",
    "TensorSpec": "modes",
    "TickModel": "admission",
    "Capacity": "admission",
    "AdmissionRefused": "admission",
    "AdmissionRule": "admission",
    "ServedTail": "tail",
    "LoadedTail": "tail",
    "served_tail": "tail",
    "SeededStock": "tail",
    "ServeSetupError": "tail",
    "encode": "codec",
    "decode": "codec",
    "Frame": "codec",
    "FrameError": "codec",
    "make_app": "app",
    "FrontLimits": "app",
    "AccessPolicy": "access",
    "ServerThread": "server",
    "ConnectionLimits": "server",
    "SessionClient": "client",
    "ServerError": "client",
    "Refused": "client",
    "run_load": "loadgen",
    "verify": "loadgen",
    "LoadReport": "loadgen",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'duplexcadence.interpreter.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"duplexcadence.interpreter.serve.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
