"""The `.clock` abstract syntax tree: frozen attrs records, one class per construct.

Each class's docstring shows the surface syntax it stands for. Source positions (`span`) are kept out
of equality and repr, so two parses of equivalent text compare equal whatever their layout.
No Lark type ever appears here: the parser converts everything.
"""

from __future__ import annotations

from fractions import Fraction

import attrs

from duplexcadence.dsl.source import Span


def _span_field():
    return attrs.field(default=None, eq=False, repr=False, kw_only=True)


# --- expressions -------------------------------------------------------------------------------


@attrs.frozen
class Number:
    """An exact rational literal with an optional unit: `250`, `12.5`, `24000 Hz`, `1 s`, `80 ms`.

    `value` is exact (`12.5` is Fraction(25, 2)); `unit` is one of Hz, kHz, s, ms or None.
    """

    value: Fraction
    unit: str | None = None
    span: Span | None = _span_field()


@attrs.frozen
class Name:
    """A reference to a param, a clock or a family index: `B`, `sample`, `layer`."""

    id: str
    span: Span | None = _span_field()


@attrs.frozen
class BinOp:
    """An arithmetic operation: `a + b`, `a - b`, `a * b`, `a / b` (division is exact)."""

    op: str
    left: Expr
    right: Expr
    span: Span | None = _span_field()


@attrs.frozen
class Neg:
    """A negation: `-x`."""

    operand: Expr
    span: Span | None = _span_field()


@attrs.frozen
class ListExpr:
    """A list literal: `[8, 6, 5, 4]`."""

    items: tuple[Expr, ...]
    span: Span | None = _span_field()


@attrs.frozen
class Index:
    """An element of a list: `ratios[0]`."""

    target: Expr
    index: Expr
    span: Span | None = _span_field()


@attrs.frozen
class Call:
    """A built-in function call: `prod(ratios)`, `min(a, b)`, `max(a, b)`, `sum(xs)`, `len(xs)`."""

    func: str
    args: tuple[Expr, ...]
    span: Span | None = _span_field()


Expr = Number | Name | BinOp | Neg | ListExpr | Index | Call


# --- statements --------------------------------------------------------------------------------


@attrs.frozen
class Use:
    """An import: `use std.audio` (every name) or `use std.audio (sample, mel)` (these names)."""

    module: tuple[str, ...]
    names: tuple[str, ...] | None = None
    span: Span | None = _span_field()
    module_span: Span | None = _span_field()
    name_spans: tuple[Span, ...] = attrs.field(default=(), eq=False, repr=False, kw_only=True)

    @property
    def dotted(self) -> str:
        return ".".join(self.module)


@attrs.frozen
class Cadence:
    """The conversation period: `cadence 1 s`."""

    period: Expr
    span: Span | None = _span_field()


@attrs.frozen
class Param:
    """A static value, overridable at load: `param P = 150`, `param ratios = [8, 6, 5, 4]`."""

    name: str
    default: Expr
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()


@attrs.frozen
class Clock:
    """A counter with an exact rate: `clock mel = 50 Hz` or derived, `clock frame = sample / 1920`; a family
    of clocks, one per member, `clock rate[stage < 3] = 7.5 Hz * factors[stage]`.

    With `bound`, a bounded clock: `clock text = up to 21 per unit` ticks up to `bound` times at each tick
    of the clock `rate` names (a `Name`), the count decided at run time."""

    name: str
    rate: Expr
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()
    bound: Expr | None = attrs.field(default=None, kw_only=True)
    family: Family | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Family:
    """The index of a family of regions: the `[layer < 8]` in `region kv[layer < 8] : ...`; `more` holds the
    further indices of `[stage < 6, layer < 3]` (members numbered with the last index fastest)."""

    index: str
    count: Expr
    span: Span | None = _span_field()
    index_span: Span | None = _span_field()
    more: tuple[Family, ...] = attrs.field(default=(), kw_only=True)

    def indices(self) -> tuple[Family, ...]:
        """Every index of the family, in written order, each as a one-index `Family`."""
        return (attrs.evolve(self, more=()), *self.more)


