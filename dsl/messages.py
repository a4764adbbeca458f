"""Every diagnostic of DuplexCadence: its code and its wording, in one place.

Passes never format user-facing text themselves: they call a function here, which returns a
`Diagnostic`. Codes are kebab-case names (shown as `[code]`), documented in docs/language.md.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from fractions import Fraction

from duplexcadence.dsl.diagnostics import Diagnostic, ErrorCode, Note, Severity
from duplexcadence.dsl.source import Span

# --- the registry -------------------------------------------------------------------------------

SYNTAX = ErrorCode("syntax", "the text does not follow the .clock grammar")
UNREADABLE = ErrorCode("unreadable-file", "a file could not be read as UTF-8 text")
UNKNOWN_NAME = ErrorCode("unknown-name", "a name that is not defined")
DUPLICATE_NAME = ErrorCode("duplicate-name", "a name defined twice")
DUPLICATE_CLAUSE = ErrorCode("duplicate-clause", "a clause given twice in one declaration")
UNKNOWN_IMPORT = ErrorCode("unknown-import", "a `use` that names no stdlib or local module")
IMPORT_CYCLE = ErrorCode("import-cycle", "modules that import each other")
BAD_VALUE = ErrorCode(
    "bad-value",
    "a value that cannot be evaluated or does not fit (unit, division by zero, "
    "a count that is not whole, a start that does not fit)",
)
BAD_RATE = ErrorCode("bad-rate", "a clock rate that is not a positive exact rate in Hz")
MISSING_CADENCE = ErrorCode("missing-cadence", "a program with stages but no cadence")
RATE_INCONSISTENT = ErrorCode("rate-inconsistent", "an advance that disagrees with the clocks")
CLOCK_MISMATCH = ErrorCode("clock-mismatch", "a stage using a region on a clock it cannot convert to")
RETENTION_TOO_SHORT = ErrorCode(
    "retention-too-short", "a read longer than what the region keeps plus what arrives for the firing"
)
INSTANT_CYCLE = ErrorCode("instant-cycle", "stages that depend on each other within one instant")
UNBOUNDED_RETENTION = ErrorCode("unbounded-retention", "a region kept forever without a horizon")
MISSING_RETENTION = ErrorCode("missing-retention", "a state region that does not say how much it keeps")
UNKNOWN_DTYPE = ErrorCode("unknown-dtype", "a dtype that is not one of the supported element types")
SHAPE = ErrorCode(
    "bad-shape",
    "a shape with two time axes, an input/output without one, a dim that is not a "
    "positive integer, or `on`/`retain` on a region without a time axis",
)
SHAPE_ARITY = ErrorCode("shape-arity", "a stock shape with the wrong number of dimensions")
MISSING_CLOCK = ErrorCode("missing-clock", "a region without `on CLOCK`")
STAGE_CALLABLE = ErrorCode("stage-callable", "a stage without exactly one `module` or `hook`")
ROLE = ErrorCode(
    "bad-role",
    "an input written by a stage or read by two, an output no stage writes or that keeps "
    "units, or a ring that is appended to",
)
BAD_INDEX = ErrorCode("bad-index", "a family member index out of range, or an index on a plain region")
BAD_BIND = ErrorCode("bad-bind", "a binding or module path that is malformed, shared, or names an unknown placeholder")
BAD_ACCESS = ErrorCode(
    "bad-access",
    "a read or write that does not fit its region (a window on a ring, a "
    "lookahead longer than the read, a latency longer than the advance, two writers, "
    "scratch read where it is dead)",
)
PARAM_OVERRIDE = ErrorCode("param-override", "a --param for an unknown param, or of the wrong kind")
BUDGET = ErrorCode("over-budget", "a plan over its arena or graph budget")
BINDING_MISMATCH = ErrorCode("binding-mismatch", "a region that disagrees with the module tensor it binds to")
CAPTURE_BLOCKED = ErrorCode("capture-blocked", "a stage that cannot be captured in a CUDA graph as written")
CANNOT_PLAN = ErrorCode("cannot-plan", "a program the planner cannot lay out: it declares no stage")
TOO_MANY_REGIONS = ErrorCode("too-many-regions", "more regions (family members counted) than the `regions` limit")
TOO_MANY_STAGES = ErrorCode("too-many-stages", "more stages than the `stages` limit")
RETENTION_TOO_LONG = ErrorCode(
    "retention-too-long", "a `last`, `ring` or pinned `first` retention over the `retention` limit"
)
HORIZON_TOO_LONG = ErrorCode("horizon-too-long", "a `retain all horizon H` over the `horizon` limit")
CONTEXT_TOO_LONG = ErrorCode("context-too-long", "a read span, context or lookahead over the `context` limit")
WARMUP_TOO_LONG = ErrorCode(
    "warmup-too-long",
    "a state that repeats only after more instants than the `warmup` limit (or never, before a horizon)",
)
HYPERPERIOD_TOO_LONG = ErrorCode(
    "hyperperiod-too-long", "clocks whose common period holds more base ticks than the `hyperperiod` limit"
)
TOO_MANY_FIRINGS = ErrorCode("too-many-firings", "a plan that traces more firings than the `firings` limit")
TOO_MANY_VIEWS = ErrorCode("too-many-views", "a plan that traces more region views than the `views` limit")
TOO_MANY_STATES = ErrorCode(
    "too-many-states", "a plan that keeps more region lengths (instants x regions) than the `states` limit"
)
ARENA_TOO_LARGE = ErrorCode("arena-too-large", "a session arena over the `bytes` limit")
UNSAFE_PATH = ErrorCode(
    "unsafe-path",
    "a module or bind path that could leave the model: a dunder segment (`__x`), or a private one (`_x`) "
    "without `private`",
)
# data-dependent starts, counters and caller-owned objects
BAD_START = ErrorCode(
    "bad-start",
    "a data-dependent start (`start first`, `start first-firing`) that nothing in the program can make",
)
BAD_COUNTER = ErrorCode(
    "bad-counter",
    "a counter whose step or modulus is not a positive integer, on a clock no stage fires on, or that a "
    "stage writes or reads in a window",
)
BAD_OBJECT = ErrorCode(
    "bad-object",
    "a caller-owned object written, advanced or read in a window by a stage, or bound into without a stage "
    "that passes it",
)
HYPERPERIOD = ErrorCode("long-hyperperiod", "clocks whose common period is very long", Severity.WARNING)
UNUSED_REGION = ErrorCode("unused-region", "a region no stage reads or writes", Severity.WARNING)
EMPTY_FILE = ErrorCode("empty-file", "a file that declares nothing", Severity.WARNING)

# --- chunk boundaries (the codes of this block and their wording are at the end of the file) ------
BOUNDARY_LOSS = ErrorCode(
    "boundary-loss", "an output that loses units at every boundary between two firings", Severity.WARNING
)

# --- the duplex unit: bounded clocks, sliding windows, rows (the wording is at the end of the file) --
BAD_BOUND = ErrorCode(
    "bad-bound",
    "a bounded clock (`up to N per CLOCK`) that is not N whole firings per a clock of exact rate, or a use of "
    "one that the run-time count cannot serve (a window, an input, writers that do not add up to N)",
)
BAD_SLIDE = ErrorCode(
    "bad-slide",
    "a `slide` window whose marks are not first <= low <= high, that is appended to or read in a window, "
    "or that is an input or output",
)
BAD_ROWS = ErrorCode(
    "bad-rows", "a stage's `rows` that is not a positive whole number, or on a stage whose shapes vary at run time"
)

ALL_CODES: tuple[ErrorCode, ...] = tuple(value for value in globals().values() if isinstance(value, ErrorCode))

DTYPES: dict[str, int] = {
    "f64": 8,
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "i64": 8,
    "i32": 4,
    "i16": 2,
    "i8": 1,
    "u8": 1,
    "bool": 1,
}
BUILTIN_FUNCTIONS = ("len", "max", "min", "prod", "sum")


def suggest(name: str, candidates: Iterable[str]) -> list[str]:
    """Close matches for a misspelt name, best first (at most three)."""
    return difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)


def _did_you_mean(name: str, candidates: Iterable[str] | None) -> tuple[str, ...]:
    """`did you mean 'x'?`, or nothing; `candidates` None: no suggestion is looked for."""
    close = suggest(name, candidates) if candidates is not None else []
    if not close:
        return ()
    return ("did you mean " + " or ".join(f"'{c}'" for c in close) + "?",)


def _legal(kind: str, candidates: Iterable[str] | None) -> tuple[str, ...]:
    if candidates is None:
        return ()
    names = sorted(set(candidates))
    if not names:
        return (f"no {kind} is defined here",)
    if len(names) > 12:
        names = names[:12] + ["..."]
    return (f"defined {kind}s: " + ", ".join(names),)


# --- syntax and files ---------------------------------------------------------------------------


def _expected_words(expected: list[str]) -> str:
    """`a name`, `'on' or 'retain'`, `'hook', 'module', ... or '}'` (at most eight shown)."""
    shown = expected if len(expected) <= 8 else expected[:8]
    text = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
    return text + (", ..." if len(expected) > 8 else "")


def syntax_unexpected(
    found: str,
    expected: list[str],
    span: Span,
    context: str | None,
    notes: tuple[Note, ...] = (),
    suggestions: Iterable[str] = (),
    reserved: str | None = None,
    after: str | None = None,
) -> Diagnostic:
    where = f" in {context}" if context else ""
    following = f" after {after}" if after else ""
    helps: list[str] = []
    suggestions = list(suggestions)
    if suggestions:
        helps.append("did you mean " + " or ".join(f"'{s}'" for s in suggestions) + "?")
    if reserved is not None:
        helps.append(f"'{reserved}' is a reserved word and cannot be used as a name; pick another name")
    if expected and len(expected) <= 3 and len(_expected_words(expected)) <= 60:
        message = f"expected {_expected_words(expected)}{following}, found {found}{where}"
    else:
        message = f"unexpected {found}{following}{where}"
        if expected:
            helps.append("expected " + _expected_words(expected))
    return Diagnostic(SYNTAX, message, span, notes=tuple(notes), helps=tuple(helps))


def syntax_unfinished(
    context: str, expected: list[str], after: str | None, span: Span, notes: tuple[Note, ...]
) -> Diagnostic:
    following = f" after {after}" if after else ""
    if expected and len(expected) <= 3 and len(_expected_words(expected)) <= 60:
        return Diagnostic(
            SYNTAX, f"{context} is unfinished: expected {_expected_words(expected)}{following}", span, notes=notes
        )
    if "'}'" in expected:
        return Diagnostic(
            SYNTAX,
            f"{context} is unfinished: expected '}}' or another item{following}",
            span,
            notes=notes,
            helps=("expected " + _expected_words(expected),),
        )
    helps = ("expected " + _expected_words(expected),) if expected else ()
    return Diagnostic(SYNTAX, f"{context} is unfinished{following}", span, notes=notes, helps=helps)


def syntax_unexpected_end(
    expected: list[str], span: Span, context: str | None, notes: tuple[Note, ...] = ()
) -> Diagnostic:
    where = f" inside {context}" if context else ""
    helps: tuple[str, ...] = ()
    if expected:
        helps = ("expected " + _expected_words(expected),)
    return Diagnostic(SYNTAX, f"the file ended{where}", span, notes=tuple(notes), helps=helps)


def syntax_bad_character(char: str, span: Span) -> Diagnostic:
    if char == '"':
        return Diagnostic(
            SYNTAX,
            "this string is not closed on its line",
            span,
            helps=('a string is written on one line between double quotes: "decoder.model.0"',),
        )
    shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
    return Diagnostic(
        SYNTAX,
        f"unexpected character {shown}",
        span,
        helps=(
            "a .clock file holds statements that begin with use, cadence, param, clock, "
            "region or stage; names are ASCII letters, digits and '_'; strings use double "
            "quotes; comments begin with '#'",
        ),
    )


def too_deep(limit: int, span: Span) -> Diagnostic:
    return Diagnostic(
        SYNTAX,
        f"the expression nests more than {limit} levels deep",
        span,
        helps=("split it with params, or add lists with sum([...]) instead of a long chain of '+'",),
    )


def number_too_long(length: int, limit: int, span: Span) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"this number is written with {length} characters, over the {limit} a number may have",
        span,
        helps=("values are at most 10^15, with a denominator of at most 10^15: write the number in fewer digits",),
    )


def unreadable(path: str, reason: str) -> Diagnostic:
    return Diagnostic(UNREADABLE, f"cannot read '{path}': {reason}", None)


def unknown_clock(name: str, modules: Iterable[str]) -> Diagnostic:
    """A command-line argument that is neither a file nor a module (`dsl plan models.mimi_decodr`)."""
    modules = list(modules)
    helps = _did_you_mean(name, modules) or (f"the stdlib modules: {', '.join(modules)}",)
    return Diagnostic(
        UNREADABLE,
        f"cannot read '{name}': no such file, nor a module of that name here or in the stdlib",
        None,
        helps=helps,
    )


def file_too_large(path: str, size: int | None, limit: int) -> Diagnostic:
    """`size` None: the file holds more than `limit` bytes (reading stopped there)."""
    amount = f"it is {size} bytes, over" if size is not None else "it holds more than"
    return Diagnostic(
        UNREADABLE,
        f"cannot read '{path}': {amount} the {limit}-byte limit for a .clock file",
        None,
        helps=("a .clock file declares clocks, regions and stages; it is never this large",),
    )


def unreadable_import(module: str, path: str, reason: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNREADABLE,
        f"cannot read module '{module}' ('{path}'): {reason}",
        span,
        helps=("a module is a UTF-8 text file of .clock declarations",),
    )


def import_outside_root(module: str, path: str, root: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNREADABLE,
        f"cannot read module '{module}' ('{path}'): it is a symbolic link out of '{root}', where `use` looks for it",
        span,
        helps=(
            "`use` reads modules beside the importing file, then in the stdlib, and not through links "
            "that leave them: copy the module beside the file",
        ),
    )


def empty_file(path: str) -> Diagnostic:
    return Diagnostic(
        EMPTY_FILE,
        f"'{path}' declares nothing",
        None,
        helps=("a .clock file declares a cadence, params, clocks, regions and stages",),
    )


# --- names and imports --------------------------------------------------------------------------


def unknown_name(kind: str, name: str, span: Span | None, candidates: Iterable[str] | None) -> Diagnostic:
    """`candidates`: the names of that kind for a did-you-mean (None: no suggestion)."""
    candidates = list(candidates) if candidates is not None else None
    helps = _did_you_mean(name, candidates) or _legal(kind, candidates)
    return Diagnostic(UNKNOWN_NAME, f"unknown {kind} '{name}'", span, helps=helps)


def wrong_kind_of_name(
    name: str,
    is_kind: str,
    want_kind: str,
    span: Span | None,
    defined_at: Span | None,
    candidates: Iterable[str] | None,
) -> Diagnostic:
    candidates = list(candidates) if candidates is not None else None
    return Diagnostic(
        UNKNOWN_NAME,
        f"'{name}' is a {is_kind}, not a {want_kind}",
        span,
        notes=(Note(f"'{name}' is declared here", defined_at),),
        helps=_did_you_mean(name, candidates) or _legal(want_kind, candidates),
    )


def duplicate_name(
    kind: str,
    name: str,
    span: Span | None,
    first: Span | None,
    first_kind: str | None = None,
    first_imported: bool = False,
) -> Diagnostic:
    if first_kind is None or first_kind == kind:
        message = f"{kind} '{name}' is defined twice"
    else:
        message = f"'{name}' is defined twice: as a {first_kind} and as a {kind}"
    note = f"'{name}' is first imported here" if first_imported else f"'{name}' is first defined here"
    return Diagnostic(
        DUPLICATE_NAME,
        message,
        span,
        notes=(Note(note, first),),
        helps=(
            "params, clocks, regions, counters, objects and stages share one namespace: rename one of them, "
            "or delete the second",
        ),
    )


def duplicate_cadence(span: Span | None, first: Span | None, first_imported: bool = False) -> Diagnostic:
    note = "the cadence is first imported here" if first_imported else "the cadence is first declared here"
    return Diagnostic(
        DUPLICATE_NAME,
        "the cadence is declared twice",
        span,
        notes=(Note(note, first),),
        helps=(
            "a program has one cadence: delete one of them, or import the other module's "
            "names with `use MODULE (NAME, ...)`, which leaves its cadence out",
        ),
    )


def duplicate_argument(stage: str, alias: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        DUPLICATE_NAME,
        f"stage '{stage}' passes two arguments named '{alias}'",
        span,
        notes=(Note(f"'{alias}' is first given here", first),),
        helps=("give each `read ... as NAME` its own keyword",),
    )


def shadowing_index(index: str, region: str, kind: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        DUPLICATE_NAME,
        f"the index '{index}' of family '{region}' hides the {kind} '{index}'",
        span,
        notes=(Note(f"{kind} '{index}' is defined here", declared),),
        helps=("name the index something else, e.g. `layer`",),
    )


def duplicate_clause(clause: str, owner: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        DUPLICATE_CLAUSE,
        f"region '{owner}' has two '{clause}' clauses",
        span,
        notes=(Note("first given here", first),),
        helps=(f"keep one '{clause}' clause",),
    )


def input_and_output(region: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        DUPLICATE_CLAUSE,
        f"region '{region}' is declared both `input` and `output`",
        span,
        notes=(Note("the first role is given here", first),),
        helps=("an input is fed by `step()` and an output is returned by it: declare two regions",),
    )


def unknown_import(module: str, span: Span | None, available: Iterable[str]) -> Diagnostic:
    available = list(available)
    helps = _did_you_mean(module, available) or _legal("module", available)
    return Diagnostic(UNKNOWN_IMPORT, f"no module '{module}' in the stdlib or beside this file", span, helps=helps)


def unknown_imported_name(module: str, name: str, span: Span | None, available: Iterable[str] | None) -> Diagnostic:
    available = list(available) if available is not None else None
    return Diagnostic(
        UNKNOWN_IMPORT,
        f"module '{module}' defines no '{name}'",
        span,
        helps=_did_you_mean(name, available) or _legal("name", available),
    )


def import_name_too_long(module: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNKNOWN_IMPORT,
        f"no module '{module}' can exist: {problem}",
        span,
        helps=("a module is a .clock file beside this file or in the stdlib; check the `use` line",),
    )


def import_cycle(cycle: list[str], span: Span | None) -> Diagnostic:
    return Diagnostic(
        IMPORT_CYCLE,
        "import cycle: " + " -> ".join(cycle),
        span,
        helps=("move the shared declarations into a module both can import",),
    )


# --- values and units ---------------------------------------------------------------------------


def bad_value(problem: str, span: Span | None, help: str | None = None) -> Diagnostic:
    return Diagnostic(BAD_VALUE, problem, span, helps=(help,) if help else ())


def depends_on_itself(kind: str, name: str, cycle: list[str], span: Span | None) -> Diagnostic:
    """`cycle` starts and ends with `name`; a long one is shown by its ends."""
    shown = cycle if len(cycle) <= 12 else [*cycle[:6], f"... ({len(cycle) - 10} more)", *cycle[-4:]]
    return bad_value(
        f"{kind} '{name}' depends on itself: " + " -> ".join(shown),
        span,
        "define it from values that do not depend on it",
    )


def unknown_function(name: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNKNOWN_NAME,
        f"unknown function '{name}'",
        span,
        helps=_did_you_mean(name, BUILTIN_FUNCTIONS) or _legal("function", BUILTIN_FUNCTIONS),
    )


def bad_rate(clock: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_RATE,
        f"clock '{clock}' {problem}",
        span,
        helps=(
            "write a rate in Hz (`clock mel = 50 Hz`, `clock frame = 12.5 Hz`) or derive it "
            "from another clock by an exact factor (`clock frame = sample / 1920`)",
        ),
    )


def missing_cadence(span: Span | None) -> Diagnostic:
    return Diagnostic(
        MISSING_CADENCE,
        "the program has stages but no cadence",
        span,
        helps=("declare the conversation period, e.g. `cadence 1 s`",),
    )


def bad_cadence(problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"the cadence {problem}",
        span,
        helps=("write a positive duration, e.g. `cadence 1 s` or `cadence 80 ms`",),
    )


def long_hyperperiod(seconds: str, firings: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        HYPERPERIOD,
        f"the clocks repeat only every {seconds} s ({firings} firing{'s' if firings != 1 else ''})",
        span,
        helps=("rates with a small common period keep the plan short; check for a typo in a rate",),
    )


# --- regions ------------------------------------------------------------------------------------


def unknown_dtype(dtype: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNKNOWN_DTYPE,
        f"unknown dtype '{dtype}'",
        span,
        helps=_did_you_mean(dtype, DTYPES) + ("supported: " + ", ".join(DTYPES),),
    )


def time_axis_count(region: str, count: int, span: Span | None) -> Diagnostic:
    problem = "has no time axis (inputs and outputs need one)" if count == 0 else f"has {count} time axes"
    return Diagnostic(
        SHAPE,
        f"the shape of region '{region}' {problem}",
        span,
        helps=("mark exactly one dimension `time`, e.g. `f32[B, 512, time]`",),
    )


def bad_dim(
    region: str, position: int, value: str, span: Span | None, override: tuple[str, str] | None = None
) -> Diagnostic:
    """`override`: the `--param NAME=VALUE` the dimension's value comes from, reported at its first use only."""
    helps = ("dimensions are positive integers, params or expressions of them",)
    if override is not None:
        name, given = override
        helps = (
            f"--param {name}={given} gives this value; every other dimension that uses '{name}' has the same "
            "problem (reported once): give a positive integer",
        )
    return Diagnostic(
        SHAPE, f"dimension {position} of region '{region}' is {value}, not a positive integer", span, helps=helps
    )


