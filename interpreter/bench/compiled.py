"""torch.compile variants: the stock step under `torch.compile(mode="reduce-overhead")`, with what dynamo did.

Opt-in (`run(..., compile=True)`, `dsl bench TAIL --compile`): a subject's `compile_variants` are built with
`compiled_variant`, and report their compile time, compilations after the first call, graph breaks and
cudagraph skips. Such a variant may fail (it is run last, in a time budget): it is then reported as failed
with the reason instead of stopping the bench.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from duplexcadence.interpreter.bench.subject import Variant
from duplexcadence.interpreter.bench.timing import sync

COMPILE_MODE = "reduce-overhead"
DEFAULT_COMPILE_BUDGET_S = 150.0


def _dynamo_counts() -> dict:
    """The torch._dynamo counters this bench reports, as plain numbers (a snapshot)."""
    from torch._dynamo.utils import counters

    return {
        "frames": counters["frames"]["total"],
        "frames_ok": counters["frames"]["ok"],
        "graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": dict(counters["graph_break"]),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


class _WarningLog(logging.Handler):
    """Keeps the first warnings torch._dynamo / torch._inductor log (recompile limit hit, cudagraph skips...)."""

    def __init__(self, keep: int = 8):
        super().__init__(logging.WARNING)
        self.keep = keep
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < self.keep:
            with contextlib.suppress(Exception):
                self.messages.append(record.getMessage().strip().splitlines()[0][:300])


def _clone_outputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Mapping):
        return {k: _clone_outputs(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone_outputs(v) for v in value)
    return value


def _compile_step(runner: Any, compile_fn: Callable) -> Callable[[], None]:
    """Default `install`: compile the runner's whole `step`; returns the undo."""
    runner.step = compile_fn(runner.step)
    return lambda: vars(runner).pop("step", None)


class CompiledRunner:
    """A bench runner whose stock step runs under torch.compile(mode="reduce-overhead").

    `install(runner, compile_fn)` puts compiled code where the runner's step will call it and
    returns an undo (or None); `dynamo_config` is patched around every call (e.g.
    `allow_unspec_int_on_nn_module`). Every call starts a cudagraph-trees step and clones its outputs
    (reduce-overhead overwrites them on the next replay). Per call, torch._dynamo's counters are
    read: compilations during the first call, compilations after it (recompiles, or frames first
    reached later), graph breaks with their reasons, cudagraph skips, and the time of the calls
    that compiled.
    """

    def __init__(
        self,
        runner: Any,
        install: Callable[[Any, Callable], Any] | None = None,
        dynamo_config: Mapping[str, Any] | None = None,
        compile_options: Mapping[str, Any] | None = None,
        note: str = "",
    ):
        self.runner = runner
        self.dynamo_config = dict(dynamo_config or {})
        self.compile_options = dict(compile_options or {})
        self.note = note
        self.calls = 0
        self.first_call_s: float | None = None
        self.compiling_calls_s = 0.0
        self.compiling_ticks: list[int] = []
        self.first_call_compilations = 0
        self.recompilations = 0
        self.failed_frames = 0
        self.graphs = 0
        self.graph_breaks = 0
        self.break_reasons: dict[str, int] = {}
        self.cudagraph_skips = 0
        self.suppress_errors: bool | None = None
        self.warnings = _WarningLog()
        for name in ("torch._dynamo", "torch._inductor"):
            logging.getLogger(name).addHandler(self.warnings)

        def compile_fn(function):
            return torch.compile(function, mode=COMPILE_MODE, **self.compile_options)

        self._undo = (install or _compile_step)(runner, compile_fn)

    def reset(self) -> None:
        self.runner.reset()

    def step(self, **inputs):
        before = _dynamo_counts()
        if self.suppress_errors is None:
            self.suppress_errors = bool(torch._dynamo.config.suppress_errors)
        torch.compiler.cudagraph_mark_step_begin()
        begin = time.perf_counter()
        with torch._dynamo.config.patch(**self.dynamo_config):
            output = self.runner.step(**inputs)
        output = _clone_outputs(output)
        sync(output_device(output))
        seconds = time.perf_counter() - begin
        after = _dynamo_counts()
        compiled = after["frames"] - before["frames"]
        if self.calls == 0:
            self.first_call_s = seconds
            self.first_call_compilations = compiled
        else:
            self.recompilations += compiled
        if compiled:
            self.compiling_calls_s += seconds
            if len(self.compiling_ticks) < 32:
                self.compiling_ticks.append(self.calls)
        self.failed_frames += compiled - (after["frames_ok"] - before["frames_ok"])
        self.graphs += after["graphs"] - before["graphs"]
        self.cudagraph_skips += after["cudagraph_skips"] - before["cudagraph_skips"]
        for reason, count in after["graph_breaks"].items():
            added = count - before["graph_breaks"].get(reason, 0)
            if added:
                self.graph_breaks += added
                key = str(reason)[:200]
                self.break_reasons[key] = self.break_reasons.get(key, 0) + added
        self.calls += 1
        return output

    def stats(self) -> dict:
        return {
            "mode": COMPILE_MODE,
            "compile_options": self.compile_options,
            "dynamo_config": self.dynamo_config,
            "note": self.note,
            "calls": self.calls,
            "first_call_seconds": self.first_call_s,
            "compiling_calls_seconds": self.compiling_calls_s,
            "compiling_ticks": self.compiling_ticks,
            "compilations_first_call": self.first_call_compilations,
            "recompilations": self.recompilations,
            "frames_failed": self.failed_frames,
            "graphs": self.graphs,
            "graph_breaks": self.graph_breaks,
            "graph_break_reasons": dict(sorted(self.break_reasons.items(), key=lambda kv: -kv[1])[:8]),
            "cudagraph_skips": self.cudagraph_skips,
            "suppress_errors": self.suppress_errors,
            "warnings": list(self.warnings.messages),
        }

    def close(self) -> None:
        for name in ("torch._dynamo", "torch._inductor"):
            logging.getLogger(name).removeHandler(self.warnings)
        if callable(self._undo):
            self._undo()
        self._undo = None
        close = getattr(self.runner, "close", None)
        if callable(close):
            close()


