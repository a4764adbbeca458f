"""`dsl bench MODULE:FUNCTION`: a bench subject of the user's own, found from the current folder, gets
the command's options as keywords; a name that is neither registered nor MODULE:FUNCTION is a usage
error with the registered names."""

from __future__ import annotations

import statistics
import sys

import attrs
import pytest
import torch

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli import main as cli

TOY = tails.get("toy")

SUBJECT = """
from duplexcadence.tails import toy

received = {}


def subject(**options):
    received.update(options)
    made = toy.subject(**options)
    made.name = "my tail"
    return made
"""


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # dsl bench puts the current folder on the path
    (tmp_path / "my_bench.py").write_text(SUBJECT)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the toy's tiny ops spin with two threads on a busy 2-core machine
    yield tmp_path
    torch.set_num_threads(threads)
    sys.modules.pop("my_bench", None)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_subject_of_ones_own_runs_from_the_current_folder(user_folder, capsys):
    code, out, err = run(
        capsys,
        "bench",
        "my_bench:subject",
        "--device",
        "cpu",
        "--seconds",
        "1",
        "--no-progress",
        "--option",
        "flavour=plain",
    )
    assert code == 0, err
    assert out.startswith("my tail on cpu:")
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.startswith("  stock") or line.startswith("  duplexcadence")
    }
    assert rows["duplexcadence"].rstrip().endswith("yes") and rows["stock"].rstrip().endswith("yes")
    received = sys.modules["my_bench"].received
    assert received["device"] == "cpu" and received["seconds"] == 1 and received["flavour"] == "plain"
    assert received["batch"] == 1 and received["dtype"] == "fp32"


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        ("nosuch", f"'nosuch' is neither a registered tail ({', '.join(tails.available())}) nor MODULE:FUNCTION"),
        ("my_bench:missing", "'my_bench' has no function 'missing'"),
        ("not_a_module_here:subject", "cannot import 'not_a_module_here'"),
    ],
)
def test_an_unknown_subject_is_a_usage_error(user_folder, capsys, tail, message):
    code, out, err = run(capsys, "bench", tail, "--device", "cpu")
    assert code == 2 and out == ""
    assert err.startswith(f"dsl bench: error: {message}")


def test_a_variant_not_meant_to_be_identical_reports_its_difference(user_folder):
    """compare=False with `difference`: no bit-identity verdict, the largest difference in `info`."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    reference = next(v for v in made.variants if v.reference)

    class Shifted:
        def __init__(self):
            self.inner = reference.make()

        def reset(self):
            self.inner.reset()

        def step(self, **inputs):
            result = self.inner.step(**inputs)
            result = result if isinstance(result, dict) else {"output": result}
            return {name: value + 0.25 for name, value in result.items()}

    made.variants = [
        reference,
        bench.Variant(
            "shifted",
            Shifted,
            compare=False,
            difference=lambda tick, expected, found: max(
                (found[name] - expected[name]).abs().max().item() for name in expected
            ),
        ),
    ]
    results = bench.run(made, 3, progress=False)
    assert results[1].bit_identical is None
    assert results[1].info["max_abs_diff_vs_reference"] == pytest.approx(0.25)
    assert "max abs difference from stock" in bench.format_table(made, results)


def test_an_option_the_subject_refuses_is_a_usage_error_before_anything_runs(user_folder, capsys):
    pytest.importorskip("moshi")
    code, out, err = run(capsys, "bench", "personaplex", "--device", "cpu", "--batch", "2", "--option", "lockstep=1")
    assert code == 2 and out == ""
    assert err == (
        "dsl bench: error: personaplex: --option lockstep=1 decodes the two instances of one batch-1 stream as "
        "one B=2 session: run it with --batch 1, not 2\n"
    )


def logged(variant, calls: list[str]):
    """`variant`, its steps appended by name to `calls`."""

    def make():
        runner = variant.make()
        step = runner.step

        def logged_step(**inputs):
            calls.append(variant.name)
            return step(**inputs)

        runner.step = logged_step
        return runner

    return attrs.evolve(variant, make=make)


@pytest.mark.slow
def test_interleave_times_every_variant_again_stepped_in_turn(user_folder, capsys):
    """`--interleave`: after the sequential pass, every variant that ran is built again and they are stepped
    in turn, tick by tick, the order rotating by one each tick; each gets a second set of timings."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    calls: list[str] = []
    made.variants = [logged(v, calls) for v in made.variants]
    names = [v.name for v in made.variants]
    ticks = 4
    results = bench.run(made, ticks, progress=False, interleave=True)
    assert calls[: len(names) * ticks] == [name for name in names for _ in range(ticks)]  # the sequential pass
    rotated = [names[(tick + i) % len(names)] for tick in range(ticks) for i in range(len(names))]
    assert calls[len(names) * ticks :] == rotated  # then in turn, starting one further each tick
    for result in results:
        timed = result.info["interleaved"]
        assert timed["ms_per_s_median"] > 0 and timed["tick_ms_median"] > 0
        assert timed["ms_per_s_p90"] >= timed["ms_per_s_median"]
    table = bench.format_table(made, results)
    assert "timed again, every variant built at once and stepped in turn each tick:" in table

    code, out, err = run(
        capsys, "bench", "my_bench:subject", "--device", "cpu", "--seconds", "1", "--no-progress", "--interleave"
    )
    assert code == 0, err
    assert "stepped in turn each tick:" in out