def stock_arity(region: str, stock_rank: int, rank: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        SHAPE_ARITY,
        f"the stock shape of region '{region}' has {stock_rank} dimensions, the region has {rank}",
        span,
        helps=("give the stock allocation's whole shape, or only its time-axis capacity (`stock 1000`)",),
    )


def fixed_with_clause(region: str, clause: str, span: Span | None) -> Diagnostic:
    if clause == "retain":
        return Diagnostic(
            SHAPE,
            f"region '{region}' has no time axis, so it keeps its whole shape and takes no "
            "`retain` but `retain scratch`",
            span,
            helps=(
                "drop the `retain` clause (per-session state), write `retain scratch` (a working "
                "buffer shared by all sessions), or mark the time axis: `f32[B, 512, time]`",
            ),
        )
    return Diagnostic(
        SHAPE,
        f"region '{region}' has no time axis, so it advances on no clock",
        span,
        helps=("drop the `on` clause, or mark the time axis: `f32[B, 512, time]`",),
    )


def stock_of_fixed(region: str, rank: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        SHAPE_ARITY,
        f"region '{region}' has no time axis, so its stock is a whole shape, not a time-axis capacity",
        span,
        helps=(
            f"give all {rank} dimensions: `stock [...]`, or drop the `stock` clause "
            "(a fixed region's stock size is its shape)",
        ),
    )