def output_device(value: Any) -> torch.device:
    if isinstance(value, torch.Tensor):
        return value.device
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        device = output_device(item)
        if device.type != "cpu":
            return device
    return torch.device("cpu")


def compiled_variant(
    name: str,
    make: Callable[[], Any],
    *,
    install: Callable[[Any, Callable], Any] | None = None,
    dynamo_config: Mapping[str, Any] | None = None,
    compile_options: Mapping[str, Any] | None = None,
    note: str = "",
    budget_s: float | None = DEFAULT_COMPILE_BUDGET_S,
) -> Variant:
    """A compile variant: `make()` builds the stock runner, `install` compiles (default: its whole
    step). Compared with stock eager like every variant; may fail (reported, not raised)."""
    return Variant(
        name,
        lambda: CompiledRunner(make(), install, dynamo_config, compile_options, note),
        info=lambda runner: {"compile": runner.stats()},
        may_fail=True,
        budget_s=budget_s,
    )


def compile_summary(stats: Mapping[str, Any]) -> str:
    first = stats.get("first_call_seconds")
    parts = [
        f"torch.compile({stats.get('mode')!r}"
        + "".join(f", {k}={v!r}" for k, v in (stats.get("compile_options") or {}).items())
        + ")"
    ]
    if stats.get("dynamo_config"):
        parts.append("dynamo " + ", ".join(f"{k}={v!r}" for k, v in stats["dynamo_config"].items()))
    parts.append(
        "first call "
        + ("-" if first is None else f"{first:.1f} s")
        + f", calls that compiled {stats.get('compiling_calls_seconds', 0):.1f} s"
    )
    parts.append(
        f"{stats.get('compilations_first_call', 0)} compilations in the first call, "
        f"{stats.get('recompilations', 0)} after it, {stats.get('graph_breaks', 0)} graph breaks, "
        f"{stats.get('cudagraph_skips', 0)} cudagraph skips"
    )
    if stats.get("frames_failed"):
        parts.append(f"{stats['frames_failed']} frames failed to compile (ran eagerly)")
    if stats.get("suppress_errors"):
        parts.append("torch._dynamo.config.suppress_errors was on")
    for message in stats.get("warnings", [])[:3]:
        parts.append(f"warning: {message}")
    return "; ".join(parts)
