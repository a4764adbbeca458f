"""DuplexCadence: declare a streaming model's native clocks once; get demand-sized state at stable
addresses and exact-shape CUDA-graph replay, bit-identical to stock eager streaming.

The public API is the names in ``__all__``, importable from ``duplexcadence`` itself::

    import duplexcadence as dc

    result = dc.check_file("tail.clock")            # every diagnostic, never raises for a bad file
    plan = dc.plan_file("tail.clock", {"B": "2"})   # clocks, warm-up, memory per region, graphs
    runtime = dc.Runtime.load("tail.clock", model)  # torch: the arena, binding, graph capture
    session = runtime.session()
    pcm = session.step(codes=codes)

- the language: ``check_file`` (a ``CheckResult``), ``load_program`` (a checked ``Program``, or
  ``ClockError``);
- plans: ``plan_file``, ``make_plan`` (a ``Plan``; no torch);
- the runtime: ``Runtime``, ``Session``, ``LockstepGroup``, ``verify`` (a ``VerifyReport``);
- the conversation engine: ``load_engine`` (an ``Engine`` by model name), ``UnitInput``, ``Decision``,
  ``UnitOutput``, ``ConversationRefused``, ``ConversationError``;
- the errors: ``ClockError`` (located diagnostics), ``StepError`` (a step refused before anything
  changed), ``SessionFailed`` and ``SessionsFailed`` (a stage raised), ``LockstepError``.

The runtime's names import torch on first use (PEP 562), so ``import duplexcadence`` and the
language commands (``dsl check``, ``dsl fmt``, ``dsl plan``) start without it. The subpackages:
``duplexcadence.dsl`` (the ``.clock`` language), ``duplexcadence.interpreter`` (plans, views, the
runtime, the benchmark harness and the ``dsl`` command line).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it; imported on first attribute access.
_EXPORTS = {
    "CheckResult": "duplexcadence.dsl.frontend",
    "check_file": "duplexcadence.dsl.frontend",
    "load_program": "duplexcadence.dsl.frontend",
    "Program": "duplexcadence.dsl.program",
    "ClockError": "duplexcadence.dsl.diagnostics",
    "Plan": "duplexcadence.interpreter.plans.plan",
    "make_plan": "duplexcadence.interpreter.plans.plan",
    "plan_file": "duplexcadence.interpreter.plans.plan",
    "Runtime": "duplexcadence.interpreter.runtime.runtime",
    "Session": "duplexcadence.interpreter.runtime.session",
    "StepError": "duplexcadence.interpreter.runtime.errors",
    "SessionFailed": "duplexcadence.interpreter.runtime.errors",
    "SessionsFailed": "duplexcadence.interpreter.runtime.errors",
    "LockstepGroup": "duplexcadence.interpreter.runtime.lockstep",
    "LockstepError": "duplexcadence.interpreter.runtime.lockstep",
    "verify": "duplexcadence.interpreter.runtime.verify",
    "load_engine": "duplexcadence.interpreter.engine.registry",
    "Engine": "duplexcadence.interpreter.engine.engine",
    "UnitInput": "duplexcadence.interpreter.engine.api",
    "UnitOutput": "duplexcadence.interpreter.engine.api",
    "Decision": "duplexcadence.interpreter.engine.api",
    "ConversationRefused": "duplexcadence.interpreter.engine.api",
    "ConversationError": "duplexcadence.interpreter.engine.api",
    "VerifyReport": "duplexcadence.interpreter.runtime.verify",
}

__all__ = [
    "CheckResult",
    "ClockError",
    "ConversationError",
    "ConversationRefused",
    "Decision",
    "Engine",
    "LockstepError",
    "LockstepGroup",
    "Plan",
    "Program",
    "Runtime",
    "Session",
    "SessionFailed",
    "SessionsFailed",
    "StepError",
    "UnitInput",
    "UnitOutput",
    "VerifyReport",
    "__version__",
    "check_file",
    "load_engine",
    "load_program",
    "make_plan",
    "plan_file",
    "verify",
]

if TYPE_CHECKING:
    from duplexcadence.dsl.diagnostics import ClockError
    from duplexcadence.dsl.frontend import CheckResult, check_file, load_program
    from duplexcadence.dsl.program import Program
    from duplexcadence.interpreter.engine.api import (
        ConversationError,
        ConversationRefused,
        Decision,
        UnitInput,
        UnitOutput,
    )
    from duplexcadence.interpreter.engine.engine import Engine
    from duplexcadence.interpreter.engine.registry import load_engine
    from duplexcadence.interpreter.plans.plan import Plan, make_plan, plan_file
    from duplexcadence.interpreter.runtime.errors import SessionFailed, SessionsFailed, StepError
    from duplexcadence.interpreter.runtime.lockstep import LockstepError, LockstepGroup
    from duplexcadence.interpreter.runtime.runtime import Runtime
    from duplexcadence.interpreter.runtime.session import Session
    from duplexcadence.interpreter.runtime.verify import VerifyReport, verify


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'duplexcadence' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
