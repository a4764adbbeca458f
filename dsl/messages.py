"""Every diagnostic of DuplexCadence: its code and its wording, in one place.

Passes never format user-facing text themselves: they call a function here, which returns a
`Diagnostic`. Codes are kebab-case names (shown as `[code]`), documented in docs/language.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .diagnostics import Diagnostic, ErrorCode, Note, Severity
from .source import Span

# --- the registry -------------------------------------------------------------------------------

SYNTAX = ErrorCode("syntax", "the text does not follow the .clock grammar")
UNREADABLE = ErrorCode("unreadable-file", "a file could not be read as UTF-8 text")
UNKNOWN_NAME = ErrorCode("unknown-name", "a name that is not defined")
DUPLICATE_NAME = ErrorCode("duplicate-name", "a name defined twice")
DUPLICATE_CLAUSE = ErrorCode("duplicate-clause", "a clause given twice in one declaration")
UNKNOWN_IMPORT = ErrorCode("unknown-import", "a `use` that names no stdlib or local module")
IMPORT_CYCLE = ErrorCode("import-cycle", "modules that import each other")
BAD_VALUE = ErrorCode("bad-value", "an expression that cannot be evaluated (type, unit, division by zero)")
BAD_RATE = ErrorCode("bad-rate", "a clock rate that is not a positive exact rate in Hz")
MISSING_CADENCE = ErrorCode("missing-cadence", "a program with stages but no cadence")
RATE_INCONSISTENT = ErrorCode("rate-inconsistent", "an advance that disagrees with the clocks")
CLOCK_MISMATCH = ErrorCode("clock-mismatch", "a stage using a region on a clock it cannot convert to")
RETENTION_TOO_SHORT = ErrorCode("retention-too-short", "a read longer than what the region keeps")
INSTANT_CYCLE = ErrorCode("instant-cycle", "stages that depend on each other within one instant")
UNBOUNDED_RETENTION = ErrorCode("unbounded-retention", "a region kept forever without a horizon")
MISSING_RETENTION = ErrorCode("missing-retention", "a state region that does not say how much it keeps")
UNKNOWN_DTYPE = ErrorCode("unknown-dtype", "a dtype that is not one of the supported element types")
SHAPE = ErrorCode("bad-shape", "a shape without exactly one time axis, or a dim that is not a positive integer")
SHAPE_ARITY = ErrorCode("shape-arity", "a shape with the wrong number of dimensions")
MISSING_CLOCK = ErrorCode("missing-clock", "a region without `on CLOCK`")
STAGE_CALLABLE = ErrorCode("stage-callable", "a stage without exactly one `module` or `hook`")
ROLE = ErrorCode("bad-role", "an input written by a stage, an output no stage writes, or a ring that is appended to")
BAD_INDEX = ErrorCode("bad-index", "a family member index out of range, or an index on a plain region")
BAD_BIND = ErrorCode("bad-bind", "a binding path that is malformed or names an unknown placeholder")
PARAM_OVERRIDE = ErrorCode("param-override", "a --param for an unknown param, or of the wrong kind")
BUDGET = ErrorCode("over-budget", "a plan over its arena or graph budget")
BINDING_MISMATCH = ErrorCode("binding-mismatch", "a region that disagrees with the module tensor it binds to")
CAPTURE_BLOCKED = ErrorCode("capture-blocked", "a stage that cannot be captured in a CUDA graph as written")
HYPERPERIOD = ErrorCode("long-hyperperiod", "clocks whose common period is very long", Severity.WARNING)
UNUSED_REGION = ErrorCode("unused-region", "a region no stage reads or writes", Severity.WARNING)

ALL_CODES: tuple[ErrorCode, ...] = tuple(
    value for value in globals().values() if isinstance(value, ErrorCode)
)

DTYPES: dict[str, int] = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2,
    "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1,
}
BUILTIN_FUNCTIONS = ("len", "max", "min", "prod", "sum")


def suggest(name: str, candidates: Iterable[str]) -> list[str]:
    """Close matches for a misspelt name, best first (at most three)."""
    return difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)


def _did_you_mean(name: str, candidates: Iterable[str]) -> tuple[str, ...]:
    close = suggest(name, candidates)
    if not close:
        return ()
    return ("did you mean " + " or ".join(f"'{c}'" for c in close) + "?",)


def _legal(kind: str, candidates: Iterable[str]) -> tuple[str, ...]:
    names = sorted(set(candidates))
    if not names:
        return (f"no {kind} is defined here",)
    if len(names) > 12:
        names = names[:12] + ["..."]
    return (f"defined {kind}s: " + ", ".join(names),)


# --- syntax and files ---------------------------------------------------------------------------


def syntax_unexpected(found: str, expected: list[str], span: Span, context: str | None) -> Diagnostic:
    where = f" in {context}" if context else ""
    message = f"unexpected {found}{where}"
    helps: tuple[str, ...] = ()
    if expected:
        shown = expected if len(expected) <= 8 else expected[:8] + ["..."]
        helps = ("expected " + ", ".join(shown),)
    return Diagnostic(SYNTAX, message, span, helps=helps)


def syntax_unexpected_end(expected: list[str], span: Span, context: str | None) -> Diagnostic:
    where = f" inside {context}" if context else ""
    helps = ("expected " + ", ".join(expected[:8]),) if expected else ()
    return Diagnostic(SYNTAX, f"the file ended{where}", span, helps=helps)


def syntax_bad_character(char: str, span: Span) -> Diagnostic:
    return Diagnostic(SYNTAX, f"unexpected character {char!r}", span,
                      helps=("a .clock file holds statements that begin with use, cadence, param, clock, "
                             "region or stage; comments begin with '#'",))


def unreadable(path: str, reason: str) -> Diagnostic:
    return Diagnostic(UNREADABLE, f"cannot read '{path}': {reason}", None)


def file_too_large(path: str, size: int, limit: int) -> Diagnostic:
    return Diagnostic(UNREADABLE, f"cannot read '{path}': {size} bytes is over the {limit}-byte limit for a .clock file",
                      None, helps=("a .clock file declares clocks, regions and stages; it is never this large",))


# --- names and imports --------------------------------------------------------------------------


def unknown_name(kind: str, name: str, span: Span | None, candidates: Iterable[str]) -> Diagnostic:
    candidates = list(candidates)
    helps = _did_you_mean(name, candidates) or _legal(kind, candidates)
    return Diagnostic(UNKNOWN_NAME, f"unknown {kind} '{name}'", span, helps=helps)


def wrong_kind_of_name(name: str, is_kind: str, want_kind: str, span: Span | None,
                       defined_at: Span | None, candidates: Iterable[str]) -> Diagnostic:
    return Diagnostic(UNKNOWN_NAME, f"'{name}' is a {is_kind}, not a {want_kind}", span,
                      notes=(Note(f"'{name}' is declared here", defined_at),),
                      helps=_did_you_mean(name, candidates) or _legal(want_kind, candidates))


def duplicate_name(kind: str, name: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(DUPLICATE_NAME, f"{kind} '{name}' is defined twice", span,
                      notes=(Note("first defined here", first),),
                      helps=("rename one of them, or delete the second",))


def duplicate_clause(clause: str, owner: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(DUPLICATE_CLAUSE, f"region '{owner}' has two '{clause}' clauses", span,
                      notes=(Note("first given here", first),), helps=(f"keep one '{clause}' clause",))


def unknown_import(module: str, span: Span | None, available: Iterable[str]) -> Diagnostic:
    available = list(available)
    helps = _did_you_mean(module, available) or _legal("module", available)
    return Diagnostic(UNKNOWN_IMPORT, f"no module '{module}' in the stdlib or beside this file", span,
                      helps=helps)


def unknown_imported_name(module: str, name: str, span: Span | None, available: Iterable[str]) -> Diagnostic:
    return Diagnostic(UNKNOWN_IMPORT, f"module '{module}' defines no '{name}'", span,
                      helps=_did_you_mean(name, available) or _legal("name", available))


def import_cycle(cycle: list[str], span: Span | None) -> Diagnostic:
    return Diagnostic(IMPORT_CYCLE, "import cycle: " + " -> ".join(cycle), span,
                      helps=("move the shared declarations into a module both can import",))


# --- values and units ---------------------------------------------------------------------------


def bad_value(problem: str, span: Span | None, help: str | None = None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, problem, span, helps=(help,) if help else ())


def unknown_function(name: str, span: Span | None) -> Diagnostic:
    return Diagnostic(UNKNOWN_NAME, f"unknown function '{name}'", span,
                      helps=_did_you_mean(name, BUILTIN_FUNCTIONS) or _legal("function", BUILTIN_FUNCTIONS))


def bad_rate(clock: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_RATE, f"clock '{clock}' {problem}", span,
                      helps=("write a rate in Hz (`clock mel = 50 Hz`, `clock frame = 12.5 Hz`) or derive it "
                             "from another clock by an exact factor (`clock frame = sample / 1920`)",))


def missing_cadence(span: Span | None) -> Diagnostic:
    return Diagnostic(MISSING_CADENCE, "the program has stages but no cadence", span,
                      helps=("declare the conversation period, e.g. `cadence 1 s`",))


def bad_cadence(problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"the cadence {problem}", span,
                      helps=("write a positive duration, e.g. `cadence 1 s` or `cadence 80 ms`",))


def long_hyperperiod(seconds: str, firings: int, span: Span | None) -> Diagnostic:
    return Diagnostic(HYPERPERIOD, f"the clocks repeat only every {seconds} s ({firings} firings)", span,
                      helps=("rates with a small common period keep the plan short; check for a typo in a rate",))


# --- regions ------------------------------------------------------------------------------------


def unknown_dtype(dtype: str, span: Span | None) -> Diagnostic:
    return Diagnostic(UNKNOWN_DTYPE, f"unknown dtype '{dtype}'", span,
                      helps=_did_you_mean(dtype, DTYPES) + ("supported: " + ", ".join(DTYPES),))


def time_axis_count(region: str, count: int, span: Span | None) -> Diagnostic:
    problem = "has no time axis (inputs and outputs need one)" if count == 0 else f"has {count} time axes"
    return Diagnostic(SHAPE, f"the shape of region '{region}' {problem}", span,
                      helps=("mark exactly one dimension `time`, e.g. `f32[B, 512, time]`",))


def bad_dim(region: str, position: int, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(SHAPE, f"dimension {position} of region '{region}' is {value}, not a positive integer", span,
                      helps=("dimensions are positive integers, params or expressions of them",))


def stock_arity(region: str, stock_rank: int, rank: int, span: Span | None) -> Diagnostic:
    return Diagnostic(SHAPE_ARITY, f"the stock shape of region '{region}' has {stock_rank} dimensions, "
                      f"the region has {rank}", span,
                      helps=("give the stock allocation's whole shape, or only its time-axis capacity (`stock 1000`)",))


def fixed_with_retention(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(SHAPE, f"region '{region}' has no time axis, so it keeps its whole shape and takes no "
                      "`retain` but `retain scratch`", span,
                      helps=("drop the `retain` clause (per-session state), write `retain scratch` (a working "
                             "buffer shared by all sessions), or mark the time axis: `f32[B, 512, time]`",))


def bad_start(region: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"region '{region}' {problem}", span,
                      helps=("regions with a time axis: start zeros | empty | given N; "
                             "fixed regions: start zeros | given",))


def missing_clock(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(MISSING_CLOCK, f"region '{region}' does not say which clock its time axis advances on",
                      span, helps=("add `on CLOCK`, e.g. `on frame`",))


def missing_retention(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(MISSING_RETENTION, f"region '{region}' does not say how much of it is kept", span,
                      helps=("add one of: retain last N | ring N | first A + last B | all horizon H | scratch",))


def unbounded_retention(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(UNBOUNDED_RETENTION, f"region '{region}' keeps everything with no horizon", span,
                      helps=("bound it with the session's longest duration, e.g. `retain all horizon 600 s`, "
                             "or keep a window: `retain last N`",))


def bad_count(what: str, region: str, value: str, span: Span | None, help: str) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"{what} of region '{region}' is {value}", span, helps=(help,))


def bad_family(region: str, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"the family size of region '{region}' is {value}, not a positive integer", span,
                      helps=("write the number of members, e.g. `kv[layer < 8]`",))


def bad_bind(region: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_BIND, f"the binding of region '{region}' {problem}", span,
                      helps=("a binding is an attribute path from the model root, e.g. "
                             "\"decoder.model.0._streaming_state.previous\"; `{index}` inserts a family index",))


# --- stages -------------------------------------------------------------------------------------


def stage_callable(stage: str, count: int, span: Span | None) -> Diagnostic:
    problem = "says nothing to call" if count == 0 else f"has {count} callables"
    return Diagnostic(STAGE_CALLABLE, f"stage '{stage}' {problem}", span,
                      helps=("give exactly one `module \"path.from.root\"` or `hook NAME`",))


def write_to_input(stage: str, region: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(ROLE, f"stage '{stage}' writes region '{region}', which is an input", span,
                      notes=(Note(f"'{region}' is declared `input` here", declared),),
                      helps=("inputs are filled by `step()`; write another region, or drop `input`",))


def ring_written(stage: str, region: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(ROLE, f"stage '{stage}' appends to region '{region}', a ring its module manages in place",
                      span, notes=(Note(f"'{region}' is declared `retain ring` here", declared),),
                      helps=(f"write `update {region} +N` (the module updates the ring), or keep a window: "
                             "`retain last N`",))


def output_never_written(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(ROLE, f"output region '{region}' is not written by any stage", span,
                      helps=("add `write REGION` to the stage that produces it",))


def index_on_plain_region(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_INDEX, f"region '{region}' is not a family and cannot be indexed", span,
                      helps=(f"write `{region}` without an index",))


def index_out_of_range(region: str, index: str, count: int, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_INDEX, f"family '{region}' has members 0..{count - 1}; index {index} is out of range",
                      span, helps=(f"use an index from 0 to {count - 1}, or no index for every member",))


def advance_mismatch(stage: str, stage_clock: str, stage_rate: str, verb: str, advance: str, region: str,
                     region_clock: str, region_rate: str, expected: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        RATE_INCONSISTENT,
        f"stage '{stage}' on clock '{stage_clock}' ({stage_rate} Hz) {verb} {advance} units of region '{region}' "
        f"per firing, but '{region}' advances on clock '{region_clock}' ({region_rate} Hz), "
        f"i.e. {expected} unit{'' if expected == '1' else 's'} per firing",
        span,
        helps=(f"write `+{expected}`, or put the region on a clock that advances {advance} units per firing",))


def fixed_advance(stage: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(RATE_INCONSISTENT, f"stage '{stage}' gives an advance or a window for region '{region}', "
                      "which has no time axis", span,
                      helps=(f"write `update {region}` or `read {region}`: a fixed region is used whole",))


def missing_advance(stage: str, region: str, expected: str, span: Span | None) -> Diagnostic:
    return Diagnostic(RATE_INCONSISTENT, f"stage '{stage}' updates region '{region}' without saying how far it "
                      "advances", span, helps=(f"write `update {region} +{expected}`",))


def slower_region(stage: str, stage_clock: str, stage_rate: str, verb: str, region: str, region_clock: str,
                  region_rate: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        CLOCK_MISMATCH,
        f"stage '{stage}' on clock '{stage_clock}' ({stage_rate} Hz) {verb} region '{region}', whose clock "
        f"'{region_clock}' ({region_rate} Hz) advances less than one unit per firing",
        span,
        helps=("run the stage on a clock no faster than the region's, or read the whole region instead of `new`",))


def retention_too_short(stage: str, region: str, need: int, what: str, keeps: int, span: Span | None,
                        declared: Span | None) -> Diagnostic:
    return Diagnostic(
        RETENTION_TOO_SHORT,
        f"stage '{stage}' reads {need} units of region '{region}' ({what}), which keeps {keeps}",
        span,
        notes=(Note(f"'{region}' declares its retention here", declared),),
        helps=(f"raise the retention of '{region}' to at least {need}, or shorten the read",))


def instant_cycle(cycle: list[str], span: Span | None, notes: list[Note]) -> Diagnostic:
    return Diagnostic(INSTANT_CYCLE, "stages depend on each other within one instant: " + " -> ".join(cycle),
                      span, notes=tuple(notes),
                      helps=("break the cycle with a delayed read: `read prev REGION` sees the version before "
                             "this instant's writes",))


def unused_region(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(UNUSED_REGION, f"region '{region}' is not used by any stage", span,
                      helps=("delete it, or add the stage that reads or writes it",))


# --- params -------------------------------------------------------------------------------------


def override_unknown(name: str, params: Iterable[str]) -> Diagnostic:
    params = list(params)
    return Diagnostic(PARAM_OVERRIDE, f"--param {name}: the program has no param '{name}'", None,
                      helps=_did_you_mean(name, params) or _legal("param", params))


def override_kind(name: str, kind: str, default: str, given: str, problem: str | None,
                  declared: Span | None) -> Diagnostic:
    detail = f" ({problem})" if problem else ""
    return Diagnostic(PARAM_OVERRIDE, f"--param {name}={given}: '{name}' is {kind}, default {default}{detail}",
                      None, notes=(Note(f"'{name}' is declared here", declared),),
                      helps=(f"give {kind}, e.g. --param {name}={default}",))


def override_syntax(text: str) -> Diagnostic:
    return Diagnostic(PARAM_OVERRIDE, f"--param {text!r} is not NAME=VALUE", None,
                      helps=("write e.g. --param P=200 or --param ratios=[8,6,5,4]",))


# --- plans and runtime --------------------------------------------------------------------------


def over_arena_budget(need: int, budget: int, span: Span | None) -> Diagnostic:
    return Diagnostic(BUDGET, f"the arena needs {need} bytes, over the budget of {budget} bytes", span,
                      helps=("raise --max-arena-bytes, or lower the params that size the largest regions",))


def negative_length(region: str, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"region '{region}' would hold {value} units", span,
                      helps=("check the params that size this region",))


def arena_does_not_fit(need: int, free: int, device: str) -> Diagnostic:
    return Diagnostic(BUDGET, f"the arena needs {need} bytes but {device} has {free} bytes free", None,
                      helps=("load fewer sessions, lower the params that size the largest regions, or free memory",))


def binding_shape(region: str, attribute: str, declared: str, actual: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BINDING_MISMATCH,
                      f"region '{region}' is declared {declared} but '{attribute}' is {actual}", span,
                      helps=("fix the region's dtype/shape in the .clock file, or bind it to another attribute",))


def binding_missing(region: str, attribute: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BINDING_MISMATCH, f"region '{region}' binds to '{attribute}', {problem}", span,
                      helps=("check the path from the model root (print(model) shows the module names)",))


def module_missing(stage: str, path: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(BINDING_MISMATCH, f"stage '{stage}' calls '{path}', {problem}", span,
                      helps=("check the path from the model root (print(model) shows the module names)",))


def hook_missing(stage: str, name: str, registered: Iterable[str], span: Span | None) -> Diagnostic:
    registered = list(registered)
    return Diagnostic(BINDING_MISMATCH, f"stage '{stage}' calls hook '{name}', which was not registered", span,
                      helps=_did_you_mean(name, registered)
                      + ("pass it to Runtime.load(..., hooks={'" + name + "': function})",))


def capture_blocked(stage: str, reason: str, span: Span | None) -> Diagnostic:
    return Diagnostic(CAPTURE_BLOCKED, f"stage '{stage}' cannot be captured: {reason}", span,
                      helps=("split the stage at this op, or keep its constants on the device; "
                             "the stage runs eagerly until then",))