def test_without_interleave_there_is_no_second_timing(user_folder):
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    results = bench.run(made, 3, progress=False)
    assert all("interleaved" not in r.info for r in results)
    assert all(r.host_ms_median > 0 for r in results)  # on CPU a tick is host time only
    assert all(r.host_ms_median <= r.tick_ms_median for r in results)  # each tick: host time, then the sync
    assert "host ms/frame" in bench.format_table(made, results)
    assert "stepped in turn" not in bench.format_table(made, results)


def test_a_failed_interleaved_pass_keeps_the_sequential_results(user_folder):
    """The interleaved pass builds every variant again, all at once: if that fails (out of memory, a
    variant that cannot be built twice), the sequential results stand and the table says why."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    builds = []
    cadence = next(v for v in made.variants if v.name == "duplexcadence")

    def make_once():
        builds.append(1)
        if len(builds) > 1:
            raise RuntimeError("CUDA out of memory (made up)")
        return cadence.make()

    made.variants = [v if v is not cadence else attrs.evolve(cadence, make=make_once) for v in made.variants]
    results = bench.run(made, 3, progress=False, interleave=True)
    assert [r.error for r in results] == [None, None]
    assert all(r.ms_per_s_median > 0 and r.bit_identical for r in results)
    assert all(r.info["interleaved"] == {"error": "RuntimeError: CUDA out of memory (made up)"} for r in results)
    table = bench.format_table(made, results)
    assert "  the interleaved pass FAILED: RuntimeError: CUDA out of memory (made up)" in table.splitlines()
    assert "stepped in turn" not in table


@pytest.fixture
def profiled(monkeypatch):
    """The GPU busy profile on CPU: `kernel_busy` records which variant it profiled and from which tick (each
    profiled tick is still stepped), and returns a made-up busy time that names the variant."""
    from duplexcadence.interpreter.bench import BusyProfile
    from duplexcadence.interpreter.bench import profile as profiling

    profiles: list[tuple[str, int, int]] = []

    def fake_busy(runner, subject, first, count, trace_path=None):
        for tick in range(first, first + count):
            runner.step(**subject.inputs(tick))
        profiles.append((runner.name, first, count))
        return BusyProfile(float(len(profiles)), 0.5)

    monkeypatch.setattr(profiling, "kernel_time_measurable", lambda device: True)
    monkeypatch.setattr(profiling, "kernel_busy", fake_busy)
    return profiles


def named(variant):
    def make():
        runner = variant.make()
        runner.name = variant.name
        return runner

    return attrs.evolve(variant, make=make)


def test_the_gpu_busy_profile_runs_after_every_timed_tick_on_a_fresh_build(user_folder, profiled):
    """A profiler with CUDA activity leaves CUPTI attached and slows every later launch, so no timed tick
    may follow it: each variant is built again after the sequential and interleaved passes, stepped to the
    last two seconds' ticks unprofiled, and those ticks are profiled."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=2)
    calls: list[str] = []
    made.variants = [logged(named(v), calls) for v in made.variants]
    names = [v.name for v in made.variants]
    ticks = int(made.ticks_per_second * 3)
    window = bench.profiled_ticks(made, ticks)
    assert window == int(made.ticks_per_second * 2) < ticks
    results = bench.run(made, ticks, progress=False, interleave=True)
    timed = 2 * len(names) * ticks  # the sequential pass, then the interleaved one
    assert calls[timed:] == [name for name in names for _ in range(ticks)]  # then a fresh full run each
    assert profiled == [(name, ticks - window, window) for name in names]
    assert [(r.gpu_busy_ms_per_s, r.busy_fraction) for r in results] == [(1.0, 0.5), (2.0, 0.5)]
    assert all(r.bit_identical and "busy_error" not in r.info for r in results)