def bad_start(region: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"region '{region}' {problem}",
        span,
        helps=("regions with a time axis: start zeros | empty | given N; fixed regions: start zeros | given",),
    )


def missing_clock(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        MISSING_CLOCK,
        f"region '{region}' does not say which clock its time axis advances on",
        span,
        helps=("add `on CLOCK`, e.g. `on frame`",),
    )


def missing_retention(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        MISSING_RETENTION,
        f"region '{region}' does not say how much of it is kept",
        span,
        helps=("add one of: retain last N | ring N | first A + last B | all horizon H | scratch",),
    )


def unbounded_retention(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNBOUNDED_RETENTION,
        f"region '{region}' keeps everything with no horizon",
        span,
        helps=(
            "bound it with the session's longest duration, e.g. `retain all horizon 600 s`, "
            "or keep a window: `retain last N`",
        ),
    )


def bad_count(what: str, region: str, value: str, span: Span | None, help: str) -> Diagnostic:
    return Diagnostic(BAD_VALUE, f"{what} of region '{region}' is {value}", span, helps=(help,))


def bad_family(kind: str, name: str, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"the family size of {kind} '{name}' is {value}, not a positive integer",
        span,
        helps=("write the number of members, e.g. `kv[layer < 8]`",),
    )


def bad_placeholder(
    region: str, placeholder: str, known: list[str], span: Span | None, kind: str = "region"
) -> Diagnostic:
    """`kind`: what `region` is (`region`, or `counter` for a counter's binding)."""
    if known:
        helps = _did_you_mean(placeholder, known) + (
            "the placeholders here are " + ", ".join(f"{{{k}}}" for k in known) + ", or an expression of them and "
            "the params, such as {" + known[0] + " + 1}",
        )
    else:
        helps = (f"{kind} '{region}' is not a family, so its binding has no placeholders",)
    return Diagnostic(
        BAD_BIND, f"the binding of {kind} '{region}' uses the unknown placeholder {{{placeholder}}}", span, helps=helps
    )


