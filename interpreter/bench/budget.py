"""A wall-clock budget for a variant that may fail (a torch.compile run), and what a failed variant reports."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Iterator

import torch

from duplexcadence.interpreter.bench.subject import Variant, VariantResult

ERROR_TEXT_LIMIT = 600


class VariantBudgetExceeded(Exception):
    pass


@contextlib.contextmanager
def time_budget(seconds: float | None, what: str, error: type[BaseException] = VariantBudgetExceeded) -> Iterator[None]:
    """Raise `error` in the main thread after `seconds` (no limit elsewhere or without one)."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    leaving = False
    reporting = False  # inside the previous unraisable hook: an alarm there would break the hook itself
    message = f"{what} exceeded its budget of {seconds:g} s"

    def expire(signum, frame):
        if not leaving and not reporting:
            raise error(message)

    def unraisable(report: sys.UnraisableHookArgs) -> None:
        nonlocal reporting
        if isinstance(report.exc_value, error) and str(report.exc_value) == message:
            return  # raised inside a finaliser and dropped by Python: the next alarm gets out
        reporting = True
        try:
            previous_hook(report)
        finally:
            reporting = False

    previous = signal.signal(signal.SIGALRM, expire)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = unraisable
    # The alarm repeats every 50 ms after the budget: one raised inside a finaliser (a `__del__` run by
    # `gc.collect()`, a weakref callback) is dropped by Python, and the next one gets out.
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        leaving = True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if sys.unraisablehook is unraisable:
            sys.unraisablehook = previous_hook


def error_text(error: BaseException) -> str:
    """`Type: message`, cut to `ERROR_TEXT_LIMIT` characters, for a table line or the JSON."""
    return f"{type(error).__name__}: {error}".strip()[:ERROR_TEXT_LIMIT]


def failed_result(variant: Variant, error: BaseException, ticks_done: int = 0) -> VariantResult:
    text = f"{type(error).__name__}: {error}".strip()
    if len(text) > ERROR_TEXT_LIMIT:
        text = text[:ERROR_TEXT_LIMIT] + " ..."
    return VariantResult(
        variant.name, None, None, None, None, None, None, None, None, None, 0.0, None, None, ticks_done, {}, error=text
    )


def recover(device: torch.device) -> None:
    """Free what a failed variant left behind, so the variants after it start clean."""
    gc.collect()
    if device.type == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