@attrs.frozen
class TimeAxis:
    """The marked time axis inside a shape: the `time` in `f32[B, 512, time]`."""

    span: Span | None = _span_field()


Dim = TimeAxis | Expr


@attrs.frozen
class KeepLast:
    """A sliding window of the newest units, laid out oldest first: `retain last 6`, `retain last 10 s`."""

    count: Expr
    span: Span | None = _span_field()


@attrs.frozen
class KeepRing:
    """A ring of fixed capacity that the module indexes modulo its size: `retain ring 250`.

    The view handed to the module is always the whole ring (constant shape); the fill still grows.
    """

    count: Expr
    span: Span | None = _span_field()


@attrs.frozen
class KeepFirstLast:
    """A pinned head plus a window of the tail: `retain first P + last 100`."""

    first: Expr
    last: Expr
    span: Span | None = _span_field()


@attrs.frozen
class KeepAll:
    """Everything, bounded by a session horizon: `retain all horizon 600 s`."""

    horizon: Expr | None
    span: Span | None = _span_field()


@attrs.frozen
class KeepScratch:
    """Per-firing scratch, dead after the instant that wrote it: `retain scratch`."""

    span: Span | None = _span_field()


@attrs.frozen
class KeepSlide:
    """A window with a high and a low mark: `retain slide 1400 to 0`, `retain first 43 + slide 4000 to 3500`.

    At the end of every cadence in which the region holds more than `high` units, the units of whole
    cadences are dropped from the front until at most `low` remain (what the session starts with, and the
    first `first` units, stay); the module is handed the whole region, its length a run-time value.
    """

    first: Expr | None
    high: Expr
    low: Expr
    span: Span | None = _span_field()


Retention = KeepLast | KeepRing | KeepFirstLast | KeepAll | KeepScratch | KeepSlide


@attrs.frozen
class StartZeros:
    """The region starts full, zero-filled (a causal conv's carry): `start zeros`."""

    span: Span | None = _span_field()


@attrs.frozen
class StartEmpty:
    """The region starts with no units and fills as the stages write: `start empty`."""

    span: Span | None = _span_field()


@attrs.frozen
class StartGiven:
    """The region starts with `count` units given at session start (a prompt): `start given P`;
    a fixed region given whole at session start: `start given`."""

    count: Expr | None = None
    span: Span | None = _span_field()


@attrs.frozen
class StartFirst:
    """The region starts full, each unit a copy of the first unit that arrives in it (fed by `step()` or
    appended by a `write`): replicate padding, `start first`."""

    span: Span | None = _span_field()


@attrs.frozen
class StartFirstFiring:
    """The region starts as its stage's first firing makes it from the data: at that firing the stage is
    handed no value (`None`), as the stock code is before its first call: `start first-firing`."""

    span: Span | None = _span_field()


StartPolicy = StartZeros | StartEmpty | StartGiven | StartFirst | StartFirstFiring


@attrs.frozen
class OnClause:
    """The clock a region's time axis advances on: `on latent`, or a member of a clock family, `on rate[stage]`."""

    clock: str
    span: Span | None = _span_field()
    clock_span: Span | None = _span_field()
    member: Expr | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class RetainClause:
    """How much of a region is kept: `retain last 250` (see the retention classes)."""

    retention: Retention
    span: Span | None = _span_field()


@attrs.frozen
class StartClause:
    """How a region starts a session: `start zeros`, `start empty`, `start given P`."""

    policy: StartPolicy
    span: Span | None = _span_field()


@attrs.frozen
class StockClause:
    """The stock runtime's allocation for the memory report: `stock 1000` (time axis) or a whole shape
    `stock [16, 16, 2, 8, 1000, 128]`."""

    capacity: Expr
    span: Span | None = _span_field()