def shared_binding(
    region: str,
    path: str,
    other: str,
    span: Span | None,
    first: Span | None,
    kind: str = "region",
    other_kind: str = "region",
) -> Diagnostic:
    """`kind`, `other_kind`: what `region` and `other` are (`region`, or `counter`)."""
    return Diagnostic(
        BAD_BIND,
        f"{kind} '{region}' binds to '{path}', which {other_kind} '{other}' binds to already",
        span,
        notes=(Note(f"'{other}' binds to it here", first),),
        helps=(f"{_pair(kind, other_kind)} cannot share one attribute: bind one of them elsewhere",),
    )


def _pair(kind: str, other_kind: str) -> str:
    """`two regions`, `two counters`, `a region and a counter`."""
    return f"two {kind}s" if kind == other_kind else f"a {other_kind} and a {kind}"


def bad_module_path(stage: str, path: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BIND,
        f"the module path '{path}' of stage '{stage}' {problem}",
        span,
        helps=(
            'a module is an attribute path from the model root, e.g. "decoder" or '
            '"decoder.model.0"; "" is the root itself',
        ),
    )


def family_bind_without_index(region: str, path: str, count: int, index: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BIND,
        f"all {count} members of family '{region}' bind to the same attribute '{path}'",
        span,
        helps=(f'put {{{index}}} where the member\'s number goes, e.g. "layers.{{{index}}}.cache"',),
    )


def bad_bind(region: str, path: str, problem: str, span: Span | None, kind: str = "region") -> Diagnostic:
    """`kind`: what `region` is (`region`, or `counter` for a counter's binding)."""
    return Diagnostic(
        BAD_BIND,
        f"the binding '{path}' of {kind} '{region}' {problem}",
        span,
        helps=(
            "a binding is an attribute path from the model root, e.g. "
            '"decoder.model.0._streaming_state.previous"; `{index}` inserts a family index, `{index + 1}` an '
            "expression of the indices and params",
        ),
    )


def unsafe_path(
    keyword: str,
    owner: str,
    path: str,
    segment: str,
    dunder: bool,
    span: Span | None,
    kind: str = "region",
    obj: str | None = None,
) -> Diagnostic:
    """`keyword`: `module` (of stage `owner`) or `bind` (of `kind` `owner`: a region or a counter), `obj` the
    object a binding starts at (None: the model root)."""
    what = (
        f"the module path '{path}' of stage '{owner}'"
        if keyword == "module"
        else f"the binding '{path}' of {kind} '{owner}'"
    )
    opt_in = f"{keyword} private {obj} " if obj is not None else f"{keyword} private "
    legal = (
        "a path names public attributes of the model: child modules, parameters, buffers, tensors and the "
        "lists, dicts and plain objects that hold them"
    )
    if dunder:
        return Diagnostic(
            UNSAFE_PATH,
            f"{what} goes through '{segment}', a dunder attribute: a path never leaves the model",
            span,
            helps=(legal + "; a segment that starts with `__` is never allowed",),
        )
    return Diagnostic(
        UNSAFE_PATH,
        f"{what} goes through '{segment}', a private attribute",
        span,
        helps=(
            legal + ". Where the model keeps its state in a private attribute (moshi's `_streaming_state`), "
            f'opt in: `{opt_in}"{path}"`',
        ),
    )


def path_leaves_model(keyword: str, owner: str, path: str, part: str, found: str, span: Span | None) -> Diagnostic:
    """At load: the object `part` of `path` reaches is `found`, outside the model."""
    what = f"stage '{owner}' calls '{path}'" if keyword == "module" else f"region '{owner}' binds to '{path}'"
    return Diagnostic(
        UNSAFE_PATH,
        f"{what}, whose '{part}' is {found}: a path stays inside the model",
        span,
        helps=(
            "a path walks through modules, tensors, lists, dicts and plain objects holding state, and a stage "
            "calls a module or a method of the object before it; call anything else from a `hook`",
        ),
    )


# --- stages -------------------------------------------------------------------------------------


def stage_callable(stage: str, count: int, span: Span | None) -> Diagnostic:
    problem = "says nothing to call" if count == 0 else f"has {count} callables"
    return Diagnostic(
        STAGE_CALLABLE,
        f"stage '{stage}' {problem}",
        span,
        helps=('give exactly one `module "path.from.root"` or `hook NAME`',),
    )


def write_to_input(stage: str, region: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        ROLE,
        f"stage '{stage}' writes region '{region}', which is an input",
        span,
        notes=(Note(f"'{region}' is declared `input` here", declared),),
        helps=("inputs are filled by `step()`; write another region, or drop `input`",),
    )


def ring_written(stage: str, region: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        ROLE,
        f"stage '{stage}' appends to region '{region}', a ring its module manages in place",
        span,
        notes=(Note(f"'{region}' is declared `retain ring` here", declared),),
        helps=(f"write `update {region} +N` (the module updates the ring), or keep a window: `retain last N`",),
    )


def input_read_twice(region: str, stage: str, first_stage: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        ROLE,
        f"stage '{stage}' reads input region '{region}', which stage '{first_stage}' reads too",
        span,
        notes=(Note(f"'{first_stage}' reads it here", first),),
        helps=(
            "`step()` feeds an input's units to the one stage that reads it; let that stage write "
            "what the others need into a region they read",
        ),
    )


def output_retained(region: str, retention: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        ROLE,
        f"output region '{region}' declares `retain {retention}`: an output keeps nothing between instants",
        span,
        helps=(
            "`step()` returns the units a stage writes in the instant; drop the `retain` clause, or "
            "keep the history in a state region the stage also writes",
        ),
    )


def output_never_written(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        ROLE,
        f"output region '{region}' is not written by any stage",
        span,
        helps=("add `write REGION` to the stage that produces it",),
    )


def index_on_plain_region(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_INDEX,
        f"region '{region}' is not a family and cannot be indexed",
        span,
        helps=(f"write `{region}` without an index",),
    )


def index_out_of_range(region: str, index: str, count: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_INDEX,
        f"family '{region}' has members 0..{count - 1}; index {index} is out of range",
        span,
        helps=(f"use an index from 0 to {count - 1}, or no index for every member",),
    )


def advance_mismatch(
    stage: str,
    stage_clock: str,
    stage_rate: str,
    verb: str,
    advance: str,
    region: str,
    region_clock: str,
    region_rate: str,
    expected: str,
    span: Span | None,
) -> Diagnostic:
    return Diagnostic(
        RATE_INCONSISTENT,
        f"stage '{stage}' on clock '{stage_clock}' ({stage_rate} Hz) {verb} {units(advance)} of region '{region}' "
        f"per firing, but '{region}' advances on clock '{region_clock}' ({region_rate} Hz), "
        f"i.e. {units(expected)} per firing",
        span,
        helps=(f"write `+{expected}`, or put the region on a clock that advances {units(advance)} per firing",),
    )


def units(count: int | str) -> str:
    """`1 unit`, `3 units`: a count of a region's units, as every message words it."""
    return f"{count} unit" if str(count) == "1" else f"{count} units"


def fractional_advance(
    stage: str,
    stage_clock: str,
    stage_rate: str,
    verb: str,
    region: str,
    region_clock: str,
    region_rate: str,
    per_firing: str,
    span: Span | None,
) -> Diagnostic:
    return Diagnostic(
        RATE_INCONSISTENT,
        f"stage '{stage}' on clock '{stage_clock}' ({stage_rate} Hz) {verb} region '{region}', whose clock "
        f"'{region_clock}' ({region_rate} Hz) advances {per_firing} units per firing, not a whole number",
        span,
        helps=(
            "fire the stage on a clock whose period holds a whole number of the region's units, "
            "or make the region an `output` whose length the module decides",
        ),
    )


def fixed_advance(stage: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        RATE_INCONSISTENT,
        f"stage '{stage}' gives an advance or a window for region '{region}', which has no time axis",
        span,
        helps=(f"write `update {region}` or `read {region}`: a fixed region is used whole",),
    )


def missing_advance(stage: str, region: str, expected: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        RATE_INCONSISTENT,
        f"stage '{stage}' updates region '{region}' without saying how far it advances",
        span,
        helps=(f"write `update {region} +{expected}`",),
    )


def slower_region(
    stage: str,
    stage_clock: str,
    stage_rate: str,
    verb: str,
    region: str,
    region_clock: str,
    region_rate: str,
    span: Span | None,
) -> Diagnostic:
    return Diagnostic(
        CLOCK_MISMATCH,
        f"stage '{stage}' on clock '{stage_clock}' ({stage_rate} Hz) {verb} region '{region}', whose clock "
        f"'{region_clock}' ({region_rate} Hz) advances less than one unit per firing",
        span,
        helps=("run the stage on a clock no faster than the region's, or read the whole region instead of `new`",),
    )