@pytest.mark.slow
def test_a_may_fail_variant_that_fails_its_profile_keeps_its_timings(user_folder, profiled):
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    cadence = next(v for v in made.variants if v.name == "duplexcadence")
    builds = []

    def make_once():
        builds.append(1)
        if len(builds) > 1:
            raise RuntimeError("cannot build twice (made up)")
        return cadence.make()

    made.variants = [
        named(v) if v is not cadence else attrs.evolve(cadence, make=make_once, may_fail=True) for v in made.variants
    ]
    results = bench.run(made, 4, progress=False)
    stock, ours = results
    assert stock.gpu_busy_ms_per_s == 1.0 and "busy_error" not in stock.info
    assert ours.error is None and ours.ms_per_s_median > 0 and ours.bit_identical
    assert ours.gpu_busy_ms_per_s is None
    assert ours.info["busy_error"] == "RuntimeError: cannot build twice (made up)"
    assert (
        "  duplexcadence: the GPU busy profile FAILED: RuntimeError: cannot build twice (made up)"
        in bench.format_table(made, results).splitlines()
    )

    made.variants = [attrs.evolve(v, may_fail=False) for v in made.variants]
    builds.clear()
    with pytest.raises(RuntimeError, match="cannot build twice"):
        bench.run(made, 4, progress=False)


