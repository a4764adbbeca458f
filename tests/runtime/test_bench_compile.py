"""`dsl bench --compile` plumbing on the CPU, without compiling anything (inductor on CPU is too slow
for the tests): the option adds the subject's compile variants last, a compile variant that fails or
runs out of its budget is reported as failed (table and JSON) instead of stopping the bench, a
variant's compile statistics reach the JSON, and every variant carries its per-second series."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from duplexcadence.interpreter.cli import main as cli

SUBJECT = """
import time

from duplexcadence.interpreter.bench import CompiledRunner, Variant, compiled_variant
from duplexcadence.tails import toy


def _broken(runner, compile_fn):
    raise RuntimeError("inductor said no")


def _not_compiled(runner, compile_fn):
    return None  # the step stays as it is: counters and the plumbing, no compilation


class _Slow:
    def __init__(self, runner):
        self.runner = runner

    def reset(self):
        self.runner.reset()

    def step(self, **inputs):
        time.sleep(0.05)
        return self.runner.step(**inputs)


def subject(**options):
    made = toy.subject(**options)
    stock = next(v for v in made.variants if v.reference)
    made.compile_variants = [
        compiled_variant("broken compile", stock.make, install=_broken),
        compiled_variant("plumbing only", stock.make, install=_not_compiled),
        compiled_variant("slow compile", lambda: _Slow(stock.make()), install=_not_compiled, budget_s=0.3),
    ]
    return made
"""


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "compile_bench.py").write_text(SUBJECT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)
    sys.modules.pop("compile_bench", None)


def bench(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["bench", "compile_bench:subject", "--device", "cpu", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_without_compile_no_compile_variant_runs(user_folder, capsys):
    code, _out, err = bench(capsys, "--seconds", "2", "--json", "plain.json")
    assert code == 0, err
    names = [v["name"] for v in json.loads((user_folder / "plain.json").read_text())["variants"]]
    assert names == ["stock eager", "duplexcadence"]


@pytest.mark.slow
def test_compile_variants_run_last_and_failures_are_reported(user_folder, capsys):
    code, out, err = bench(capsys, "--seconds", "3", "--compile", "--json", "compiled.json")
    assert code == 0, err  # a failed compile variant does not fail the bench
    variants = {v["name"]: v for v in json.loads((user_folder / "compiled.json").read_text())["variants"]}
    assert list(variants) == ["stock eager", "duplexcadence", "broken compile", "plumbing only", "slow compile"]

    broken = variants["broken compile"]
    assert broken["error"] == "RuntimeError: inductor said no"
    assert broken["ms_per_s_median"] is None and broken["bit_identical"] is None
    assert "broken compile: FAILED: RuntimeError: inductor said no" in out
    assert any(line.split()[:3] == ["broken", "compile", "FAILED"] for line in out.splitlines())

    slow = variants["slow compile"]
    assert slow["error"] == "VariantBudgetExceeded: variant 'slow compile' exceeded its budget of 0.3 s"

    plumbing = variants["plumbing only"]
    assert plumbing["error"] is None and plumbing["bit_identical"] is True  # compared like every variant
    stats = plumbing["info"]["compile"]
    assert stats["mode"] == "reduce-overhead" and stats["calls"] >= 37
    assert stats["recompilations"] == 0 and stats["graph_breaks"] == 0 and stats["first_call_seconds"] > 0
    assert "plumbing only: torch.compile('reduce-overhead')" in out


@pytest.mark.slow
def test_compile_budget_option_overrides_each_variants_budget(user_folder, capsys):
    code, _out, err = bench(capsys, "--seconds", "2", "--compile", "--compile-budget", "100", "--json", "b.json")
    assert code == 0, err
    variants = {v["name"]: v for v in json.loads((user_folder / "b.json").read_text())["variants"]}
    assert variants["slow compile"]["error"] is None  # 100 s instead of its own 0.3 s


def test_every_variant_has_its_per_second_series(user_folder, capsys):
    code, _out, err = bench(capsys, "--seconds", "4", "--json", "series.json")
    assert code == 0, err
    for variant in json.loads((user_folder / "series.json").read_text())["variants"]:
        assert len(variant["per_second_ms"]) == 4  # 12.5 ticks a second: 50 ticks, 4 whole seconds
        assert variant["warmup_seconds"] == 2  # the toy's 25 warm-up ticks lie in seconds 0 and 1
        assert all(ms > 0 for ms in variant["per_second_ms"])
        assert variant["memory"] is None  # measured on CUDA only


def test_a_budget_interrupts_a_running_variant():
    from duplexcadence.interpreter.bench import VariantBudgetExceeded, time_budget

    started = time.perf_counter()
    with pytest.raises(VariantBudgetExceeded), time_budget(0.1, "waiting"):
        while time.perf_counter() - started < 5:
            pass
    assert time.perf_counter() - started < 2


def test_a_budget_passes_other_finalisers_errors_to_the_unraisable_hook_and_restores_it():
    """Only the budget's own exception, dropped in a finaliser, is kept from the unraisable hook (the alarm
    repeats); any other goes to the hook that was there, which is back when the budget ends."""
    from duplexcadence.interpreter.bench import time_budget

    seen: list[str] = []

    def hook(report) -> None:
        seen.append(f"{type(report.exc_value).__name__}: {report.exc_value}")

    class FailsToFinalise:
        def __del__(self):
            raise ValueError("a finaliser failed")

    previous = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        with time_budget(30, "waiting"):
            FailsToFinalise()  # dropped at once: its __del__ raises
        assert sys.unraisablehook is hook
    finally:
        sys.unraisablehook = previous
    assert seen == ["ValueError: a finaliser failed"]


def test_a_budget_that_runs_out_inside_a_finaliser_still_stops_the_variant():
    """Python drops an exception raised in a `__del__` (run by `gc.collect()`, which the harness calls
    first): the alarm repeats, so the budget still ends the variant."""
    import gc

    from duplexcadence.interpreter.bench import VariantBudgetExceeded, time_budget

    class SlowToFinalise:
        def __init__(self):
            self.cycle = self

        def __del__(self):
            time.sleep(0.3)

    SlowToFinalise()
    with pytest.raises(VariantBudgetExceeded, match=r"exceeded its budget of 0\.1 s"), time_budget(0.1, "waiting"):
        gc.collect()
        time.sleep(2)