def retention_too_short(
    stage: str,
    region: str,
    need: int,
    what: str,
    keeps: int,
    span: Span | None,
    declared: Span | None,
    arriving: int = 0,
) -> Diagnostic:
    """`keeps` units are kept between firings; `arriving` more are surely there when the stage fires
    (fed by `step()`, or written earlier in the instant)."""
    if arriving:
        there = f"but only {keeps + arriving} are there when it fires ({keeps} kept + {arriving} arriving)"
    else:
        there = f"which keeps {keeps}"
    return Diagnostic(
        RETENTION_TOO_SHORT,
        f"stage '{stage}' reads {units(need)} of region '{region}' ({what}), {there}",
        span,
        notes=(Note(f"'{region}' declares its retention here", declared),),
        helps=(f"raise the retention of '{region}' to at least {need - arriving}, or shorten the read",),
    )


def window_on_ring(stage: str, region: str, window: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' reads {window} of region '{region}', a ring: a stage always sees the whole ring",
        span,
        helps=(f"write `read {region}`, or keep a window with `retain last N`",),
    )


def lookahead_too_long(stage: str, region: str, lookahead: int, span_units: int, span: Span | None) -> Diagnostic:
    """A lookahead longer than the read's window (the whole kept region for a read without window)."""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' reads a lookahead of {units(lookahead)} of region '{region}', "
        f"more than the {units(span_units)} it reads",
        span,
        helps=("the lookahead is the newest part of the read: make it at most the read's length",),
    )


def bad_latency(stage: str, region: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' writes region '{region}' with a latency {problem}",
        span,
        helps=("a latency holds back part of the first firing's advance: `write pcm +24000 latency 3840`",),
    )


def written_twice(stage: str, region: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' writes region '{region}' twice",
        span,
        notes=(Note("first written here", first),),
        helps=("write or update a region once per stage, with the whole advance",),
    )


def several_writers(region: str, stage: str, other: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"region '{region}' is written by stage '{other}' and by stage '{stage}'",
        span,
        notes=(Note(f"'{other}' writes it here", first),),
        helps=(
            "a region with a time axis has one writer, which gives its advance; let the other "
            "stage write its own region",
        ),
    )


def dead_scratch(stage: str, region: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' reads scratch region '{region}' {problem}",
        span,
        helps=(
            "scratch lives for one instant: read it in the same instant, after its writer, or "
            "keep it between instants with `retain last N`",
        ),
    )


def instant_cycle(cycle: list[str], span: Span | None, notes: list[Note]) -> Diagnostic:
    return Diagnostic(
        INSTANT_CYCLE,
        "stages depend on each other within one instant: " + " -> ".join(cycle),
        span,
        notes=tuple(notes),
        helps=(
            "break the cycle with a delayed read: `read prev REGION` sees the version before this instant's writes",
        ),
    )


def unused_region(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        UNUSED_REGION,
        f"region '{region}' is not used by any stage",
        span,
        helps=("delete it, or add the stage that reads or writes it",),
    )


# --- params -------------------------------------------------------------------------------------


def override_unknown(name: str, params: Iterable[str]) -> Diagnostic:
    params = list(params)
    return Diagnostic(
        PARAM_OVERRIDE,
        f"--param {name}: the program has no param '{name}'",
        None,
        helps=_did_you_mean(name, params) or _legal("param", params),
    )


def override_kind(
    name: str, kind: str, default: str, given: str, problem: str | None, declared: Span | None
) -> Diagnostic:
    detail = f" ({problem})" if problem else ""
    return Diagnostic(
        PARAM_OVERRIDE,
        f"--param {name}={given}: '{name}' is {kind}, default {default}{detail}",
        None,
        notes=(Note(f"'{name}' is declared here", declared),),
        helps=(f"give {kind}, e.g. --param {name}={default}",),
    )


def override_syntax(text: str) -> Diagnostic:
    return Diagnostic(
        PARAM_OVERRIDE,
        f"--param {text!r} is not NAME=VALUE",
        None,
        helps=("write e.g. --param P=200 or --param ratios=[8,6,5,4]",),
    )


# --- plans and runtime --------------------------------------------------------------------------


def over_arena_budget(need: int, budget: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BUDGET,
        f"the arena needs {need} bytes, over the budget of {budget} bytes",
        span,
        helps=("raise --max-arena-bytes, or lower the params that size the largest regions",),
    )


def negative_length(region: str, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"region '{region}' would hold {value} units",
        span,
        helps=("check the params that size this region",),
    )


def nothing_to_plan(path: str) -> Diagnostic:
    return Diagnostic(
        CANNOT_PLAN,
        f"'{path}' declares no stage: there is nothing to plan",
        None,
        helps=("a file of clocks and params is a library: `use` it from a program with stages",),
    )


def arena_does_not_fit(
    need: int,
    sessions: int,
    session_bytes: int,
    scratch_bytes: int,
    free: int,
    cached: int,
    device: str,
    lanes: int = 1,
) -> Diagnostic:
    plural = "session" if sessions == 1 else "sessions"
    scratch = f"{scratch_bytes} shared scratch" if lanes == 1 else f"{lanes} lanes x {scratch_bytes} scratch"
    available = (
        f"the host has {free} bytes available (MemAvailable)"
        if device == "cpu"
        else f"{device} has {free + cached} bytes available ({free} free + {cached} cached by PyTorch)"
    )
    return Diagnostic(
        BUDGET,
        f"the arena for {sessions} {plural} needs {need} bytes ({sessions} x {session_bytes} "
        f"per session + {scratch}) but {available}; nothing was allocated",
        None,
        helps=("load fewer sessions or lanes, lower the params that size the largest regions, or free memory",),
    )


def binding_shape(region: str, attribute: str, declared: str, actual: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BINDING_MISMATCH,
        f"region '{region}' is declared {declared} but '{attribute}' is {actual}",
        span,
        helps=("fix the region's dtype/shape in the .clock file, or bind it to another attribute",),
    )


def binding_missing(
    region: str, attribute: str, problem: str, span: Span | None, lazy_object: bool = False
) -> Diagnostic:
    """`lazy_object`: the path is in an object a factory made, whose entries the stock call may create lazily."""
    helps = ("check the path from the model root (print(model) shows the module names)",)
    if lazy_object:
        obj = attribute.split(":", 1)[0]
        helps = (
            f"the object '{obj}' its factory made has no such entry; if the stock call creates its entries on its "
            f"first call, let the stage make the object: `object {obj} from stage STAGE` (docs/runtime.md)",
        )
    return Diagnostic(BINDING_MISMATCH, f"region '{region}' binds to '{attribute}', {problem}", span, helps=helps)


def module_missing(stage: str, path: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BINDING_MISMATCH,
        f"stage '{stage}' calls '{path}', {problem}",
        span,
        helps=("check the path from the model root (print(model) shows the module names)",),
    )


def hook_missing(stage: str, name: str, registered: Iterable[str], span: Span | None) -> Diagnostic:
    registered = list(registered)
    return Diagnostic(
        BINDING_MISMATCH,
        f"stage '{stage}' calls hook '{name}', which was not registered",
        span,
        helps=_did_you_mean(name, registered) + ("pass it to Runtime.load(..., hooks={'" + name + "': function})",),
    )


def call_mismatch(stage: str, callee: str, passed: str, signature: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BINDING_MISMATCH,
        f"stage '{stage}' calls {callee} as ({passed}), but it is {signature}: {problem}",
        span,
        helps=(
            "the runtime passes every `read` and `update` of a region without `bind` "
            "positionally, in declared order (`read x as name` by keyword); a hook gets the "
            "model first; bound regions reach the module through their attribute",
        ),
    )


def capture_blocked(stage: str, reason: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        CAPTURE_BLOCKED,
        f"stage '{stage}' cannot be captured: {reason}",
        span,
        helps=("split the stage at this op, or keep its constants on the device; the stage runs eagerly until then",),
    )


def capture_obstacle(stage: str, operation: str, count: int, advice: str, span: Span | None) -> Diagnostic:
    """One host-side obstacle to capturing `stage`, found while it warmed up: `count` per firing (0: not a
    count, e.g. a counter's host value used)."""
    times = "" if count == 0 else ", once per firing" if count == 1 else f", {count} times per firing"
    return Diagnostic(
        CAPTURE_BLOCKED,
        f"stage '{stage}' cannot be captured: {operation}{times}",
        span,
        helps=(advice, "the stage runs eagerly, outputs unchanged"),
    )


# --- limits -------------------------------------------------------------------------------------


