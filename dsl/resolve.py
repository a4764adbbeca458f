"""Resolve names and evaluate values: loaded units -> a `Program` (or every error found).

One namespace holds params, clocks, regions and stages of the main file and of what it imports.
Params may be overridden at load (`--param P=200`); values are exact. Families are expanded into
their members (`kv[0]` ... `kv[7]`) with `{index}` placeholders filled in their bindings.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Literal, TypeVar

import attrs

from duplexcadence.dsl import messages, syntax
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic, DiagnosticBag
from duplexcadence.dsl.evaluate import (
    HERTZ,
    PLAIN,
    SECONDS,
    EvalError,
    Quantity,
    count_of,
    evaluate,
    require_int,
    unit_name,
)
from duplexcadence.dsl.limits import DEFAULT_LIMITS, Limits
from duplexcadence.dsl.loader import Loaded
from duplexcadence.dsl.parse import parse_value
from duplexcadence.dsl.program import (
    Access,
    ClockInfo,
    CounterInfo,
    ObjectInfo,
    ObjectPass,
    Program,
    RegionInfo,
    Retention,
    StageInfo,
)
from duplexcadence.dsl.source import Span

MAX_SUGGESTION_WORK = 200_000
"""Name comparisons per check spent on did-you-mean suggestions (about half a second)."""

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PATH_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[0-9]+\])*$|^[0-9]+$")

DeclaredNode = (
    syntax.Cadence | syntax.Param | syntax.Clock | syntax.Region | syntax.Stage | syntax.Counter | syntax.Object
)
"""A statement that declares a name (every statement but `use`)."""

_Node = TypeVar("_Node", bound=DeclaredNode)


def path_problem(path: str) -> str | None:
    """Why `path` is not an attribute path from the model root (`decoder.model.0.conv`), or None."""
    if path.strip() == "":
        return "is empty"
    for part in path.split("."):
        if part == "":
            return "has an empty part between dots"
        if not _PATH_PART.match(part):
            return f"has the part '{part}', which is neither an attribute name nor a list index"
    return None


def unsafe_segment(path: str, private: bool) -> tuple[int, str, bool] | None:
    """The first segment of `path` that could lead out of the model, as (offset in `path`, segment,
    whether it is a dunder), or None. A path names public attributes; a dunder segment (`__x`, the
    way to a class, its functions and their module's globals) is never allowed; a private one (`_x`)
    only with `private` (upstream code that keeps its state there, like moshi's `_streaming_state`)."""
    offset = 0
    for part in path.split("."):
        name = part.split("[", 1)[0]
        if name.startswith("__"):
            return offset, name, True
        if name.startswith("_") and not private:
            return offset, name, False
        offset += len(part) + 1
    return None


def segment_span(path_span: Span | None, offset: int, segment: str) -> Span | None:
    """Where a segment of a path is written: inside its string, after the opening quote."""
    if path_span is None:
        return None
    column = path_span.column + 1 + offset
    return Span(path_span.path, path_span.line, column, path_span.line, column + len(segment))


@attrs.frozen
class Declaration:
    kind: str  # param, clock, region, stage, cadence, counter, object: the node's class, lowercase
    name: str
    node: DeclaredNode
    unit: str

    def node_as(self, node_class: type[_Node]) -> _Node:
        """The declared node, of the class that `kind` names."""
        assert isinstance(self.node, node_class), f"a {self.kind} declares a {type(self.node).__name__}"
        return self.node

    @property
    def span(self) -> Span | None:
        return self.node.span

    @property
    def name_span(self) -> Span | None:
        """Where the declared name is written (the whole statement for a cadence)."""
        return getattr(self.node, "name_span", None) or self.span


class Suggestions:
    """The did-you-mean budget of one check: a suggestion compares the unknown name with every
    candidate, so thousands of unknown names among thousands of declarations would take minutes;
    once MAX_SUGGESTION_WORK comparisons are spent, diagnostics come without a suggestion."""

    def __init__(self, budget: int = MAX_SUGGESTION_WORK):
        self.remaining = budget

    def offer(self, candidates: Iterable[str]) -> list[str] | None:
        """The candidates (read only here: pass a lazy iterable) while the budget covers comparing a
        name with each of them, else None."""
        if self.remaining <= 0:
            return None
        names = list(candidates)
        if len(names) > self.remaining:
            self.remaining = 0
            return None
        self.remaining -= max(len(names), 1)
        return names


class _UnitScope:
    """The names one unit sees and where each was declared or imported; a second declaration of a
    name is reported to `bag`."""

    def __init__(self, bag: DiagnosticBag) -> None:
        self.bag = bag
        self.names: dict[str, Declaration] = {}
        self.where: dict[str, tuple[Span | None, bool]] = {}

    def add(self, declaration: Declaration, at: Span | None, imported: bool = False) -> None:
        existing = self.names.get(declaration.name)
        if existing is None:
            self.names[declaration.name] = declaration
            self.where[declaration.name] = (at, imported)
        elif existing.node is not declaration.node:
            first, first_imported = self.where[declaration.name]
            if declaration.kind == "cadence":
                self.bag.add(messages.duplicate_cadence(at, first, first_imported))
            else:
                self.bag.add(
                    messages.duplicate_name(
                        declaration.kind, declaration.name, at, first, existing.kind, first_imported
                    )
                )


def collect_declarations(
    loaded: Loaded, bag: DiagnosticBag, suggestions: Suggestions | None = None
) -> dict[str, dict[str, Declaration]]:
    """The names visible in each unit: its own declarations and what its `use`s bring in."""
    suggestions = suggestions or Suggestions()
    visible: dict[str, dict[str, Declaration]] = {}
    for key, unit in loaded.units.items():  # children are inserted before their importers
        scope = _UnitScope(bag)
        for use, target in unit.imports:
            exported = visible.get(target)
            if exported is None:  # the imported unit did not load; its own errors say why
                continue
            if use.names is None:
                for declaration in exported.values():
                    scope.add(declaration, use.module_span or use.span, True)
                continue
            spans = use.name_spans if len(use.name_spans) == len(use.names) else (use.span,) * len(use.names)
            for name, at in zip(use.names, spans):
                if name not in exported:
                    bag.add(messages.unknown_imported_name(use.dotted, name, at, suggestions.offer(exported)))
                    continue
                scope.add(exported[name], at, True)
        for statement in unit.module.statements:
            if isinstance(statement, syntax.Use):
                continue
            if isinstance(statement, syntax.Cadence):
                scope.add(Declaration("cadence", "cadence", statement, key), statement.span)
                continue
            kind = type(statement).__name__.lower()
            declaration = Declaration(kind, statement.name, statement, key)
            scope.add(declaration, declaration.name_span)
        visible[key] = scope.names
    return visible


class _Resolver:
    def __init__(self, loaded: Loaded, overrides: Mapping[str, str], limits: Limits = DEFAULT_LIMITS):
        self.loaded = loaded
        self.limits = limits
        self.region_count = 0  # regions made so far, family members counted (against limits.regions)
        self.bag = DiagnosticBag()
        self.suggestions = Suggestions()
        self.scopes = collect_declarations(loaded, self.bag, self.suggestions)
        self.units = [loaded.main]  # the unit whose names are in scope: a declaration sees its own file's names
        self.overrides = dict(overrides)
        self.overrides_reported: set[str] = set()  # overridden params a bad dimension has been reported for
        self.values: dict[tuple[str, str], Quantity] = {}
        self.evaluating: list[tuple[str, str]] = []
        self.broken: set[tuple[str, str]] = set()
        # What the program is made of, by canonical name (see `canonical`), filled on demand.
        self.clocks: dict[str, ClockInfo] = {}
        self.regions: dict[str, RegionInfo] = {}
        self.families: dict[str, tuple[str, ...]] = {}
        self.resolved_clocks: dict[int, ClockInfo | None] = {}
        self.resolved_families: dict[int, list[ClockInfo] | None] = {}  # families of clocks, by declaration
        self.resolved_regions: dict[int, list[RegionInfo] | None] = {}
        self.kinds: dict[tuple[str, str], dict[str, Declaration]] = {}  # of_kind, per unit in scope
        self.counters: dict[str, CounterInfo] = {}
        self.objects: dict[str, ObjectInfo] = {}
        self.resolved_counters: dict[int, list[RegionInfo] | None] = {}

    @property
    def decls(self) -> dict[str, Declaration]:
        return self.scopes[self.units[-1]]

    def in_scope_of(self, declaration: Declaration):
        resolver = self

        class _Scope:
            def __enter__(self):
                resolver.units.append(declaration.unit)

            def __exit__(self, *exc):
                resolver.units.pop()

        return _Scope()

    # --- names ---------------------------------------------------------------------------------

    def of_kind(self, kind: str) -> dict[str, Declaration]:
        key = (self.units[-1], kind)
        if key not in self.kinds:
            self.kinds[key] = {n: d for n, d in self.decls.items() if d.kind == kind}
        return self.kinds[key]

    def lookup_value(self, node: syntax.Name, local: Mapping[str, int] | None = None) -> Quantity:
        if local and node.id in local:
            return Quantity(Fraction(local[node.id]))
        declaration = self.decls.get(node.id)
        if declaration is not None and declaration.kind == "clock" and declaration.node_as(syntax.Clock).family:
            raise EvalError(messages.clock_family_value(node.id, node.span))
        if declaration is not None and declaration.kind in ("param", "clock"):
            return self.value_of(declaration)
        candidates = self.suggestions.offer(itertools.chain(self.of_kind("param"), self.of_kind("clock"), local or ()))
        if declaration is None:
            raise EvalError(messages.unknown_name("name", node.id, node.span, candidates))
        if declaration.kind not in ("param", "clock"):
            raise EvalError(
                messages.wrong_kind_of_name(
                    node.id, declaration.kind, "param or clock", node.span, declaration.span, candidates
                )
            )
        return self.value_of(declaration)

    def value_of(self, declaration: Declaration) -> Quantity:
        name = declaration.name
        key = (declaration.unit, name)
        if key in self.values:
            return self.values[key]
        if key in self.broken:
            raise _Skip()
        if key in self.evaluating:
            cycle = [n for _, n in self.evaluating[self.evaluating.index(key) :]] + [name]
            raise EvalError(_depends_on_itself(declaration, cycle))
        if not self.evaluating:
            self._evaluate_dependencies_first(declaration)
            if key in self.broken:
                raise _Skip()
        self.evaluating.append(key)
        try:
            with self.in_scope_of(declaration):
                if declaration.kind == "param":
                    value = self._param_value(declaration)
                else:
                    value = self._clock_value(declaration)
        except EvalError as error:
            self.broken.add(key)
            self.bag.extend(error.diagnostics)
            raise _Skip() from None
        except _Skip:  # it depends on a broken one: broken too, so that nothing evaluates it again
            self.broken.add(key)
            raise
        finally:
            self.evaluating.pop()
        self.values[key] = value
        return value

    def _dependencies(self, declaration: Declaration) -> list[Declaration]:
        """The params and clocks `declaration`'s value names, in the order its evaluation meets them."""
        node = declaration.node
        assert isinstance(node, (syntax.Param, syntax.Clock)), "only params and clocks have values"
        expr = node.default if isinstance(node, syntax.Param) else node.rate
        scope = self.scopes[declaration.unit]
        found = []
        for name in names_in_order(expr):
            other = scope.get(name)
            if other is not None and other.kind in ("param", "clock") and not getattr(other.node, "family", None):
                found.append(other)
        return found

    def _evaluate_dependencies_first(self, root: Declaration) -> None:
        """Evaluate everything `root` depends on, deepest first, with an explicit stack: each value is
        then computed from values already known, so a chain of thousands of params never recurses
        (Python's stack would overflow). A cycle is reported here, as `value_of` would, at the first
        declaration met again, and all of its members become broken."""
        on_path: dict[tuple[str, str], int] = {}  # key -> position on `path`
        done: set[tuple[str, str]] = set()
        path: list[Declaration] = [root]
        on_path[(root.unit, root.name)] = 0
        stack = [iter(self._dependencies(root))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                finished = path.pop()
                key = (finished.unit, finished.name)
                del on_path[key]
                done.add(key)
                if finished is not root and key not in self.values and key not in self.broken:
                    with contextlib.suppress(_Skip):
                        self.value_of(finished)
                continue
            key = (child.unit, child.name)
            if key in self.values or key in self.broken or key in done:
                continue
            if key in on_path:
                members = path[on_path[key] :]
                cycle = [member.name for member in members] + [child.name]
                self.bag.add(_depends_on_itself(child, cycle))
                self.broken.update((member.unit, member.name) for member in members)
                continue
            on_path[key] = len(path)
            path.append(child)
            stack.append(iter(self._dependencies(child)))

    def _param_value(self, declaration: Declaration) -> Quantity:
        node = declaration.node_as(syntax.Param)
        default = evaluate(node.default, self.lookup_value)
        visible = self.scopes[self.loaded.main].get(declaration.name)
        if declaration.name not in self.overrides or visible is None or visible.node is not node:
            return default  # only the params the main file declares or imports can be overridden
        text = self.overrides[declaration.name]
        try:
            given = evaluate(parse_value(text), _no_names)
        except ClockError as error:
            self.bag.add(
                messages.override_kind(
                    declaration.name, default.kind, default.describe(), text, error.diagnostics[0].message, node.span
                )
            )
            return default
        problem = kind_mismatch(default, given)
        if problem is not None:
            self.bag.add(
                messages.override_kind(declaration.name, default.kind, default.describe(), text, problem, node.span)
            )
            return default
        return given

    def _clock_value(self, declaration: Declaration) -> Quantity:
        node = declaration.node_as(syntax.Clock)
        rate = evaluate(node.rate, self.lookup_value)
        if isinstance(rate.value, tuple) or rate.unit != HERTZ:
            raise EvalError(messages.bad_rate(declaration.name, f"is {rate.describe()}, not a rate in Hz", node.span))
        if rate.value <= 0:
            raise EvalError(
                messages.bad_rate(declaration.name, f"has rate {rate.describe()}; a rate must be positive", node.span)
            )
        return rate

    def evaluate_in(self, expr: syntax.Expr, local: Mapping[str, int] | None = None) -> Quantity:
        return evaluate(expr, lambda n: self.lookup_value(n, local))

    # --- the program ---------------------------------------------------------------------------

    def canonical(self, declaration: Declaration) -> str:
        """The name a declaration has in the Program: its own name where the main file sees it, else
        `module.name` (a declaration another module needs but the main file did not import)."""
        visible = self.scopes[self.loaded.main].get(declaration.name)
        if visible is not None and visible.node is declaration.node:
            return declaration.name
        return f"{self.loaded.units[declaration.unit].dotted}.{declaration.name}"

    def canonical_uses(self, declaration: Declaration, node, local: Mapping[str, int] | None = None) -> tuple[str, ...]:
        """The canonical names of the declarations `node`'s expressions mention (in its own scope)."""
        scope = self.scopes[declaration.unit]
        return tuple(
            sorted(
                self.canonical(scope[name]) for name in free_names(node) if name in scope and name not in (local or {})
            )
        )

    def resolve(self) -> Program:
        params_in_main = self.of_kind("param")
        for name in self.overrides:
            if name not in params_in_main:
                self.bag.add(messages.override_unknown(name, params_in_main))
        for declaration in params_in_main.values():
            try:
                self.value_of(declaration)
            except (_Skip, EvalError) as error:
                if isinstance(error, EvalError):
                    self.bag.extend(error.diagnostics)
        for declaration in self.of_kind("clock").values():
            if declaration.node_as(syntax.Clock).family is not None:
                self.clock_members(declaration)
            else:
                self.clock_info(declaration)
        cadence, cadence_span = self._cadence()
        for declaration in self.of_kind("region").values():
            self.region_members(declaration)
        for declaration in self.of_kind("counter").values():
            self.counter_region(declaration)
        for declaration in self.of_kind("object").values():
            self.object_info(declaration)
        stages: dict[str, StageInfo] = {}
        stages_left_out = False
        for position, (name, declaration) in enumerate(self.of_kind("stage").items()):
            if position == self.limits.stages:  # reported once, at the first stage over; the rest are left out
                total = len(self.of_kind("stage"))
                self.bag.add(messages.too_many_stages(name, total, self.limits.stages, declaration.name_span))
                stages_left_out = True
                break
            with self.in_scope_of(declaration):
                stage = self._stage(declaration.node_as(syntax.Stage))
            if stage is not None:
                stages[name] = stage
            else:
                stages_left_out = True
        if stages and cadence is None and "cadence" not in self.decls:
            first = next(iter(self.of_kind("stage").values()))
            self.bag.add(messages.missing_cadence(first.name_span))
        params: dict[str, object] = {}
        for (unit, name), value in self.values.items():
            declared = self.scopes[unit].get(name)
            if declared is not None and declared.kind == "param":
                params[self.canonical(declared)] = _python_value(value)
        return Program(
            self.loaded.main,
            cadence or Fraction(1),
            params,
            dict(self.clocks),
            dict(self.regions),
            dict(self.families),
            stages,
            cadence_span=cadence_span,
            incomplete=bool(self.bag.errors),
            stages_left_out=stages_left_out,
            limits=self.limits,
            counters=dict(self.counters),
            objects=dict(self.objects),
        )

    def clock_info(self, declaration: Declaration, span: Span | None = None) -> ClockInfo | None:
        """The clock's exact rate, added to the program; None if it failed (reported once). A family of clocks
        has no one rate: reported at `span`, where it is used."""
        if declaration.node_as(syntax.Clock).family is not None:
            self.bag.add(messages.clock_family_value(declaration.name, span or declaration.span))
            return None
        key = id(declaration.node)
        if key not in self.resolved_clocks:
            try:
                rate = self.value_of(declaration).fraction  # a clock's value is a rate (`_clock_value`)
            except (_Skip, EvalError) as error:
                if isinstance(error, EvalError):
                    self.bag.extend(error.diagnostics)
                self.resolved_clocks[key] = None
            else:
                name = self.canonical(declaration)
                node = declaration.node_as(syntax.Clock)
                bound = self._bound(declaration, node) if node.bound is not None else None
                if node.bound is not None and bound is None:
                    self.resolved_clocks[key] = None
                    return None
                info = ClockInfo(
                    name,
                    rate,
                    self.canonical_uses(declaration, node),
                    span=declaration.span,
                    bound=bound[0] if bound else None,
                    per=bound[1] if bound else None,
                )
                self.clocks[name] = info
                self.resolved_clocks[key] = info
        return self.resolved_clocks[key]

    def _bound(self, declaration: Declaration, node: syntax.Clock) -> tuple[int, str] | None:
        """A bounded clock's bound and the clock it counts per (`up to N per CLOCK`); None when either is
        wrong (reported): CLOCK must be a clock of its own rate, N a whole number of firings."""
        assert node.bound is not None and isinstance(node.rate, syntax.Name), "the grammar writes `per NAME`"
        per = self.scopes[declaration.unit].get(node.rate.id)
        if per is None or per.kind != "clock" or per.node_as(syntax.Clock).bound is not None:
            problem = (
                "is bounded itself: count per a clock of exact rate"
                if per is not None and per.kind == "clock"
                else f"is {'not declared' if per is None else 'a ' + per.kind}, not a clock"
            )
            self.bag.add(messages.bound_per(declaration.name, node.rate.id, problem, node.rate.span))
            return None
        with self.in_scope_of(declaration):
            count = self._firings_count(
                node.bound,
                f"the bound of clock '{node.name}'",
                lambda value, limit, span: messages.bound_too_large(declaration.name, value, limit, span),
            )
        return None if count is None else (count, self.canonical(per))

    def _firings_count(
        self, expr: syntax.Expr, what: str, too_many: Callable[[int, int, Span | None], Diagnostic]
    ) -> int | None:
        """A positive whole count within the `firings` limit (a bound, rows); None when it is not (reported)."""
        try:
            count = require_int(self.evaluate_in(expr), expr, what, 1)
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None
        except _Skip:
            return None
        if count > self.limits.firings:
            self.bag.add(too_many(count, self.limits.firings, expr.span))
            return None
        return count

    def region_members(self, declaration: Declaration) -> list[RegionInfo] | None:
        """The region (or the family's members), added to the program; None if it failed."""
        key = id(declaration.node)
        if key not in self.resolved_regions:
            self.resolved_regions[key] = None  # a region never depends on itself; this guards anyway
            with self.in_scope_of(declaration):
                members = self._region(declaration)
            self.resolved_regions[key] = members
            if members is not None:
                if declaration.node_as(syntax.Region).family is not None:
                    self.families[self.canonical(declaration)] = tuple(m.name for m in members)
                for member in members:
                    self.regions[member.name] = member
        return self.resolved_regions[key]

    def _cadence(self) -> tuple[Fraction | None, Span | None]:
        declaration = self.decls.get("cadence")
        if declaration is None or declaration.kind != "cadence":
            return None, None
        node = declaration.node_as(syntax.Cadence)
        try:
            with self.in_scope_of(declaration):
                period = self.evaluate_in(node.period)
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None, node.span
        except _Skip:
            return None, node.span
        if isinstance(period.value, tuple) or period.unit != SECONDS:
            self.bag.add(messages.bad_cadence(f"is {period.describe()}, not a duration", node.span))
            return None, node.span
        if period.value <= 0:
            self.bag.add(messages.bad_cadence(f"is {period.describe()}; it must be positive", node.span))
            return None, node.span
        return period.value, node.span

    def _region(self, declaration: Declaration) -> list[RegionInfo] | None:
        node = declaration.node_as(syntax.Region)
        ok = True
        for kind, label in (
            (syntax.OnClause, "on"),
            (syntax.RetainClause, "retain"),
            (syntax.StartClause, "start"),
            (syntax.StockClause, "stock"),
            (syntax.BindClause, "bind"),
            (syntax.RoleClause, None),
        ):
            found = node.clauses_of(kind)
            for extra in found[1:]:
                if label is None and extra.role != found[0].role:
                    self.bag.add(messages.input_and_output(node.name, extra.span, found[0].span))
                else:
                    self.bag.add(messages.duplicate_clause(label or extra.role, node.name, extra.span, found[0].span))
                ok = False
        name_span = node.name_span or node.span
        if node.dtype not in messages.DTYPES:
            self.bag.add(messages.unknown_dtype(node.dtype, node.dtype_span))
            ok = False
        time_axes = [d for d in node.shape if isinstance(d, syntax.TimeAxis)]
        on = node.clause(syntax.OnClause)
        role_clause = node.clause(syntax.RoleClause)
        role = role_clause.role if role_clause else "state"
        if len(time_axes) > 1:
            self.bag.add(messages.time_axis_count(node.name, len(time_axes), time_axes[1].span or name_span))
            ok = False
        elif not time_axes and role != "state":
            self.bag.add(messages.time_axis_count(node.name, 0, role_clause.span or name_span))
            ok = False
        if not time_axes:
            retain = node.clause(syntax.RetainClause)
            if retain is not None and isinstance(retain.retention, syntax.KeepScratch):
                retain = None  # a fixed scratch region is a working buffer shared by every session
            for clause in (retain, on):
                if clause is not None:
                    self.bag.add(
                        messages.fixed_with_clause(node.name, "retain" if clause is not on else "on", clause.span)
                    )
                    ok = False
        clock = None
        if on is None and time_axes:
            self.bag.add(messages.missing_clock(node.name, name_span))
            ok = False
        clock_family: list[ClockInfo] | None = None
        if time_axes and on is not None:
            clock_declaration = self.decls.get(on.clock)
            if clock_declaration is None or clock_declaration.kind != "clock":
                self._unknown(on.clock, "clock", on.clock_span or on.span)
                ok = False
            elif on.member is not None or clock_declaration.node_as(syntax.Clock).family is not None:
                clock_family = self._clock_family_of(clock_declaration, on)
                ok = ok and clock_family is not None
            else:
                clock = self.clock_info(clock_declaration)
                ok = ok and clock is not None
        counts = (
            [self._family_count("region", node.name, index) for index in node.family.indices()] if node.family else []
        )
        ok = ok and None not in counts
        count = math.prod(c for c in counts if c is not None)
        bind_clause = node.clause(syntax.BindClause)
        if (
            ok
            and node.family is not None
            and count > 1
            and bind_clause is not None
            and not _PLACEHOLDER.search(bind_clause.path)  # an unknown placeholder is reported by `_bind`
        ):
            self.bag.add(
                messages.family_bind_without_index(
                    node.name, bind_clause.path, count, node.family.index, bind_clause.span
                )
            )
            ok = False
        if not ok:
            return None
        if self.region_count + count > self.limits.regions:  # checked before a member is made
            if self.region_count <= self.limits.regions:  # reported once: the regions after it are left out
                span = node.family.count.span if node.family is not None else name_span
                members_count = count if node.family is not None else None
                self.bag.add(
                    messages.too_many_regions(
                        node.name, members_count, self.region_count + count, self.limits.regions, span
                    )
                )
            self.region_count = self.limits.regions + 1
            return None
        self.region_count += count
        time_axis = next((i for i, d in enumerate(node.shape) if isinstance(d, syntax.TimeAxis)), None)
        names = [f.index for f in node.family.indices()] if node.family else []
        members = []
        for index, numbers in enumerate(itertools.product(*(range(c) for c in counts if c is not None))):
            local = dict(zip(names, numbers, strict=True))
            if clock_family is not None:
                clock = self._member_clock(node.name, clock_family, on, local)
                if clock is None:
                    return None
            member = self._member(declaration, index if node.family else None, local, clock, role, time_axis)
            if member is None:
                return None
            members.append(member)
        return members

    def _family_count(self, kind: str, region: str, family: syntax.Family) -> int | None:
        """How many values an index of a family of `kind` (region, clock) takes (reported, None, when its count
        is not a positive integer or it shadows a param or a clock)."""
        shadowed = self.decls.get(family.index)
        if shadowed is not None and shadowed.kind in ("param", "clock"):
            self.bag.add(
                messages.shadowing_index(family.index, region, shadowed.kind, family.index_span, shadowed.name_span)
            )
            return None
        try:
            value = self.evaluate_in(family.count)
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None
        except _Skip:
            return None
        if isinstance(value.value, tuple) or value.unit != PLAIN or value.value.denominator != 1 or value.value < 1:
            self.bag.add(messages.bad_family(kind, region, value.describe(), family.count.span))
            return None
        return value.value.numerator

    def _clock_family_of(self, declaration: Declaration, on: syntax.OnClause) -> list[ClockInfo] | None:
        """The members of the family of clocks a region's `on NAME[INDEX]` names (reported, None, when `on` names
        a plain clock with an index or a family of clocks without one)."""
        family = declaration.node_as(syntax.Clock).family
        if family is None or on.member is None:
            self.bag.add(messages.clock_member(on.clock, family is not None, on.span))
            return None
        return self.clock_members(declaration)

    def _member_clock(
        self, region: str, members: list[ClockInfo], on: syntax.OnClause, local: dict[str, int]
    ) -> ClockInfo | None:
        """The member of a family of clocks that `on NAME[INDEX]` picks for one member of a region."""
        assert on.member is not None, "a region on a family of clocks names its member (`_clock_family_of`)"
        try:
            position = require_int(self.evaluate_in(on.member, local), on.member, "a clock family index")
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None
        except _Skip:
            return None
        if not 0 <= position < len(members):
            self.bag.add(messages.index_out_of_range(on.clock, str(position), len(members), on.member.span))
            return None
        return members[position]

    def clock_members(self, declaration: Declaration) -> list[ClockInfo] | None:
        """A family of clocks' members (`rate[0]`, `rate[1]`, ...), each with its exact rate, added to the
        program; None if one failed (reported once)."""
        key = id(declaration.node)
        if key in self.resolved_families:
            return self.resolved_families[key]
        self.resolved_families[key] = None
        node = declaration.node_as(syntax.Clock)
        assert node.family is not None, "a family of clocks declares its index"
        with self.in_scope_of(declaration):
            counts = [self._family_count("clock", node.name, index) for index in node.family.indices()]
            if None in counts:
                return None
            names = [f.index for f in node.family.indices()]
            base = self.canonical(declaration)
            members = []
            for position, numbers in enumerate(itertools.product(*(range(c) for c in counts if c is not None))):
                local = dict(zip(names, numbers, strict=True))
                name = f"{base}[{position}]"
                try:
                    rate = self.evaluate_in(node.rate, local)
                except EvalError as error:
                    self.bag.extend(error.diagnostics)
                    return None
                except _Skip:
                    return None
                if isinstance(rate.value, tuple) or rate.unit != HERTZ or rate.value <= 0:
                    self.bag.add(messages.bad_rate(name, f"is {rate.describe()}, not a positive rate in Hz", node.span))
                    return None
                info = ClockInfo(
                    name, rate.fraction, self.canonical_uses(declaration, node.rate, local), span=node.span
                )
                self.clocks[name] = info
                members.append(info)
        self.resolved_families[key] = members
        return members

    def _unknown(self, name: str, want: str, span: Span | None) -> None:
        """Report a name that is not a `want` (clock or region): unknown, or of another kind."""
        declaration = self.decls.get(name)
        candidates = self.suggestions.offer(self.of_kind(want))
        if declaration is None:
            self.bag.add(messages.unknown_name(want, name, span, candidates))
        elif declaration.kind != want:
            self.bag.add(
                messages.wrong_kind_of_name(name, declaration.kind, want, span, declaration.name_span, candidates)
            )

    def _member(
        self,
        declaration: Declaration,
        index: int | None,
        local: dict[str, int],
        clock: ClockInfo | None,
        role: str,
        time_axis: int | None,
    ) -> RegionInfo | None:
        node = declaration.node_as(syntax.Region)
        base = self.canonical(declaration)
        name = f"{base}[{index}]" if index is not None else base
        try:
            shape: list[int | None] = []
            for position, dim in enumerate(node.shape):
                if isinstance(dim, syntax.TimeAxis):
                    shape.append(None)
                    continue
                value = self.evaluate_in(dim, local)
                if (
                    isinstance(value.value, tuple)
                    or value.unit != PLAIN
                    or value.value.denominator != 1
                    or value.value < 1
                ):
                    overridden = [n for n in free_names(dim) if n in self.overrides and n not in local]
                    if not self.overrides_reported.intersection(overridden):
                        override = (overridden[0], self.overrides[overridden[0]]) if overridden else None
                        self.bag.add(messages.bad_dim(name, position, value.describe(), dim.span, override))
                        self.overrides_reported.update(overridden)
                    return None
                shape.append(value.value.numerator)
            retention: Retention | None
            if time_axis is None:
                scratch = isinstance(getattr(node.clause(syntax.RetainClause), "retention", None), syntax.KeepScratch)
                retention = Retention("scratch" if scratch else "fixed")
            else:
                assert clock is not None, "a region with a time axis has a clock (`_region` checked it)"
                retention = self._retention(node, name, clock, role, local)
            if retention is None:
                return None
            start, start_length = self._start(node, name, retention, clock, local, role)
            stock_shape = self._stock(node, name, shape, local)
            bind_clause = node.clause(syntax.BindClause)
            bind = self._bind(node.name, bind_clause, local, "region") if bind_clause else None
            if bind_clause is not None and bind is None:
                return None
            bind_object = self._bind_owner(bind_clause) if bind_clause else None
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None
        except _Skip:
            return None
        return RegionInfo(
            name,
            base if node.family else None,
            index,
            node.dtype,
            messages.DTYPES[node.dtype],
            tuple(shape),
            time_axis,
            clock.name if clock else None,
            retention,
            start,
            start_length,
            stock_shape,
            bind,
            role,
            self.canonical_uses(declaration, node, local),
            span=node.span,
            bind_span=bind_clause.span if bind_clause else None,
            bind_object=bind_object,
            start_span=start_clause.span if (start_clause := node.clause(syntax.StartClause)) else None,
        )

    def _start(
        self,
        node: syntax.Region,
        name: str,
        retention: Retention,
        clock: ClockInfo | None,
        local: dict[str, int],
        role: str = "state",
    ) -> tuple[str, int]:
        """The start policy and the units held at session start (see RegionInfo.start_length).

        Defaults: a fixed region starts zeros, a region with a time axis starts empty. `start zeros`
        fills a window (`last`, `first + last`) completely; a ring's slots start as zeros with a fill
        of 0; an input or output sized from its stages gets its zeros once `complete.size_io_regions`
        knows the window.
        """
        clause = node.clause(syntax.StartClause)
        fixed = not any(isinstance(d, syntax.TimeAxis) for d in node.shape)
        if clause is None:
            return ("zeros", 0) if fixed else ("empty", 0)
        policy = clause.policy
        run_time = not fixed and clock is not None and (clock.bound is not None or retention.kind == "slide")
        if run_time and isinstance(policy, (syntax.StartZeros, syntax.StartFirst, syntax.StartFirstFiring)):
            keyword = {syntax.StartZeros: "zeros", syntax.StartFirst: "first"}.get(type(policy), "first-firing")
            self.bag.add(messages.run_time_start(name, keyword, clause.span))
            raise _Skip()
        if isinstance(policy, (syntax.StartFirst, syntax.StartFirstFiring)):
            return self._data_start(name, policy, retention, fixed, role, clause.span)
        if fixed:
            if isinstance(policy, syntax.StartEmpty):
                self.bag.add(messages.bad_start(name, "has no time axis, so it cannot start empty", clause.span))
                raise _Skip()
            if isinstance(policy, syntax.StartGiven) and policy.count is not None:
                self.bag.add(
                    messages.bad_start(
                        name, "has no time axis, so it starts whole: write `start given` without a length", clause.span
                    )
                )
                raise _Skip()
            return ("zeros", 0) if isinstance(policy, syntax.StartZeros) else ("given", 0)
        if isinstance(policy, syntax.StartEmpty):
            return "empty", 0
        if retention.kind == "scratch":
            self.bag.add(
                messages.bad_start(
                    name, "is scratch: it holds nothing between instants, so it can only start empty", clause.span
                )
            )
            raise _Skip()
        if isinstance(policy, syntax.StartZeros):
            if retention.kind == "all":
                self.bag.add(
                    messages.bad_start(
                        name,
                        "keeps everything up to its horizon, so `start zeros` has "
                        "no length: write `start given N` for N units of zeros",
                        clause.span,
                    )
                )
                raise _Skip()
            # a window starts full of zeros; a ring's slots are zeros but its fill starts at 0
            return "zeros", 0 if retention.kind == "ring" else retention.keeps or 0
        if policy.count is None:
            self.bag.add(
                messages.bad_start(name, "needs the number of units it starts with: `start given N`", clause.span)
            )
            raise _Skip()
        assert clock is not None, "a region with a time axis has a clock (`_region` checked it)"
        length = count_of(
            self.evaluate_in(policy.count, local),
            clock.unit_rate,
            policy.count,
            f"the start length of region '{name}'",
            0,
        )
        keeps = retention.keeps
        if keeps is not None and length > keeps:
            self.bag.add(
                messages.bad_count(
                    "the start length",
                    name,
                    str(length),
                    policy.span,
                    f"the region keeps at most {keeps} units; start with at most {keeps}",
                )
            )
            raise _Skip()
        return "given", length

    def _data_start(
        self,
        name: str,
        policy: syntax.StartFirst | syntax.StartFirstFiring,
        retention: Retention,
        fixed: bool,
        role: str,
        span: Span | None,
    ) -> tuple[str, int]:
        """`start first` (a full window, each unit a copy of the first unit that arrives) and `start
        first-firing` (a full window, or a whole fixed region, that the stage's first firing makes): the
        units held at session start are those of `start zeros`. Where a region has no such start, `bad-start`
        (whether anything feeds, writes or updates it is a rule of the checks: `check_data_starts`)."""
        first = isinstance(policy, syntax.StartFirst)
        keyword = "first" if first else "first-firing"
        problem: str | None = None
        help = ""  # said with the problem
        if fixed and first:
            problem = "has no time axis, so it has no first unit to copy"
            help = "a fixed region that the stage makes on its first call starts `first-firing`"
        elif not first and role in ("input", "output"):
            problem = f"is an {role}: `step()` {'feeds' if role == 'input' else 'returns'} it, no stage makes its start"
            help = (
                "an input that starts as copies of its first unit starts `first`"
                if role == "input"
                else ("an output keeps nothing between instants: drop the `start`")
            )
        elif retention.kind == "scratch":
            problem = "is scratch: it holds nothing between instants"
            help = "drop the `start`, or keep a window: `retain last N`"
        elif retention.kind == "all":
            problem = "keeps everything up to its horizon, so its start has no length"
            help = "keep a window, `retain last N` or `first A + last B`, that the start fills"
        elif retention.kind == "ring" and first:
            problem = "is a ring its module manages in place: no unit is appended to it"
            help = "a ring the stage makes on its first call starts `first-firing`"
        if problem is not None:
            self.bag.add(messages.start_kind(name, keyword, problem, help, span))
            raise _Skip()
        if fixed or retention.kind in ("ring", "io"):
            return keyword, 0  # a ring's fill starts at 0; an io window is sized by `complete`
        return keyword, retention.keeps or 0

    # --- counters and objects ------------------------------------------------------------------

    def counter_region(self, declaration: Declaration) -> list[RegionInfo] | None:
        """The counter (added to `counters`) and its device scalar, a fixed 0-d i64 region of the same
        name with role `counter` (added to the regions); None if it failed."""
        key = id(declaration.node)
        if key in self.resolved_counters:
            return self.resolved_counters[key]
        self.resolved_counters[key] = None
        node = declaration.node_as(syntax.Counter)
        name = self.canonical(declaration)
        with self.in_scope_of(declaration):
            clock_declaration = self.decls.get(node.clock)
            if clock_declaration is None or clock_declaration.kind != "clock":
                self._unknown(node.clock, "clock", node.clock_span or node.span)
                return None
            clock = self.clock_info(clock_declaration, node.clock_span)
            if clock is None:
                return None
            try:
                step = self._whole(node.step, name, "step")
                modulo = self._whole(node.modulo, name, "modulus") if node.modulo is not None else None
                bind = self._bind(node.name, node.bind, {}, "counter") if node.bind is not None else None
                if node.bind is not None and bind is None:
                    return None
                bind_object = self._bind_owner(node.bind) if node.bind is not None else None
            except EvalError as error:
                self.bag.extend(error.diagnostics)
                return None
            except _Skip:
                return None
        self.region_count += 1
        self.counters[name] = CounterInfo(name, clock.name, step, modulo, span=node.span)
        region = RegionInfo(
            name,
            None,
            None,
            "i64",
            messages.DTYPES["i64"],
            (),
            None,
            None,
            Retention("fixed"),
            "zeros",
            0,
            None,
            bind,
            "counter",
            self.canonical_uses(declaration, node),
            span=node.span,
            bind_span=node.bind.span if node.bind else None,
            bind_object=bind_object,
        )
        self.regions[name] = region
        self.resolved_counters[key] = [region]
        return [region]

    def _whole(self, expr: syntax.Expr, counter: str, what: str) -> int:
        value = self.evaluate_in(expr)
        if isinstance(value.value, tuple) or value.unit != PLAIN or value.value.denominator != 1 or value.value < 1:
            self.bag.add(messages.counter_not_whole(counter, what, value.describe(), expr.span))
            raise _Skip()
        return value.value.numerator

    def object_info(self, declaration: Declaration) -> ObjectInfo:
        node = declaration.node_as(syntax.Object)
        name = self.canonical(declaration)
        if name not in self.objects:
            stage = None
            if node.stage is not None:
                with self.in_scope_of(declaration):
                    found = self.decls.get(node.stage)
                    if found is None or found.kind != "stage":
                        self._unknown(node.stage, "stage", node.stage_span or node.span)
                    else:
                        stage = self.canonical(found)
            self.objects[name] = ObjectInfo(name, node.factory, span=node.span, stage=stage)
        return self.objects[name]

    def _bind_owner(self, clause: syntax.BindClause) -> str | None:
        """The object a binding starts at (its canonical name), None for the model root."""
        if clause.owner is None:
            return None
        declaration = self.decls.get(clause.owner)
        if declaration is None or declaration.kind != "object":
            self._unknown(clause.owner, "object", clause.span)
            raise _Skip()
        return self.object_info(declaration).name

    def _object_pass(self, stage: syntax.Stage, item, declaration: Declaration, before: int) -> ObjectPass | None:
        """A stage's `read OBJ` or `update OBJ`; `bad-object` for what an object cannot be given."""
        info = self.object_info(declaration)
        problem = None
        if isinstance(item, syntax.WriteItem):
            problem = "writes"
        elif isinstance(item, syntax.UpdateItem) and item.advance is not None:
            problem = "advances"
        elif isinstance(item, syntax.ReadItem) and (item.span_clause is not None or item.lookahead is not None):
            problem = "reads a window of"
        elif isinstance(item, syntax.ReadItem) and item.prev:
            problem = "reads the previous version of"
        if item.region.index is not None:
            self.bag.add(messages.index_on_plain_region(item.region.name, item.region.index.span))
            return None
        if problem is not None:
            self.bag.add(messages.object_misuse(stage.name, info.name, problem, item.span, declaration.span))
            return None
        kind = "update" if isinstance(item, syntax.UpdateItem) else "read"
        field = item.field if isinstance(item, syntax.UpdateItem) else None
        return ObjectPass(info.name, kind, before, item.alias, span=item.span, field=field)

    def _counter_use_problem(self, stage: syntax.Stage, item, declaration: Declaration) -> bool:
        """Report a write, an update or a window on a counter (`bad-counter`); True if one was."""
        name = self.canonical(declaration)
        if isinstance(item, (syntax.WriteItem, syntax.UpdateItem)):
            verb = "writes" if isinstance(item, syntax.WriteItem) else "updates"
            self.bag.add(messages.counter_written(stage.name, name, verb, item.span, declaration.span))
            return True
        if item.span_clause is not None or item.lookahead is not None:
            self.bag.add(messages.counter_window(stage.name, name, item.span))
            return True
        return False

    def _retention(
        self, node: syntax.Region, name: str, clock: ClockInfo, role: str, local: dict[str, int]
    ) -> Retention | None:
        clause = node.clause(syntax.RetainClause)
        if clause is None:
            if role in ("input", "output"):
                return Retention("io", span=node.name_span or node.span)  # sized from the stages by `checks`
            self.bag.add(messages.missing_retention(name, node.name_span or node.span))
            return None
        keep = clause.retention

        def count(expr: syntax.Expr, what: str, minimum: int, limit: int | None = None) -> int:
            """The count, within `limit` (the retention limit unless given)."""
            units = count_of(
                self.evaluate_in(expr, local), clock.unit_rate, expr, f"{what} of region '{name}'", minimum
            )
            if limit is None and units > self.limits.retention:
                self.bag.add(messages.retention_too_long(what, name, units, self.limits.retention, expr.span))
                raise _Skip()
            if limit is not None and units > limit:
                self.bag.add(messages.horizon_too_long(name, units, limit, expr.span))
                raise _Skip()
            return units

        if isinstance(keep, syntax.KeepLast):
            return Retention("last", last=count(keep.count, "the retention", 0), span=clause.span)
        if isinstance(keep, syntax.KeepRing):
            return Retention("ring", last=count(keep.count, "the ring size", 1), span=clause.span)
        if isinstance(keep, syntax.KeepFirstLast):
            return Retention(
                "first_last",
                first=count(keep.first, "the pinned head", 0),
                last=count(keep.last, "the window", 1),
                span=clause.span,
            )
        if isinstance(keep, syntax.KeepAll):
            if keep.horizon is None:
                self.bag.add(messages.unbounded_retention(name, clause.span))
                return None
            horizon = count(keep.horizon, "the horizon", 1, limit=self.limits.horizon)
            return Retention("all", horizon=horizon, span=clause.span)
        if isinstance(keep, syntax.KeepSlide):
            first = count(keep.first, "the pinned head", 0) if keep.first is not None else 0
            high, low = count(keep.high, "the high mark", 1), count(keep.low, "the low mark", 0)
            if not first <= low <= high:
                self.bag.add(messages.slide_marks(name, first, high, low, clause.span))
                return None
            return Retention("slide", first=first, last=high, low=low, span=clause.span)
        return Retention("scratch", span=clause.span)

    def _stock(
        self, node: syntax.Region, name: str, shape: list[int | None], local: dict[str, int]
    ) -> tuple[int, ...] | None:
        clause = node.clause(syntax.StockClause)
        if clause is None:
            return None
        value = self.evaluate_in(clause.capacity, local)
        if isinstance(value.value, tuple):
            dims = [require_int(q, clause.capacity, f"a stock dimension of region '{name}'", 0) for q in value.value]
            if len(dims) != len(shape):
                self.bag.add(messages.stock_arity(name, len(dims), len(shape), clause.span))
                raise _Skip()
            return tuple(dims)
        if None not in shape:
            self.bag.add(messages.stock_of_fixed(name, len(shape), clause.span))
            raise _Skip()
        capacity = require_int(value, clause.capacity, f"the stock capacity of region '{name}'", 0)
        return tuple(capacity if d is None else d for d in shape)

    def _bind(self, owner: str, clause: syntax.BindClause, local: dict[str, int], kind: str) -> str | None:
        """The binding's path with family indices filled in; None (reported) if it is unsafe or malformed.
        `kind`: what `owner` is, `region` or `counter`."""
        unknown: list[str] = []
        problems: list[str] = []

        def fill(match: re.Match) -> str:
            key = match.group(1).strip()
            if key in local:
                return str(local[key])
            number = self._placeholder_value(key, local, unknown, problems)
            return match.group(0) if number is None else str(number)

        unsafe = unsafe_segment(clause.path, clause.private)
        if unsafe is not None:
            offset, segment, dunder = unsafe
            where = segment_span(clause.path_span, offset, segment) or clause.span
            self.bag.add(messages.unsafe_path("bind", owner, clause.path, segment, dunder, where, kind, clause.owner))
            return None
        path = _PLACEHOLDER.sub(fill, clause.path)
        if unknown:
            self.bag.add(messages.bad_placeholder(owner, unknown[0], list(local), clause.span, kind))
            return None
        if problems:
            self.bag.add(messages.bad_bind(owner, clause.path, problems[0], clause.span, kind))
            return None
        problem = path_problem(path)
        if problem is not None:
            self.bag.add(messages.bad_bind(owner, path, problem, clause.span, kind))
            return None
        return path

    def _placeholder_value(
        self, text: str, local: dict[str, int], unknown: list[str], problems: list[str]
    ) -> int | None:
        """A placeholder's expression (`{layer + 1}`, `{keys[layer]}`) as a whole number of family indices and
        params; None after adding to `unknown` (a name that is neither) or `problems` (anything else)."""
        try:
            expr = parse_value(text, "<placeholder>")
        except ClockError:
            problems.append(f"has the placeholder {{{text}}}, which is not an expression")
            return None
        names = [n for n in free_names(expr) if n not in local]
        missing = [n for n in names if (d := self.decls.get(n)) is None or d.kind != "param"]
        if missing:
            unknown.append(missing[0])
            return None
        try:
            value = self.evaluate_in(expr, local)
        except (EvalError, _Skip):
            problems.append(f"has the placeholder {{{text}}}, which does not evaluate")
            return None
        if isinstance(value.value, tuple) or value.unit != PLAIN or value.value.denominator != 1 or value.value < 0:
            problems.append(
                f"puts {value.describe()} where the placeholder {{{text}}} needs a whole number of 0 or more"
            )
            return None
        return value.value.numerator

    def _stage(self, node: syntax.Stage) -> StageInfo | None:
        self._stage_name = node.name
        ok = True
        clock = None
        clock_declaration = self.decls.get(node.clock)
        if clock_declaration is None or clock_declaration.kind != "clock":
            self._unknown(node.clock, "clock", node.clock_span)
            ok = False
        else:
            clock = self.clock_info(clock_declaration, node.clock_span)
            ok = clock is not None
        callables = node.items_of(syntax.ModuleItem) + node.items_of(syntax.HookItem)
        if len(callables) != 1:
            self.bag.add(
                messages.stage_callable(
                    node.name, len(callables), callables[1].span if len(callables) > 1 else node.name_span or node.span
                )
            )
            ok = False
        for item in node.items_of(syntax.ModuleItem):
            problem = path_problem(item.path) if item.path != "" else None
            if problem is not None:  # reported, but the stage's accesses are still worth checking
                self.bag.add(messages.bad_module_path(node.name, item.path, problem, item.path_span or item.span))
            unsafe = unsafe_segment(item.path, item.private)
            if unsafe is not None:
                offset, segment, dunder = unsafe
                where = segment_span(item.path_span, offset, segment) or item.span
                self.bag.add(messages.unsafe_path("module", node.name, item.path, segment, dunder, where))
        aliases: dict[str, Span | None] = {}
        keywords = [(i.alias, i.alias_span) for i in node.items_of(syntax.ReadItem) + node.items_of(syntax.UpdateItem)]
        keywords += [(i.name, i.name_span) for i in node.items_of(syntax.WithItem)]
        for keyword, keyword_span in keywords:
            if keyword is None:
                continue
            if keyword in aliases:
                self.bag.add(messages.duplicate_argument(node.name, keyword, keyword_span, aliases[keyword]))
            else:
                aliases[keyword] = keyword_span
        arguments = self._arguments(node)
        if arguments is None:
            ok = False
        accesses: list[Access] = []
        passes: list[ObjectPass] = []
        for item in node.items:
            if isinstance(item, (syntax.ReadItem, syntax.UpdateItem, syntax.WriteItem)):
                used = self.decls.get(item.region.name)
                if used is not None and used.kind == "object":
                    found = self._object_pass(node, item, used, len(accesses))
                    if found is None:
                        ok = False
                    else:
                        passes.append(found)
                    continue
                if used is not None and used.kind == "counter" and self._counter_use_problem(node, item, used):
                    ok = False
                    continue
                try:
                    accesses.extend(self._accesses(item))
                except EvalError as error:
                    self.bag.extend(error.diagnostics)
                    ok = False
                except _Skip:
                    ok = False
        rows = self._rows(node)
        if not ok or rows is False:
            return None
        assert clock is not None, "a stage whose clock failed is not ok"
        target = callables[0]
        kind = "module" if isinstance(target, syntax.ModuleItem) else "hook"
        return StageInfo(
            node.name,
            clock.name,
            kind,
            target.path if kind == "module" else target.name,
            tuple(accesses),
            bool(node.items_of(syntax.RngItem)),
            span=node.span,
            callable_span=target.span,
            passes=tuple(passes),
            rows=rows[0] if rows else None,
            rows_span=rows[1] if rows else None,
            arguments=arguments or (),
        )

    def _rows(self, node: syntax.Stage) -> tuple[int, Span | None] | Literal[False] | None:
        """The stage's `rows N` and where it is written; None without one, False when it is wrong (reported)."""
        items = node.items_of(syntax.RowsItem)
        if not items:
            return None
        for extra in items[1:]:
            self.bag.add(messages.duplicate_clause("rows", node.name, extra.span, items[0].span))
        item = items[0]
        count = self._firings_count(
            item.count,
            f"the rows of stage '{node.name}'",
            lambda value, limit, span: messages.rows_too_many(node.name, value, limit, span),
        )
        return (count, item.span) if count is not None and len(items) == 1 else False

    def _arguments(self, node: syntax.Stage) -> tuple[tuple[str, object], ...] | None:
        """The stage's constant keyword arguments (`with NAME = VALUE`) as Python values; None (reported) if
        a value is not a plain number, a string or a boolean."""
        found: list[tuple[str, object]] = []
        ok = True
        for item in node.items_of(syntax.WithItem):
            if isinstance(item.value, (bool, str)):
                found.append((item.name, item.value))
                continue
            try:
                value = self.evaluate_in(item.value)
            except EvalError as error:
                self.bag.extend(error.diagnostics)
                ok = False
                continue
            except _Skip:
                ok = False
                continue
            if isinstance(value.value, tuple) or value.unit != PLAIN:
                self.bag.add(messages.bad_argument(node.name, item.name, value.describe(), item.value.span))
                ok = False
                continue
            number = value.value
            found.append((item.name, number.numerator if number.denominator == 1 else float(number)))
        return tuple(found) if ok else None

    def _accesses(self, item) -> list[Access]:
        ref: syntax.RegionRef = item.region
        declaration = self.decls.get(ref.name)
        if declaration is not None and declaration.kind == "counter":
            resolved = self.counter_region(declaration)
        elif declaration is None or declaration.kind != "region":
            self._unknown(ref.name, "region", ref.name_span or ref.span)
            raise _Skip()
        else:
            resolved = self.region_members(declaration)
        if resolved is None:
            raise _Skip()  # a region whose own declaration failed is reported there
        members = [m.name for m in resolved]
        if getattr(declaration.node, "family", None) is not None:
            if ref.index is not None:
                position = require_int(self.evaluate_in(ref.index), ref.index, "a family index")
                if not 0 <= position < len(members):
                    self.bag.add(messages.index_out_of_range(ref.name, str(position), len(members), ref.index.span))
                    raise _Skip()
                members = [members[position]]
        elif ref.index is not None:
            self.bag.add(messages.index_on_plain_region(ref.name, ref.index.span))
            raise _Skip()
        if isinstance(item, syntax.UpdateItem | syntax.WriteItem) and item.field is not None and len(members) > 1:
            self.bag.add(
                messages.family_field(
                    self._stage_name, ref.name, item.field, len(members), item.field_span or item.span
                )
            )
            raise _Skip()
        if isinstance(item, syntax.ReadItem | syntax.UpdateItem) and item.alias is not None and len(members) > 1:
            self.bag.add(messages.family_alias(self._stage_name, ref.name, item.alias, len(members), item.span))
            raise _Skip()
        result = []

        def reach(expr: syntax.Expr, rate: Fraction, what: str, minimum: int, region: str) -> int:
            """A read's count of units (`what`: `read span`, `read context`, `lookahead`), within the
            context limit."""
            units = count_of(self.evaluate_in(expr), rate, expr, f"a {what}", minimum)
            if units > self.limits.context:
                self.bag.add(messages.context_too_long(f"the {what}", region, units, self.limits.context, expr.span))
                raise _Skip()
            return units

        for member in members:
            region = self.regions[member]
            rate = self.clocks[region.clock].unit_rate if region.clock else Fraction(1)
            if isinstance(item, syntax.ReadItem):
                window, count, context = "all", 0, 0
                if isinstance(item.span_clause, syntax.SpanLast):
                    window = "last"
                    count = reach(item.span_clause.count, rate, "read span", 1, ref.name)
                elif isinstance(item.span_clause, syntax.SpanNew):
                    window = "new"
                    if item.span_clause.context is not None:
                        context = reach(item.span_clause.context, rate, "read context", 0, ref.name)
                lookahead = 0
                if item.lookahead is not None:
                    lookahead = reach(item.lookahead, rate, "lookahead", 0, ref.name)
                result.append(
                    Access("read", member, window, count, context, lookahead, item.alias, item.prev, span=item.span)
                )
            elif isinstance(item, syntax.UpdateItem):
                advance = None
                if item.advance is not None:
                    advance = count_of(self.evaluate_in(item.advance), rate, item.advance, "an advance", 0)
                result.append(
                    Access(
                        "update",
                        member,
                        advance=advance,
                        alias=item.alias,
                        span=item.span,
                        up_to=item.up_to,
                        field=item.field,
                    )
                )
            else:
                advance = None
                if item.advance is not None:
                    advance = count_of(self.evaluate_in(item.advance), rate, item.advance, "an advance", 0)
                latency = 0
                if item.latency is not None:
                    latency = count_of(self.evaluate_in(item.latency), rate, item.latency, "a latency", 0)
                loss = 0
                if item.loss is not None:
                    loss = count_of(self.evaluate_in(item.loss), rate, item.loss, "a loss", 0)
                result.append(
                    Access(
                        "write",
                        member,
                        advance=advance,
                        latency=latency,
                        latency_dropped=item.latency_dropped,
                        loss=loss,
                        loss_intended=item.loss_intended,
                        span=item.span,
                        up_to=item.up_to,
                        field=item.field,
                    )
                )
        return result


def _depends_on_itself(declaration: Declaration, cycle: list[str]):
    return messages.depends_on_itself(declaration.kind, declaration.name, cycle, declaration.name_span)


class _Skip(Exception):
    """A declaration that depends on one already reported as broken."""


def _no_names(node: syntax.Name) -> Quantity:
    raise EvalError(
        messages.bad_value(
            f"'{node.id}': a --param value cannot name other declarations", node.span, "give a literal value"
        )
    )


def kind_mismatch(default: Quantity, given: Quantity) -> str | None:
    """Why `given` cannot replace `default` (None if it can): lists replace lists (element by element
    of the default's kind when the default's elements share one kind), integers take integers,
    fractions take integers or fractions, durations take durations, rates take rates."""
    if default.is_list != given.is_list:
        return f"got {given.kind}"
    if default.is_list:
        kinds = {_element_kind(item) for item in default.items}
        if len(kinds) == 1 and default.items:
            template = default.items[0]
            for position, item in enumerate(given.items):
                problem = kind_mismatch(template, item)
                if problem is not None:
                    return f"item {position} is {item.kind}, the default's items are {template.kind}"
        return None
    if default.unit != given.unit:
        return f"got {given.kind}"
    if default.unit == PLAIN and default.fraction.denominator == 1 and given.fraction.denominator != 1:
        return f"got {given.kind}"
    return None


def _element_kind(q: Quantity) -> str:
    if isinstance(q.value, tuple):
        return "a list"
    return "an integer" if q.unit == PLAIN and q.value.denominator == 1 else unit_name(q.unit)


def names_in_order(expr) -> list[str]:
    """The names an expression mentions, each once, in the order evaluation meets them."""
    found: dict[str, None] = {}

    def walk(value) -> None:
        if isinstance(value, syntax.Name):
            found.setdefault(value.id)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif attrs.has(type(value)):
            for field in attrs.fields(type(value)):
                if field.name != "span":
                    walk(getattr(value, field.name))

    walk(expr)
    return list(found)


def free_names(node) -> tuple[str, ...]:
    """Every name an AST node's expressions mention, sorted (for the dependency graph)."""
    return tuple(sorted(names_in_order(node)))


PythonValue = int | Fraction | list["PythonValue"]
"""A param's value as the program holds it: an int where it is a plain integer."""


def _python_value(q: Quantity) -> PythonValue:
    if isinstance(q.value, tuple):
        return [_python_value(item) for item in q.value]
    if q.unit == PLAIN and q.value.denominator == 1:
        return q.value.numerator
    return q.value


def resolve(
    loaded: Loaded, overrides: Mapping[str, str] | None = None, limits: Limits = DEFAULT_LIMITS
) -> tuple[Program, list]:
    """Resolve and evaluate: the program made of every declaration that resolved, and the problems.

    Declarations that failed (and those that depend on them) are left out, so later checks can run
    on the rest without reporting the same mistake twice.
    """
    resolver = _Resolver(loaded, overrides or {}, limits)
    program = resolver.resolve()
    return program, list(resolver.bag)