@attrs.frozen
class BindClause:
    """The module attribute the region binds to, from the model root; `{index}` names a family index:
    `bind "decoder.model.0.carry"`; `private` allows private segments (`_x`) in the path:
    `bind private "decoder.model.0._streaming_state.previous"`. With an object's name before the path,
    the path starts at that caller-owned object instead of the model: `bind caches "layers[0].k"`."""

    path: str
    private: bool = False
    owner: str | None = None
    span: Span | None = _span_field()
    path_span: Span | None = _span_field()


@attrs.frozen
class RoleClause:
    """Marks a region as a tick's input (fed by `step`) or output (returned by `step`): `input`, `output`."""

    role: str
    span: Span | None = _span_field()


RegionClause = OnClause | RetainClause | StartClause | StockClause | BindClause | RoleClause


@attrs.frozen
class Region:
    """A tensor of streaming state or I/O::

        region NAME[INDEX < COUNT]? : DTYPE[DIM, ..., time, ...] CLAUSE*

    A shape without `time` declares a fixed region: per-session state of constant shape (a position
    counter, a packed carry) that is updated in place and needs no clock or retention; with
    `retain scratch` it is instead a working buffer shared by every session. For example `region prev0 : f32[B, 512, time] on latent retain last 6 start zeros bind "decoder.model.0..."`.
    Clauses keep their written order (so the canonical printer can round-trip them).
    """

    name: str
    family: Family | None
    dtype: str
    shape: tuple[Dim, ...]
    clauses: tuple[RegionClause, ...]
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()
    dtype_span: Span | None = _span_field()

    def clauses_of(self, kind: type) -> list:
        return [c for c in self.clauses if isinstance(c, kind)]

    def clause(self, kind: type):
        found = self.clauses_of(kind)
        return found[0] if found else None


@attrs.frozen
class RegionRef:
    """A region named inside a stage: a region or a whole family `kv`, or one member `kv[3]`."""

    name: str
    index: Expr | None = None
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()


@attrs.frozen
class SpanLast:
    """A read of the newest units only: the `last 3840` in `read pcm last 3840`."""

    count: Expr
    span: Span | None = _span_field()


@attrs.frozen
class SpanNew:
    """A read of the units written since the stage last fired, plus up to `context` older ones:
    the `new + 25` in `read codes new + 25` (or just `new`)."""

    context: Expr | None
    span: Span | None = _span_field()


@attrs.frozen
class ModuleItem:
    """The callable of a stage, an attribute path from the model root (`""` is the root itself):
    `module "decoder"`; `private` allows private segments (`_x`): `module private "_orig_mod"`."""

    path: str
    private: bool = False
    span: Span | None = _span_field()
    path_span: Span | None = _span_field()


@attrs.frozen
class HookItem:
    """A Python callable registered under a name when the runtime is loaded: `hook decode_frame`."""

    name: str
    span: Span | None = _span_field()


@attrs.frozen
class ReadItem:
    """A read of a region by a stage::

        read [prev] REGION [last N | new [+ C]] [lookahead L] [as ARG]

    Without `prev` the read sees this instant's writes (dataflow order); with `prev`, the version
    before them (it breaks a cycle). An unbound region is passed as a positional argument, or as
    keyword `ARG` with `as`.
    """

    region: RegionRef
    span_clause: SpanLast | SpanNew | None = None
    lookahead: Expr | None = None
    alias: str | None = None
    prev: bool = False
    span: Span | None = _span_field()
    alias_span: Span | None = _span_field()


@attrs.frozen
class UpdateItem:
    """A read-modify-write of a state region that advances it by N units per firing: `update kv +2`;
    a fixed region (no time axis, e.g. a counter) is updated without an advance: `update offsets`.
    `update cache as padding_cache from padding_cache`: passed as keyword `padding_cache`, and taken back
    from the field `padding_cache` of the record the call returns."""

    region: RegionRef
    advance: Expr | None = None
    alias: str | None = None
    field: str | None = None
    span: Span | None = _span_field()
    alias_span: Span | None = _span_field()
    field_span: Span | None = _span_field()
    up_to: bool = attrs.field(default=False, kw_only=True)
    """`update kv up to 19`: the advance is decided at run time, at most `advance` units."""