def count_text(value: int) -> str:
    """An integer as written, or its order of magnitude when it is huge."""
    if value.bit_length() > 200:
        return f"about 10^{int(value.bit_length() * 0.30103)}"
    return str(value)


def bytes_text(value: int) -> str:
    """`1.5 GiB`, `512 B`."""
    if value.bit_length() > 200:
        return f"about 2^{value.bit_length() - 1} bytes"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if amount < 1024 or unit == "PiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def _raise_limit(name: str, needed: int | None) -> str:
    value = str(needed) if needed is not None else "N"
    return f"a model that needs more raises the limit: --limit {name}={value} (limits={{'{name}': {value}}} in Python)"


def too_many_regions(region: str, members: int | None, total: int, limit: int, span: Span | None) -> Diagnostic:
    """`members`: the family's size (None for a plain region); `total`: the regions with it."""
    if members is not None:
        message = (
            f"family '{region}' has {count_text(members)} members, which makes {count_text(total)} regions: "
            f"over the limit of {count_text(limit)} regions in a program"
        )
    else:
        message = (
            f"region '{region}' makes {count_text(total)} regions: over the limit of {count_text(limit)} in a program"
        )
    return Diagnostic(
        TOO_MANY_REGIONS,
        message,
        span,
        helps=(
            "each member of a family is a region of its own: check the family's size",
            _raise_limit("regions", total),
        ),
    )


def too_many_stages(stage: str, total: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        TOO_MANY_STAGES,
        f"stage '{stage}' is stage {limit + 1} of {count_text(total)}: over the limit of {count_text(limit)} "
        f"stage{'s' if limit != 1 else ''} in a program",
        span,
        helps=(
            "a stage is one call per tick; a model's tail has a handful: check for repeated declarations",
            _raise_limit("stages", total),
        ),
    )


def retention_too_long(what: str, region: str, value: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        RETENTION_TOO_LONG,
        f"{what} of region '{region}' is {count_text(value)} units, over the limit of {count_text(limit)}",
        span,
        helps=(
            "check the count and its unit (a duration counts units of the region's clock: 10 s at 24 kHz is 240 000)",
            _raise_limit("retention", value),
        ),
    )


def horizon_too_long(region: str, value: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        HORIZON_TOO_LONG,
        f"the horizon of region '{region}' is {count_text(value)} units, over the limit of {count_text(limit)}",
        span,
        helps=(
            "the horizon is the longest session, in units of the region's clock: check the count and its unit",
            _raise_limit("horizon", value),
        ),
    )


def context_too_long(what: str, region: str, value: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        CONTEXT_TOO_LONG,
        f"{what} of region '{region}' is {count_text(value)} units, over the limit of {count_text(limit)}",
        span,
        helps=(
            "a read this long needs a retention as long: check the count and its unit",
            _raise_limit("context", value),
        ),
    )


def warmup_too_long(
    region: str, keeps: int, horizon: bool, rate: str, seconds: str, instants: int, limit: int, span: Span | None
) -> Diagnostic:
    """`dsl check`'s estimate: the time `region` takes to fill (to its horizon, when `horizon`)."""
    if horizon:
        what = (
            f"region '{region}' keeps everything up to its horizon of {count_text(keeps)} units at {rate} Hz: "
            f"the planner traces the whole session, {seconds} s"
        )
    else:
        what = f"region '{region}' fills its {count_text(keeps)} units at {rate} Hz: the state repeats only after {seconds} s"
    return Diagnostic(
        WARMUP_TOO_LONG,
        f"{what}, at least {count_text(instants)} instants, over the warm-up limit of {count_text(limit)} instants",
        span,
        helps=(
            "a window starts full with `start zeros`; otherwise it fills as fast as its clock: keep less, or check the count",
            _raise_limit("warmup", instants + 1),
        ),
    )


def warmup_not_repeating(
    region: str, before: int, after: int, instants: int, limit: int, span: Span | None
) -> Diagnostic:
    """The planner's count: the state still changes after `instants` instants."""
    return Diagnostic(
        WARMUP_TOO_LONG,
        f"the state does not repeat within the warm-up limit of {count_text(limit)} instants: region '{region}' "
        f"still grows, from {count_text(before)} to {count_text(after)} units over the last hyperperiod traced",
        span,
        helps=(
            "a window starts full with `start zeros`; otherwise it fills as fast as its clock: keep less, or check the count",
            _raise_limit("warmup", None),
        ),
    )


def base_tick_cause(clock: str, rate: str) -> str:
    return f"clock '{clock}' ({rate} Hz) makes the base tick so short that one cadence holds"


def stage_clock_cause(clock: str, rate: str, stage: str, seconds: str) -> str:
    return (
        f"clock '{clock}' ({rate} Hz), on which stage '{stage}' fires, makes the clocks repeat only every {seconds} s"
    )


def arrivals_cause(seconds: str) -> str:
    return f"the units this access takes per firing make the clocks repeat only every {seconds} s"


def hyperperiod_too_long(cause: str, ticks: int, base_tick: str, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        HYPERPERIOD_TOO_LONG,
        f"{cause}: {count_text(ticks)} base ticks of {base_tick} s, over the limit of {count_text(limit)}",
        span,
        helps=(
            "the base tick divides every clock's period: rates with a small common period keep the plan short; "
            "check the rates for a typo",
            _raise_limit("hyperperiod", ticks),
        ),
    )


def too_many_firings(total: int, warmup: int, periods: int, seconds: str, limit: int, span: Span | None) -> Diagnostic:
    parts = [f"{count_text(warmup)} in the warm-up"] if warmup else []
    parts += [f"{count_text(periods)} in two hyperperiods of {seconds} s"] if periods else []
    return Diagnostic(
        TOO_MANY_FIRINGS,
        f"the planner would trace {count_text(total)} firings ({', '.join(parts)}), over the limit of "
        f"{count_text(limit)}",
        span,
        helps=(
            "the trace holds every firing of the warm-up and of two hyperperiods: check the rates and the "
            "retentions for a typo",
            _raise_limit("firings", total),
        ),
    )


def too_many_views(total: int, stage: str, views: int, firings: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        TOO_MANY_VIEWS,
        f"the planner would trace {count_text(total)} region views, over the limit of {count_text(limit)}; "
        f"stage '{stage}' alone touches {count_text(views)} regions in each of its {count_text(firings)} firings",
        span,
        helps=(
            "every region a firing touches is one view of the trace: check the family sizes, the reads and the rates",
            _raise_limit("views", total),
        ),
    )


def too_many_states(total: int, instants: int, regions: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        TOO_MANY_STATES,
        f"the planner would keep {count_text(total)} region lengths ({count_text(instants)} traced instants x "
        f"{count_text(regions)} regions with a time axis), over the limit of {count_text(limit)}",
        span,
        helps=(
            "the plan keeps every region's length at every traced instant: check the rates (how many instants) "
            "and the family sizes (how many regions)",
            _raise_limit("states", total),
        ),
    )


def arena_too_large(
    need: int, region: str, region_bytes: int, limit: int, at_least: bool, span: Span | None
) -> Diagnostic:
    """`at_least`: `dsl check`'s lower bound (the plan's exact arena may be larger)."""
    amount = "at least " if at_least else ""
    return Diagnostic(
        ARENA_TOO_LARGE,
        f"a session's arena needs {amount}{bytes_text(need)} ({count_text(need)} bytes), over the limit of "
        f"{bytes_text(limit)}; region '{region}' alone needs {amount}{bytes_text(region_bytes)}",
        span,
        helps=(
            "check the region's shape, dtype and retention for a typo",
            _raise_limit("bytes", need),
        ),
    )


# --- data-dependent starts, counters and caller-owned objects -------------------------------------


def start_kind(region: str, policy: str, problem: str, help: str, span: Span | None) -> Diagnostic:
    """`start first` or `start first-firing` on a region that cannot have it (`problem`)."""
    return Diagnostic(BAD_START, f"region '{region}' starts `{policy}`, but it {problem}", span, helps=(help,))


def start_first_unfed(region: str, updater: str | None, span: Span | None) -> Diagnostic:
    helps = ["`start first` copies the first unit that arrives (fed by `step()`, or appended by a `write`)"]
    if updater is not None:
        helps.append(
            f"stage '{updater}' updates it: the stage makes its own start from its first call, `start first-firing`"
        )
    return Diagnostic(
        BAD_START,
        f"region '{region}' starts `first`, but no unit ever arrives in it: it is neither an input nor "
        "appended to by a `write`",
        span,
        helps=tuple(helps),
    )


