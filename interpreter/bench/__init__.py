"""The bench: every variant of a tail side by side in one process, on one device, on the same inputs.

A *subject* (`Subject`) says how to build each way of running a tail (`Variant`: stock eager first, the
reference for bit-identity, then stock's own graphs, DuplexCadence...), the inputs of each tick, and how many
ticks make a duplex second. `run` measures every variant and returns a `VariantResult` each;
`format_table` prints them and `to_json` gives the JSON of docs/benchmarks/*.json (`dump` writes it).
`dsl bench TAIL` and `dsl bench MODULE:FUNCTION` are this API behind a command line.

What a run measures, per variant:

* ms per duplex second and ms per tick: per-tick wall time with a synchronisation around each tick,
  grouped into duplex seconds by the subject's `ticks_per_second` (12 or 13 Mimi frames a second);
  median, p90 and p99 over the seconds and over the ticks after the warm-up (`warmup_ticks`), and
  the host time of a steady tick (until `step` returns, before the synchronisation);
* GPU busy vs wall: kernel time from torch.profiler over the last two seconds of ticks, against their
  wall time, in a pass of its own after every timed pass (`profile_busy`, `profile_all`): a profiler
  with CUDA activity leaves CUPTI attached to the process, which slows every later launch;
* the SM clock (NVML) after each steady tick, where it can be read;
* peak memory allocated while the variant is built and run, split into weights, state and the rest
  (`memory_breakdown`), and the allocator's reserved high-water;
* bit-identity: every output of every tick `torch.equal` to stock eager's, under deterministic cuDNN.

Options of `run`: `interleave` times every variant again, all built at once and stepped in turn each
tick (`run_interleaved`); `compile` adds the subject's `compile_variants` (`compiled_variant`: the stock
step under torch.compile reduce-overhead, in a time budget, reported as failed rather than raised);
`trace_dir` writes each variant's profile as a Chrome trace, with a summary of its device operations.

A subject of your own::

    from duplexcadence.interpreter.bench import Subject, Variant, format_table, run

    subject = Subject("mine", Fraction(25, 2), lambda tick: {"codes": codes[:, tick : tick + 1]},
                      [Variant("stock eager", make_stock, reference=True), Variant("duplexcadence", make_ours)],
                      torch.device("cuda"), warmup_ticks=13, tick_name="frame")
    print(format_table(subject, run(subject, ticks=250)))

Each `make` returns an object with `reset()` and `step(**inputs)` (a `Session` of the runtime is one).
"""

from duplexcadence.interpreter.bench.budget import VariantBudgetExceeded, time_budget
from duplexcadence.interpreter.bench.compiled import (
    COMPILE_MODE,
    DEFAULT_COMPILE_BUDGET_S,
    CompiledRunner,
    compile_summary,
    compiled_variant,
)
from duplexcadence.interpreter.bench.memory import cublas_workspace_bytes, fresh_peak, memory_breakdown, module_bytes
from duplexcadence.interpreter.bench.passes import run, run_interleaved, run_variant
from duplexcadence.interpreter.bench.profile import (
    BusyProfile,
    kernel_busy,
    kernel_time_measurable,
    profile_all,
    profile_busy,
    profiled_ticks,
)
from duplexcadence.interpreter.bench.results import (
    PASS_DISAGREEMENT,
    dump,
    memory_over_stock,
    pass_disagreements,
    to_json,
)
from duplexcadence.interpreter.bench.subject import Subject, Variant, VariantResult, option_flag
from duplexcadence.interpreter.bench.table import format_table
from duplexcadence.interpreter.bench.timing import (
    SecondStatistics,
    second_statistics,
    seconds_of,
    sm_clock_reader,
    sync,
)
from duplexcadence.interpreter.bench.trace import timeline_summary

__all__ = [
    "COMPILE_MODE",
    "DEFAULT_COMPILE_BUDGET_S",
    "PASS_DISAGREEMENT",
    "BusyProfile",
    "CompiledRunner",
    "SecondStatistics",
    "Subject",
    "Variant",
    "VariantBudgetExceeded",
    "VariantResult",
    "compile_summary",
    "compiled_variant",
    "cublas_workspace_bytes",
    "dump",
    "format_table",
    "fresh_peak",
    "kernel_busy",
    "kernel_time_measurable",
    "memory_breakdown",
    "memory_over_stock",
    "module_bytes",
    "option_flag",
    "pass_disagreements",
    "profile_all",
    "profile_busy",
    "profiled_ticks",
    "run",
    "run_interleaved",
    "run_variant",
    "second_statistics",
    "seconds_of",
    "sm_clock_reader",
    "sync",
    "time_budget",
    "timeline_summary",
    "to_json",
]