@attrs.frozen
class WriteItem:
    """New units produced into a region per firing: `write pcm +1920`, `write pcm +24000 latency 3840`
    (the first firing emits `advance - latency`, the end of the stream releases it), `write wav +1920
    latency 555 dropped` (never released), `write wav loses 555` (every firing is 555 units short, as
    one stock call is: a chunked stream loses them at every boundary; `loses 555 intended` marks that
    as chosen), or `write pcm` (advance derived from the clocks)."""

    region: RegionRef
    advance: Expr | None = None
    latency: Expr | None = None
    latency_dropped: bool = False
    loss: Expr | None = None
    loss_intended: bool = False
    field: str | None = None
    span: Span | None = _span_field()
    field_span: Span | None = _span_field()
    up_to: bool = attrs.field(default=False, kw_only=True)
    """`write text up to 18`: the advance is decided at run time, at most `advance` units."""


@attrs.frozen
class RngItem:
    """The stage draws random numbers: each session keeps its own generator state: `rng`."""

    span: Span | None = _span_field()


@attrs.frozen
class RowsItem:
    """The stage runs on 1 to `count` conversations at once, each a row of its batch: `rows conversations`."""

    count: Expr
    span: Span | None = _span_field()


@attrs.frozen
class WithItem:
    """A constant keyword argument of the stage's call: `with use_cache = true`, `with mode = "zeros"`,
    `with chunk = 2 * B`. `value` is an expression, a string (`str`) or a boolean (`bool`)."""

    name: str
    value: Expr | str | bool
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()


StageItem = ModuleItem | HookItem | ReadItem | UpdateItem | WriteItem | RngItem | RowsItem | WithItem


@attrs.frozen
class Stage:
    """A computation that fires on every tick of a clock::

    stage NAME on CLOCK { ITEM* }
    """

    name: str
    clock: str
    items: tuple[StageItem, ...]
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()
    clock_span: Span | None = _span_field()

    def items_of(self, kind: type) -> list:
        return [i for i in self.items if isinstance(i, kind)]


@attrs.frozen
class Counter:
    """A step count the runtime keeps: `counter step +2 on frame`, `counter pos +1 mod 4096 on frame
    bind "encoder.offset"`. It holds `step x (ticks of CLOCK before the instant)`, reduced modulo `mod`;
    hooks get it as a Python int (`firing.counters`), stages as a 0-d i64 device scalar (`read step`,
    or its `bind`)."""

    name: str
    step: Expr
    modulo: Expr | None
    clock: str
    bind: BindClause | None = None
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()
    clock_span: Span | None = _span_field()


@attrs.frozen
class Object:
    """An object the stock call takes and returns (a cache container), made per session by the factory
    hook `factory`, made at load by one call of the stage `stage` (handed None in its place, as a stock
    loop starts), or given at load: `object caches from new_caches`, `object cache from stage decode`,
    `object caches`."""

    name: str
    factory: str | None = None
    span: Span | None = _span_field()
    name_span: Span | None = _span_field()
    factory_span: Span | None = _span_field()
    stage: str | None = attrs.field(default=None, kw_only=True)
    stage_span: Span | None = _span_field()


Statement = Use | Cadence | Param | Clock | Region | Stage | Counter | Object


@attrs.frozen
class Comment:
    """A comment, from `#` to the end of its line (kept so that `dsl fmt` can put it back)."""

    text: str
    span: Span | None = _span_field()


@attrs.frozen
class Module:
    """One parsed `.clock` file: its statements in written order.

    `comments` (out of equality) are the file's comments in order, with their positions.
    """

    path: str
    statements: tuple[Statement, ...]
    comments: tuple[Comment, ...] = attrs.field(default=(), eq=False, repr=False, kw_only=True)

    def of(self, kind: type) -> list:
        return [s for s in self.statements if isinstance(s, kind)]