def start_first_firing_unused(region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_START,
        f"region '{region}' starts `first-firing`, but no stage updates it, so no firing makes its start",
        span,
        helps=(
            "`start first-firing` hands the stage that updates the region no value (None) at its first firing "
            "and keeps what the stage returns; add `update` to that stage, or start `first` (a copy of the "
            "first unit that arrives) or `zeros`",
        ),
    )


def counter_not_whole(counter: str, what: str, value: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_COUNTER,
        f"the {what} of counter '{counter}' is {value}, not a positive integer",
        span,
        helps=("a counter counts in whole steps: `counter step +2 on frame`, `counter pos +1 mod 4096 on frame`",),
    )


def counter_without_stage(counter: str, clock: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_COUNTER,
        f"counter '{counter}' advances on clock '{clock}', but no stage fires on '{clock}'",
        span,
        helps=("put the counter on the clock of the stage whose calls it counts",),
    )


def counter_written(stage: str, counter: str, verb: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_COUNTER,
        f"stage '{stage}' {verb} counter '{counter}': the runtime advances a counter, a stage only reads it",
        span,
        notes=(Note(f"'{counter}' is declared here", declared),),
        helps=(f"`read {counter}` hands the stage its device scalar; hooks get its value as firing.counters",),
    )


def counter_window(stage: str, counter: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_COUNTER,
        f"stage '{stage}' reads counter '{counter}' with a window: a counter is one value, read whole",
        span,
        helps=(f"`read {counter}` (or `read {counter} as ARG`)",),
    )


def object_misuse(stage: str, obj: str, problem: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_OBJECT,
        f"stage '{stage}' {problem} object '{obj}': an object is passed whole",
        span,
        notes=(Note(f"'{obj}' is declared here", declared),),
        helps=(
            f"`read {obj}` passes it; `update {obj}` passes it and takes what the call returns in its place "
            "as the object",
        ),
    )


def object_unpassed(
    region: str, obj: str, span: Span | None, declared: Span | None, kind: str = "region"
) -> Diagnostic:
    """`kind`: what `region` is (`region`, or `counter`)."""
    return Diagnostic(
        BAD_OBJECT,
        f"{kind} '{region}' binds into object '{obj}', which no stage passes",
        span,
        notes=(Note(f"'{obj}' is declared here", declared),),
        helps=(f"add `update {obj}` (or `read {obj}`) to the stage whose call takes the object",),
    )


def object_unavailable(obj: str, problem: str, span: Span | None) -> Diagnostic:
    """At load: no object to bind into (no factory and none given, a factory not registered or failing)."""
    return Diagnostic(
        BINDING_MISMATCH,
        f"object '{obj}' {problem}",
        span,
        helps=(
            f"declare a factory, `object {obj} from make_{obj}`, registered as Runtime.load(..., "
            f"hooks={{'make_{obj}': function}}), or give it: Runtime.load(..., objects={{'{obj}': value}})",
        ),
    )


def object_given_and_made(obj: str, factory: str, span: Span | None) -> Diagnostic:
    """At load: an object given in `objects=` that the `.clock` has a factory make per session."""
    return Diagnostic(
        BINDING_MISMATCH,
        f"object '{obj}' is given in objects=, but the .clock has '{factory}' make it for each session",
        span,
        helps=(
            f"leave it out of objects= (each session gets its own from '{factory}'), or declare `object {obj}` "
            "without `from` to share the one given by every session",
        ),
    )


def family_alias(stage: str, family: str, alias: str, count: int, span: Span | None) -> Diagnostic:
    """`read kv as cache` where `kv` has several members: one keyword cannot pass them all."""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' reads family '{family}' ({count} members) as one keyword argument '{alias}'",
        span,
        helps=(
            f"without `as`, the members are passed positionally, {family}[0] to {family}[{count - 1}] in order; "
            f"or read one member by keyword: `read {family}[0] as {alias}`",
        ),
    )


# --- chunk boundaries ---------------------------------------------------------------------------


def duration_text(seconds: Fraction) -> str:
    """`23.1 ms`, `160 ms`, `1.36 s`: three significant digits."""
    if seconds < 1:
        return f"{float(seconds * 1000):.3g} ms"
    return f"{float(seconds):.3g} s"


def rate_text(rate: Fraction) -> str:
    """`24 kHz`, `12.5 Hz`."""
    if rate >= 1000 and (rate / 1000 * 1000).denominator == 1:
        return f"{float(rate / 1000):g} kHz"
    return f"{float(rate):g} Hz"


def units_text(count: int, clock: str) -> str:
    """`555 samples`, `1 frame`: a count of units named after their clock."""
    return f"{count} {clock}" if count == 1 else f"{count} {clock}s"


def loss_on_state(stage: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' writes region '{region}' with `loses`, but '{region}' is not an output",
        span,
        helps=(
            "`loses L` says that each firing's output is L units short, as one stock call is; "
            "a state region holds what the stage writes: declare the advance it really has",
        ),
    )


def loss_over_advance(stage: str, region: str, loss: int, latency: int, advance: int, span: Span | None) -> Diagnostic:
    held = f" less its latency of {latency}" if latency else ""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' writes region '{region}' with a loss of {units(loss)}, more than its advance of "
        f"{advance}{held}",
        span,
        helps=("a firing cannot emit fewer than no units: the loss is at most the advance (less the latency)",),
    )


def boundary_loss(
    region: str,
    clock: str,
    rate: Fraction,
    loss: int,
    boundaries: int,
    session: Fraction,
    span: Span | None,
) -> Diagnostic:
    """Every firing's output is `loss` units short: `boundaries` boundaries in a session of `session` s."""
    lost = loss * boundaries
    return Diagnostic(
        BOUNDARY_LOSS,
        f"region '{region}' loses {units_text(loss, clock)}, {duration_text(Fraction(loss) / rate)} at "
        f"{rate_text(rate)}, at each of {boundaries} boundaries in {duration_text(session)}: "
        f"{units_text(lost, clock)} ({duration_text(lost / rate)}) fewer than one offline call over the same input",
        span,
        notes=(
            Note(
                "each firing's output is short by the loss, as one call of the model is; one offline call loses "
                "it once, a stream of firings at every boundary (heard as a click, and the audio runs early)",
                None,
            ),
        ),
        helps=(
            f"to keep them, carry what the last {units_text(loss, clock)} of a firing wait for: hold them back "
            f"(`latency {loss}`, released by the end of the stream) and keep the state, or a context that covers "
            "the receptive field, so that the next firing completes them",
            f"if the clock reproduces a stock loop that loses them, say so: `loses {loss} intended`",
        ),
    )


# --- the duplex unit: bounded clocks, sliding windows, rows -----------------------------------------


def bound_per(clock: str, per: str, problem: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"clock '{clock}' counts up to its bound per '{per}', which {problem}",
        span,
        helps=(f"`clock {clock} = up to N per unit`, where `unit` is a clock with a rate, e.g. `clock unit = 1 Hz`",),
    )


def bound_too_large(clock: str, count: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"clock '{clock}' ticks up to {count_text(count)} times an instant, over the `firings` limit of "
        f"{count_text(limit)}",
        span,
        helps=(f"check the bound; {_raise_limit('firings', count)}",),
    )


def bounded_input(region: str, clock: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"input '{region}' is on bounded clock '{clock}': `step()` feeds an input the units its clock's exact "
        "rate brings",
        span,
        helps=("put the input on a clock of exact rate; a stage on a bounded clock may read it",),
    )


def bounded_retention(region: str, clock: str, retention: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"region '{region}' on bounded clock '{clock}' keeps `{retention}`, but its length is decided at run "
        "time: it is handed whole, at its capacity",
        span,
        helps=(
            "a region on a bounded clock keeps `slide H to L` (a window with marks), `all horizon H` or "
            "`scratch` (one instant's units)",
        ),
    )


def bounded_writer(
    stage: str, stage_clock: str, region: str, clock: str, per: str, span: Span | None, declared: Span | None
) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"stage '{stage}' on clock '{stage_clock}' advances region '{region}', whose clock '{clock}' counts "
        f"units per tick of '{per}'",
        span,
        notes=(Note(f"'{clock}' is declared here", declared),),
        helps=(f"advance it from a stage on '{per}', or on a clock bounded per '{per}' (`up to N per {per}`)",),
    )


def bounded_advance_missing(stage: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"stage '{stage}' advances region '{region}', on a bounded clock, without saying by how much",
        span,
        helps=("write `+N` (every firing N units) or `up to N` (at most N, decided at run time)",),
    )


