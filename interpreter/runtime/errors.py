"""The runtime's exceptions and its warning (each has a section in docs/reliability.md).

Public: `StepError`, `SessionFailed`, `SessionsFailed`, `CaptureWarning`.
"""

from __future__ import annotations

from typing import Any


class StepError(ValueError):
    """A `step()` call with bad inputs; the session's state is exactly as before the call."""


class SessionFailed(RuntimeError):
    """A stage raised during a step: the session refuses further steps until `reset()`."""


class SessionsFailed(SessionFailed):
    """`Runtime.step_many`: one or more sessions failed at their instant, the others completed it.

    `outputs` maps each completed session to its outputs; `failures` each failed session to its
    `SessionFailed` (that session refuses further steps until `reset()`)."""

    def __init__(self, message: str, outputs: dict[Any, Any], failures: dict[Any, SessionFailed]):
        super().__init__(message)
        self.outputs = outputs
        self.failures = failures


class CaptureWarning(UserWarning):
    """A stage could not be captured into a CUDA graph and runs eagerly."""