def test_the_sm_clock_read_after_each_steady_tick_is_reported_beside_the_timings(user_folder, monkeypatch):
    """Where NVML reads the SM clock, its median over the steady ticks of each pass gets a column: the
    clock drifts with the GPU's boost state, and every kernel's time with it."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    readings = iter(range(1000, 2000))
    read = []

    def reader(device):
        def read_one():
            read.append(next(readings))
            return float(read[-1])

        return read_one

    from duplexcadence.interpreter.bench import passes

    monkeypatch.setattr(passes, "sm_clock_reader", reader)
    ticks = made.warmup_ticks + 5
    results = bench.run(made, ticks, progress=False, interleave=True)
    steady = ticks - made.warmup_ticks
    assert len(read) == 2 * len(results) * steady  # steady ticks only, sequential then interleaved
    first, second = results
    assert first.sm_clock_mhz_median == 1002.0 and second.sm_clock_mhz_median == 1007.0
    turns = [1010 + i for i in range(2 * steady)]  # in turn: tick t starts with variant t mod 2
    mine = [turns[2 * k + (made.warmup_ticks + k) % 2] for k in range(steady)]
    assert first.info["interleaved"]["sm_clock_mhz_median"] == statistics.median(mine)
    lines = bench.format_table(made, results).splitlines()
    assert (
        "SM MHz" in lines[1]
        and "SM MHz"
        in lines[lines.index("  timed again, every variant built at once and stepped in turn each tick:") + 1]
    )
    assert lines[3].split()[-4] == "1002"


def test_without_a_clock_reading_there_is_no_clock_column(user_folder):
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    assert bench.sm_clock_reader(made.device) is None
    results = bench.run(made, 3, progress=False, interleave=True)
    assert all(r.sm_clock_mhz_median is None for r in results)
    assert "SM MHz" not in bench.format_table(made, results)


def test_variants_chooses_and_orders_the_variants_after_the_reference(user_folder, capsys):
    code, out, err = run(
        capsys,
        "bench",
        "my_bench:subject",
        "--device",
        "cpu",
        "--seconds",
        "1",
        "--no-progress",
        "--variants",
        "duplexcadence",
    )
    assert code == 0, err
    rows = [line.split()[0] for line in out.splitlines()[3:]]
    assert rows == ["stock", "duplexcadence"]  # the reference stays, first

    code, out, err = run(capsys, "bench", "my_bench:subject", "--device", "cpu", "--variants", "duplexcadence,fast")
    assert code == 2 and out == ""
    assert err == (
        "dsl bench: error: my tail: --variants 'duplexcadence,fast': no variant named 'fast'; the variants are "
        "'stock eager', 'duplexcadence'\n"
    )


def test_variants_puts_them_in_the_order_given():
    from duplexcadence.interpreter import bench
    from duplexcadence.interpreter.cli import bench as bench_cli

    made = TOY.subject(device="cpu", seconds=1)
    extra = bench.Variant("another", made.variants[1].make)
    made.variants.append(extra)
    chosen = bench_cli.select_variants(made, "another, duplexcadence, another")
    assert [v.name for v in chosen] == ["stock eager", "another", "duplexcadence"]
    assert bench_cli.select_variants(made, " , ") == (
        "--variants ' , ': names no variant; the variants are 'stock eager', 'duplexcadence', 'another'"
    )


def test_variants_whose_names_hold_commas_are_selected_whole():
    """The shipped tails name variants like `duplexcadence, 2 lanes`: `--variants` splits at the commas
    that separate names, not at those inside one."""
    from duplexcadence.interpreter.cli.bench import split_variant_names

    known = ["stock eager", "duplexcadence", "duplexcadence, 2 lanes", "duplexcadence, other_mimi pruned"]
    assert split_variant_names("duplexcadence, other_mimi pruned", known) == (["duplexcadence, other_mimi pruned"], [])
    assert split_variant_names("duplexcadence,2 lanes,duplexcadence", known) == (
        ["duplexcadence, 2 lanes", "duplexcadence"],
        [],
    )
    assert split_variant_names("duplexcadence, 3 lanes", known) == (["duplexcadence"], ["3 lanes"])
    assert split_variant_names(" , ", known) == ([], [])


def test_variants_with_commas_on_the_command_line():
    from duplexcadence.examples.personaplex.bench import subject
    from duplexcadence.interpreter.cli import bench as bench_cli

    made = subject(device="cpu", seconds=1, batch=1)
    chosen = bench_cli.select_variants(made, "duplexcadence, other_mimi pruned,duplexcadence, 2 lanes")
    assert [v.name for v in chosen] == ["stock eager", "duplexcadence, other_mimi pruned", "duplexcadence, 2 lanes"]


def test_without_profile_run_leaves_the_busy_pass_to_a_later_profile_all(user_folder, profiled):
    """Several subjects timed in one process: each `run(..., profile=False)`, then `profile_all` for each
    once everything is timed, so no timed tick follows a profile."""
    from duplexcadence.interpreter import bench

    made = TOY.subject(device="cpu", seconds=1)
    made.variants = [named(v) for v in made.variants]
    ticks = 4
    results = bench.run(made, ticks, progress=False, profile=False)
    assert profiled == [] and all(r.gpu_busy_ms_per_s is None for r in results)
    results = bench.profile_all(made, results, ticks)
    assert [name for name, _, _ in profiled] == [v.name for v in made.variants]
    assert [r.gpu_busy_ms_per_s for r in results] == [1.0, 2.0]


def timed_twice(name: str, sequential: float, interleaved: float | None):
    from duplexcadence.interpreter import bench

    info = (
        {}
        if interleaved is None
        else {
            "interleaved": {
                "ms_per_s_median": interleaved,
                "ms_per_s_p90": interleaved,
                "ms_per_s_p99": interleaved,
                "tick_ms_median": interleaved / 12.5,
            }
        }
    )
    return bench.VariantResult(
        name,
        sequential,
        sequential,
        sequential,
        sequential / 12.5,
        None,
        None,
        None,
        None,
        None,
        0.0,
        True,
        None,
        250,
        info,
    )


def test_the_table_says_when_the_two_passes_rank_two_variants_in_opposite_orders():
    """A Moshi run on the GPU: the whole-step graph 18.7 against our 20.9 ms/s sequentially, 21.8 against
    21.3 interleaved. A flip inside the noise (under 3 % both ways) is not reported."""
    from duplexcadence.interpreter import bench

    results = [
        timed_twice("stock eager", 253.6, 232.7),
        timed_twice("moshi whole-step graph", 18.7, 21.8),
        timed_twice("duplexcadence", 20.9, 21.3),
        timed_twice("close call", 21.0, 21.25),
    ]
    found = bench.pass_disagreements(results)
    assert [(faster, other) for faster, other, _, _ in found] == [
        ("moshi whole-step graph", "duplexcadence"),
        ("moshi whole-step graph", "close call"),
    ]
    assert found[0][2:] == pytest.approx((18.7 / 20.9, 21.8 / 21.3))
    table = bench.format_table(TOY.subject(device="cpu", seconds=1), results).splitlines()
    assert [line for line in table if "disagree" in line] == [
        "  the passes disagree: moshi whole-step graph is 1.12x as fast as duplexcadence sequentially, 0.98x "
        "interleaved; the interleaved pass is the fairer (docs/benchmarks.md)",
        "  the passes disagree: moshi whole-step graph is 1.12x as fast as close call sequentially, 0.97x "
        "interleaved; the interleaved pass is the fairer (docs/benchmarks.md)",
    ]  # not close call vs ours: noise
    assert bench.pass_disagreements([timed_twice("a", 10.0, None), timed_twice("b", 12.0, None)]) == []


def test_the_command_s_default_compile_budget_is_the_bench_s():
    """`dsl bench --help` states the budget without importing the bench (and torch)."""
    from duplexcadence.interpreter import bench
    from duplexcadence.interpreter.cli import bench as bench_cli

    assert bench_cli.DEFAULT_COMPILE_BUDGET_S == bench.DEFAULT_COMPILE_BUDGET_S
