"""`import duplexcadence` gives the documented names, each the object its module defines, and imports
torch only when a runtime name is first used."""

from __future__ import annotations

import importlib
import importlib.resources
import subprocess
import sys

import pytest

import duplexcadence

PUBLIC = [
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
DEFINED_IN = {
    "CheckResult": "duplexcadence.dsl.frontend",
    "check_file": "duplexcadence.dsl.frontend",
    "load_program": "duplexcadence.dsl.frontend",
    "Program": "duplexcadence.dsl.program",
    "ClockError": "duplexcadence.dsl.diagnostics",
    "Plan": "duplexcadence.interpreter.plans.plan",
    "make_plan": "duplexcadence.interpreter.plans.plan",
    "plan_file": "duplexcadence.interpreter.plans.plan",
    "Runtime": "duplexcadence.interpreter.runtime.runtime",
    "Session": "duplexcadence.interpreter.runtime.runtime",
    "StepError": "duplexcadence.interpreter.runtime.runtime",
    "SessionFailed": "duplexcadence.interpreter.runtime.runtime",
    "SessionsFailed": "duplexcadence.interpreter.runtime.runtime",
    "LockstepGroup": "duplexcadence.interpreter.runtime.lockstep",
    "LockstepError": "duplexcadence.interpreter.runtime.lockstep",
    "verify": "duplexcadence.interpreter.runtime.verify",
    "VerifyReport": "duplexcadence.interpreter.runtime.verify",
    "load_engine": "duplexcadence.interpreter.engine.registry",
    "Engine": "duplexcadence.interpreter.engine.engine",
    "UnitInput": "duplexcadence.interpreter.engine.api",
    "UnitOutput": "duplexcadence.interpreter.engine.api",
    "Decision": "duplexcadence.interpreter.engine.api",
    "ConversationRefused": "duplexcadence.interpreter.engine.api",
    "ConversationError": "duplexcadence.interpreter.engine.api",
}


def test_all_is_the_documented_list() -> None:
    assert duplexcadence.__all__ == PUBLIC
    assert set(dir(duplexcadence)) >= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(DEFINED_IN))
def test_each_name_is_the_object_its_module_defines(name: str) -> None:
    assert getattr(duplexcadence, name) is getattr(importlib.import_module(DEFINED_IN[name]), name)


def test_the_version_is_a_release_string() -> None:
    assert duplexcadence.__version__.count(".") == 2 and all(p.isdigit() for p in duplexcadence.__version__.split("."))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Runtim'"):
        duplexcadence.Runtim  # noqa: B018


def test_the_errors_are_exceptions_a_caller_can_catch() -> None:
    for name in ("ClockError", "StepError", "SessionFailed", "SessionsFailed", "LockstepError"):
        assert issubclass(getattr(duplexcadence, name), Exception), name
    assert issubclass(duplexcadence.SessionsFailed, duplexcadence.SessionFailed)


@pytest.mark.slow
def test_the_language_and_the_plans_load_without_torch_the_runtime_imports_it() -> None:
    code = (
        "import sys, duplexcadence as dc\n"
        "program = dc.load_program('stdlib/models/mimi_decoder.clock')\n"
        "plan = dc.make_plan(program)\n"
        "print(plan.trace.warmup_instants, 'torch' in sys.modules)\n"
        "dc.Runtime\n"
        "print('torch' in sys.modules)\n"
    )
    root = importlib.resources.files("duplexcadence")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(root))
    assert done.stdout.splitlines() == ["125 False", "True"], done.stderr