def bounded_total(
    region: str, clock: str, bound: int, per: str, total: int, parts: list[str], span: Span | None, notes: list[Note]
) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"region '{region}' on clock '{clock}' gets up to {units(bound)} per tick of '{per}', but its writers "
        f"add up to {total}: {', '.join(parts)}",
        span,
        notes=tuple(notes),
        helps=(f"declare `clock {clock} = up to {total} per {per}`, or correct the advances",),
    )


def burst_advances_exact(stage: str, clock: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"stage '{stage}' on bounded clock '{clock}' advances region '{region}', whose clock has an exact rate: "
        "how often the stage fires is decided at run time",
        span,
        helps=(
            f"put '{region}' on a bounded clock counted per the same clock (`up to N per ...`), or advance it from "
            "a stage of exact rate",
        ),
    )


def burst_reads_new(stage: str, clock: str, region: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"stage '{stage}' on bounded clock '{clock}' reads the new units of region '{region}': which of its "
        "firings would see them is decided at run time",
        span,
        helps=(f"read the units it keeps, `read {region}` or `read {region} last N`",),
    )


def run_time_window(stage: str, region: str, why: str, window: str, slide: bool, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_SLIDE if slide else BAD_BOUND,
        f"stage '{stage}' reads {window} of region '{region}', which {why}: its length is decided at run time, "
        "so it is handed whole",
        span,
        helps=(f"`read {region}`: the whole region, its length a run-time value",),
    )


def up_to_on_exact(stage: str, region: str, clock: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_BOUND,
        f"stage '{stage}' advances region '{region}' `up to` a count, but '{region}' is on clock '{clock}', of "
        "exact rate",
        span,
        helps=(
            "a run-time advance needs a region on a bounded clock (`clock c = up to N per unit`); on an exact "
            "clock write the advance, `+N`",
        ),
    )


def run_time_start(region: str, keyword: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_VALUE,
        f"region '{region}' has a length decided at run time, so `start {keyword}` has no length to fill",
        span,
        helps=("start it `empty`, or `given N` (N units handed over at session start: a prefilled prompt)",),
    )


def slide_marks(region: str, first: int, high: int, low: int, span: Span | None) -> Diagnostic:
    head = f"first {first} + " if first else ""
    legal = f"{head}slide {low} to {high}" if low > high else f"first {low} + slide {high} to {low}"
    return Diagnostic(
        BAD_SLIDE,
        f"region '{region}' keeps `{head}slide {high} to {low}`: the marks must be first <= low <= high",
        span,
        helps=(
            "above the high mark, whole cadences after the pinned first units are dropped until at most the low "
            f"mark remain, so the pinned first units fit under the low mark: e.g. `{legal}`",
        ),
    )


# --- calls that return records, constant keyword arguments, objects made by a stage ---------------


def bad_argument(stage: str, name: str, value: str, span: Span | None) -> Diagnostic:
    """`with NAME = VALUE` whose value is not a plain number, a string or a boolean."""
    return Diagnostic(
        BAD_VALUE,
        f"stage '{stage}' passes keyword '{name}' the value {value}: a `with` value is a plain number, a "
        '"string", true or false',
        span,
        helps=(f'`with {name} = true`, `with {name} = 2`, `with {name} = "text"`',),
    )


def family_field(stage: str, family: str, field: str, count: int, span: Span | None) -> Diagnostic:
    """`update kv from cache` where `kv` has several members: one field cannot hold them all."""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' takes family '{family}' ({count} members) from one field '{field}'",
        span,
        helps=(f"take one member from the field: `update {family}[0] from {field}`, a line for each member",),
    )


def return_without_field(stage: str, item: str, fields: Iterable[str], span: Span | None) -> Diagnostic:
    """A stage whose returns are taken from a record by field, with one return that names no field."""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' takes its returns from the record its call returns ({', '.join(dict.fromkeys(fields))}), but "
        f"`{item}` names no field",
        span,
        helps=(
            f"name the field that holds it: `{item} from FIELD`; or take every return by position (a tuple): "
            "no `from` on any",
        ),
    )


def slide_appended(stage: str, region: str, span: Span | None, declared: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_SLIDE,
        f"stage '{stage}' writes (appends to) region '{region}', a `slide` its stages keep in place",
        span,
        notes=(Note(f"'{region}' keeps a slide here", declared),),
        helps=(f"`update {region} +N`: the stage is handed the whole region and writes its new units in place",),
    )


def slide_role(region: str, role: str, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_SLIDE,
        f"{role} '{region}' keeps a `slide`: an {role} keeps what its readers need, not a window with marks",
        span,
        helps=("keep the window in a state region the stage updates",),
    )


def rows_too_many(stage: str, count: int, limit: int, span: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ROWS,
        f"stage '{stage}' runs on up to {count_text(count)} rows, over the `firings` limit of {count_text(limit)}",
        span,
        helps=(f"check the count; {_raise_limit('firings', count)}",),
    )


def rows_with_run_time_shape(stage: str, region: str, span: Span | None, advance: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ROWS,
        f"stage '{stage}' declares `rows` (a graph per row count), but advances region '{region}' by a count "
        "decided at run time, so its shapes vary",
        span,
        notes=(Note("the run-time advance", advance),),
        helps=("drop `rows` (the stage runs eagerly), or advance by a fixed `+N`",),
    )


def engine_only(kind: str, name: str, span: Span | None) -> Diagnostic:
    """At load: a program with counts decided at run time is a conversation engine's (`kind`: `bound`, a stage
    on a bounded clock; `rows`, a batched stage; `slide`, a region keeping a slide)."""
    code, what = {
        "bound": (BAD_BOUND, f"stage '{name}' is on a bounded clock"),
        "rows": (BAD_ROWS, f"stage '{name}' runs on rows"),
        "slide": (BAD_SLIDE, f"region '{name}' keeps a slide"),
    }[kind]
    return Diagnostic(
        code,
        f"{what}: its counts are decided at run time, and the runtime steps instants whose every shape the plan knows",
        span,
        helps=(
            "a conversation engine steps such a program (interpreter/engine/; it reads the plan with "
            "duplexcadence.interpreter.plans.plan.conversation_plan); load the tail it uses on its own",
        ),
    )


def field_on_bound(stage: str, region: str, field: str, span: Span | None) -> Diagnostic:
    """`update x from f` where x is bound: its new version is left at its attribute, not returned."""
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' takes region '{region}' from field '{field}', but '{region}' is bound: the call "
        "leaves its new version at the bound attribute, and returns nothing for it",
        span,
        helps=(f"drop `from {field}`, or drop the region's `bind` to take it from the record",),
    )


def duplicate_field(stage: str, field: str, span: Span | None, first: Span | None) -> Diagnostic:
    return Diagnostic(
        BAD_ACCESS,
        f"stage '{stage}' takes two returns from the field '{field}'",
        span,
        notes=(Note(f"'{field}' is first taken here", first),),
        helps=("each return has a field of its own",),
    )


def object_stage_not_passing(obj: str, stage: str, span: Span | None, stage_span: Span | None) -> Diagnostic:
    """`object cache from stage decode` where `decode` does not `update cache`."""
    return Diagnostic(
        BAD_OBJECT,
        f"object '{obj}' is made by stage '{stage}', which does not update it: the object is what one call of "
        f"the stage returns in its place, handed None",
        span,
        notes=(Note(f"'{stage}' is declared here", stage_span),),
        helps=(
            f"add `update {obj}` to stage '{stage}', or make the object with a factory: `object {obj} from FACTORY`",
        ),
    )


def clock_member(clock: str, is_family: bool, span: Span | None) -> Diagnostic:
    """`on rate` where `rate` is a family of clocks, or `on frame[1]` where `frame` is one clock."""
    if is_family:
        return Diagnostic(
            BAD_INDEX,
            f"clock '{clock}' is a family of clocks: a region advances on one of its members",
            span,
            helps=(f"name the member, `on {clock}[0]`, or by the region's index, `on {clock}[stage]`",),
        )
    return Diagnostic(
        BAD_INDEX,
        f"clock '{clock}' is one clock, not a family of clocks: it has no members to index",
        span,
        helps=(f"`on {clock}`",),
    )


def clock_family_value(clock: str, span: Span | None) -> Diagnostic:
    """A family of clocks named where one rate is needed (an expression, a stage's or a counter's `on`)."""
    return Diagnostic(
        BAD_RATE,
        f"clock '{clock}' is a family of clocks, with a rate per member: it has no one rate here",
        span,
        helps=(
            f"a region advances on one member, `on {clock}[0]`; a stage or a counter, or an expression, needs a "
            "plain clock: declare one (`clock upsampled = ...`)",
        ),
    )
