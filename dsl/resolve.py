"""Resolve names and evaluate values: loaded units -> a `Program` (or every error found).

One namespace holds params, clocks, regions and stages of the main file and of what it imports.
Params may be overridden at load (`--param P=200`); values are exact. Families are expanded into
their members (`kv[0]` ... `kv[7]`) with `{index}` placeholders filled in their bindings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

import attrs

from . import ast, messages
from .diagnostics import ClockError, DiagnosticBag
from .evaluate import HERTZ, PLAIN, SECONDS, EvalError, Quantity, count_of, evaluate, require_int
from .loader import Loaded
from .parse import parse_value
from .program import Access, ClockInfo, Program, RegionInfo, Retention, StageInfo
from .source import Span

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_PATH_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[0-9]+\])*$|^[0-9]+$")


@attrs.frozen
class Declaration:
    kind: str  # param, clock, region, stage, cadence
    name: str
    node: object
    unit: str

    @property
    def span(self) -> Span | None:
        return getattr(self.node, "span", None)


def collect_declarations(loaded: Loaded, bag: DiagnosticBag) -> dict[str, dict[str, Declaration]]:
    """The names visible in each unit: its own declarations and what its `use`s bring in."""
    visible: dict[str, dict[str, Declaration]] = {}
    for key, unit in loaded.units.items():  # children are inserted before their importers
        names: dict[str, Declaration] = {}

        def add(declaration: Declaration, at: Span | None) -> None:
            existing = names.get(declaration.name)
            if existing is None:
                names[declaration.name] = declaration
            elif existing.node is not declaration.node:
                kind = "cadence" if declaration.kind == "cadence" else declaration.kind
                bag.add(messages.duplicate_name(kind, declaration.name, at or declaration.span, existing.span))

        for use, target in unit.imports:
            exported = visible.get(target, {})
            wanted = use.names if use.names is not None else tuple(exported)
            for name in wanted:
                if name not in exported:
                    bag.add(messages.unknown_imported_name(use.dotted, name, use.span, exported))
                    continue
                add(exported[name], use.span if use.names is not None else exported[name].span)
        for statement in unit.module.statements:
            if isinstance(statement, ast.Use):
                continue
            if isinstance(statement, ast.Cadence):
                add(Declaration("cadence", "cadence", statement, key), statement.span)
                continue
            kind = type(statement).__name__.lower()
            add(Declaration(kind, statement.name, statement, key), statement.span)
        visible[key] = names
    return visible


class _Resolver:
    def __init__(self, loaded: Loaded, overrides: Mapping[str, str]):
        self.loaded = loaded
        self.bag = DiagnosticBag()
        self.scopes = collect_declarations(loaded, self.bag)
        self.units = [loaded.main]  # the unit whose names are in scope: a declaration sees its own file's names
        self.overrides = dict(overrides)
        self.values: dict[tuple[str, str], Quantity] = {}
        self.evaluating: list[str] = []
        self.broken: set[tuple[str, str]] = set()

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
        return {n: d for n, d in self.decls.items() if d.kind == kind}

    def lookup_value(self, node: ast.Name, local: Mapping[str, int] | None = None) -> Quantity:
        if local and node.id in local:
            return Quantity(Fraction(local[node.id]))
        declaration = self.decls.get(node.id)
        candidates = [n for n, d in self.decls.items() if d.kind in ("param", "clock")] + list(local or ())
        if declaration is None:
            raise EvalError(messages.unknown_name("name", node.id, node.span, candidates))
        if declaration.kind not in ("param", "clock"):
            raise EvalError(messages.wrong_kind_of_name(node.id, declaration.kind, "param or clock", node.span,
                                                        declaration.span, candidates))
        return self.value_of(declaration)

    def value_of(self, declaration: Declaration) -> Quantity:
        name = declaration.name
        key = (declaration.unit, name)
        if key in self.values:
            return self.values[key]
        if key in self.broken:
            raise _Skip()
        if name in self.evaluating:
            cycle = self.evaluating[self.evaluating.index(name):] + [name]
            raise EvalError(messages.bad_value(f"{declaration.kind} '{name}' depends on itself: "
                                               + " -> ".join(cycle), declaration.span,
                                               "define it from values that do not depend on it"))
        self.evaluating.append(name)
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
        finally:
            self.evaluating.pop()
        self.values[key] = value
        return value

    def _param_value(self, declaration: Declaration) -> Quantity:
        node: ast.Param = declaration.node
        default = evaluate(node.default, self.lookup_value)
        if declaration.name not in self.overrides:
            return default
        text = self.overrides[declaration.name]
        try:
            given = evaluate(parse_value(text), _no_names)
        except ClockError as error:
            self.bag.add(messages.override_kind(declaration.name, default.kind, default.describe(), text,
                                                error.diagnostics[0].message, node.span))
            return default
        problem = _kind_mismatch(default, given)
        if problem is not None:
            self.bag.add(messages.override_kind(declaration.name, default.kind, default.describe(), text, problem,
                                                node.span))
            return default
        return given

    def _clock_value(self, declaration: Declaration) -> Quantity:
        node: ast.Clock = declaration.node
        rate = evaluate(node.rate, self.lookup_value)
        if rate.is_list or rate.unit != HERTZ:
            raise EvalError(messages.bad_rate(declaration.name, f"is {rate.describe()}, not a rate in Hz", node.span))
        if rate.value <= 0:
            raise EvalError(messages.bad_rate(declaration.name, f"has rate {rate.describe()}; a rate must be positive",
                                              node.span))
        return rate

    def evaluate_in(self, expr: ast.Expr, local: Mapping[str, int] | None = None) -> Quantity:
        return evaluate(expr, lambda n: self.lookup_value(n, local))

    # --- the program ---------------------------------------------------------------------------

    def resolve(self) -> Program:
        for name in self.overrides:
            if name not in self.of_kind("param"):
                self.bag.add(messages.override_unknown(name, self.of_kind("param")))
        params: dict[str, object] = {}
        for name, declaration in self.of_kind("param").items():
            try:
                params[name] = _python_value(self.value_of(declaration))
            except (_Skip, EvalError) as error:
                if isinstance(error, EvalError):
                    self.bag.extend(error.diagnostics)
        clocks: dict[str, ClockInfo] = {}
        for name, declaration in self.of_kind("clock").items():
            try:
                clocks[name] = ClockInfo(name, self.value_of(declaration).value, free_names(declaration.node.rate),
                                         span=declaration.span)
            except (_Skip, EvalError) as error:
                if isinstance(error, EvalError):
                    self.bag.extend(error.diagnostics)
        cadence, cadence_span = self._cadence()
        regions: dict[str, RegionInfo] = {}
        families: dict[str, tuple[str, ...]] = {}
        for name, declaration in self.of_kind("region").items():
            with self.in_scope_of(declaration):
                members = self._region(declaration.node, clocks)
            if members is None:
                continue
            if declaration.node.family is not None:
                families[name] = tuple(m.name for m in members)
            for member in members:
                regions[member.name] = member
        stages: dict[str, StageInfo] = {}
        for name, declaration in self.of_kind("stage").items():
            with self.in_scope_of(declaration):
                stage = self._stage(declaration.node, clocks, regions, families)
            if stage is not None:
                stages[name] = stage
        if stages and cadence is None and "cadence" not in self.decls:
            self.bag.add(messages.missing_cadence(next(iter(stages.values())).span))
        return Program(self.loaded.main, cadence or Fraction(1), params, clocks, regions, families, stages,
                       cadence_span=cadence_span, incomplete=bool(self.bag.errors))

    def _cadence(self) -> tuple[Fraction | None, Span | None]:
        declaration = self.decls.get("cadence")
        if declaration is None or declaration.kind != "cadence":
            return None, None
        node: ast.Cadence = declaration.node
        try:
            with self.in_scope_of(declaration):
                period = self.evaluate_in(node.period)
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None, node.span
        except _Skip:
            return None, node.span
        if period.is_list or period.unit != SECONDS:
            self.bag.add(messages.bad_cadence(f"is {period.describe()}, not a duration", node.span))
            return None, node.span
        if period.value <= 0:
            self.bag.add(messages.bad_cadence(f"is {period.describe()}; it must be positive", node.span))
            return None, node.span
        return period.value, node.span

    def _region(self, node: ast.Region, clocks: dict[str, ClockInfo]) -> list[RegionInfo] | None:
        ok = True
        for kind, label in ((ast.OnClause, "on"), (ast.RetainClause, "retain"), (ast.StartClause, "start"),
                            (ast.StockClause, "stock"), (ast.BindClause, "bind"), (ast.RoleClause, "input/output")):
            found = node.clauses_of(kind)
            for extra in found[1:]:
                self.bag.add(messages.duplicate_clause(label, node.name, extra.span, found[0].span))
                ok = False
        if node.dtype not in messages.DTYPES:
            self.bag.add(messages.unknown_dtype(node.dtype, node.dtype_span))
            ok = False
        time_axes = [i for i, d in enumerate(node.shape) if isinstance(d, ast.TimeAxis)]
        on = node.clause(ast.OnClause)
        role_clause = node.clause(ast.RoleClause)
        role = role_clause.role if role_clause else "state"
        if len(time_axes) > 1 or (not time_axes and role != "state"):
            self.bag.add(messages.time_axis_count(node.name, len(time_axes), node.span))
            ok = False
        if (not time_axes and node.clause(ast.RetainClause) is not None
                and not isinstance(node.clause(ast.RetainClause).retention, ast.KeepScratch)):
            self.bag.add(messages.fixed_with_retention(node.name, node.clause(ast.RetainClause).span))
            ok = False
        clock = None
        if on is None:
            if time_axes:
                self.bag.add(messages.missing_clock(node.name, node.span))
                ok = False
        elif on.clock not in clocks:
            declaration = self.decls.get(on.clock)
            if declaration is None:
                self.bag.add(messages.unknown_name("clock", on.clock, on.span, self.of_kind("clock")))
            elif declaration.kind != "clock":
                self.bag.add(messages.wrong_kind_of_name(on.clock, declaration.kind, "clock", on.span,
                                                         declaration.span, self.of_kind("clock")))
            ok = False
        else:
            clock = clocks[on.clock]
        count = 1
        if node.family is not None:
            try:
                count = self.evaluate_in(node.family.count)
                if count.is_list or count.unit != PLAIN or count.value.denominator != 1 or count.value < 1:
                    self.bag.add(messages.bad_family(node.name, count.describe(), node.family.count.span))
                    ok = False
                else:
                    count = count.value.numerator
            except EvalError as error:
                self.bag.extend(error.diagnostics)
                ok = False
            except _Skip:
                ok = False
        if not ok:
            return None
        members = []
        for index in range(count):
            local = {node.family.index: index} if node.family is not None else {}
            member = self._member(node, index if node.family else None, local, clock, role,
                                  time_axes[0] if time_axes else None)
            if member is None:
                return None
            members.append(member)
        return members

    def _member(self, node: ast.Region, index: int | None, local: dict[str, int], clock: ClockInfo | None,
                role: str, time_axis: int | None) -> RegionInfo | None:
        name = f"{node.name}[{index}]" if index is not None else node.name
        try:
            shape: list[int | None] = []
            for position, dim in enumerate(node.shape):
                if isinstance(dim, ast.TimeAxis):
                    shape.append(None)
                    continue
                value = self.evaluate_in(dim, local)
                if value.is_list or value.unit != PLAIN or value.value.denominator != 1 or value.value < 1:
                    self.bag.add(messages.bad_dim(name, position, value.describe(), dim.span))
                    return None
                shape.append(value.value.numerator)
            if time_axis is None:
                scratch = isinstance(getattr(node.clause(ast.RetainClause), "retention", None), ast.KeepScratch)
                retention = Retention("scratch" if scratch else "fixed")
            else:
                retention = self._retention(node, name, clock, role, local)
            if retention is None:
                return None
            start_clause = node.clause(ast.StartClause)
            policy = start_clause.policy if start_clause else (ast.StartZeros() if time_axis is None
                                                               else ast.StartEmpty())
            start, start_length = "empty", 0
            if isinstance(policy, ast.StartEmpty) and time_axis is None:
                self.bag.add(messages.bad_start(name, "a fixed region cannot start empty", start_clause.span))
                return None
            if isinstance(policy, ast.StartZeros):
                start = "zeros"
                start_length = retention.keeps or 0 if retention.kind in ("last", "first_last") else 0
            elif isinstance(policy, ast.StartGiven):
                start = "given"
                if (policy.count is None) != (time_axis is None):
                    problem = ("says how many units it starts with, but a fixed region starts whole"
                               if time_axis is None else "needs the number of units it starts with: `start given N`")
                    self.bag.add(messages.bad_start(name, problem, start_clause.span))
                    return None
                if policy.count is not None:
                    start_length = count_of(self.evaluate_in(policy.count, local), clock.rate, policy.count,
                                            f"the start length of region '{name}'", 0)
                keeps = retention.keeps
                if keeps is not None and start_length > keeps:
                    self.bag.add(messages.bad_count("the start length", name, str(start_length), policy.span,
                                                    f"the region keeps at most {keeps} units"))
                    return None
            stock_shape = self._stock(node, name, shape, local)
            bind_clause = node.clause(ast.BindClause)
            bind = self._bind(node, bind_clause, name, local) if bind_clause else None
            if bind_clause is not None and bind is None:
                return None
        except EvalError as error:
            self.bag.extend(error.diagnostics)
            return None
        except _Skip:
            return None
        return RegionInfo(name, node.name if node.family else None, index, node.dtype, messages.DTYPES[node.dtype],
                          tuple(shape), time_axis, clock.name if clock else None, retention, start, start_length, stock_shape, bind,
                          role, tuple(n for n in free_names(node) if n not in local), span=node.span, bind_span=bind_clause.span if bind_clause else None)

    def _retention(self, node: ast.Region, name: str, clock: ClockInfo, role: str,
                   local: dict[str, int]) -> Retention | None:
        clause = node.clause(ast.RetainClause)
        if clause is None:
            if role in ("input", "output"):
                return Retention("io", span=node.span)  # sized from the stages' accesses by `checks`
            self.bag.add(messages.missing_retention(name, node.span))
            return None
        keep = clause.retention

        def count(expr: ast.Expr, what: str, minimum: int) -> int:
            return count_of(self.evaluate_in(expr, local), clock.rate, expr, f"{what} of region '{name}'", minimum)

        if isinstance(keep, ast.KeepLast):
            return Retention("last", last=count(keep.count, "the retention", 1), span=clause.span)
        if isinstance(keep, ast.KeepRing):
            return Retention("ring", last=count(keep.count, "the ring size", 1), span=clause.span)
        if isinstance(keep, ast.KeepFirstLast):
            return Retention("first_last", first=count(keep.first, "the pinned head", 0),
                             last=count(keep.last, "the window", 1), span=clause.span)
        if isinstance(keep, ast.KeepAll):
            if keep.horizon is None:
                self.bag.add(messages.unbounded_retention(name, clause.span))
                return None
            return Retention("all", horizon=count(keep.horizon, "the horizon", 1), span=clause.span)
        return Retention("scratch", span=clause.span)

    def _stock(self, node: ast.Region, name: str, shape: list[int | None],
               local: dict[str, int]) -> tuple[int, ...] | None:
        clause = node.clause(ast.StockClause)
        if clause is None:
            return None
        value = self.evaluate_in(clause.capacity, local)
        if value.is_list:
            dims = [require_int(q, clause.capacity, f"a stock dimension of region '{name}'", 0) for q in value.value]
            if len(dims) != len(shape):
                self.bag.add(messages.stock_arity(name, len(dims), len(shape), clause.span))
                raise _Skip()
            return tuple(dims)
        capacity = require_int(value, clause.capacity, f"the stock capacity of region '{name}'", 0)
        return tuple(capacity if d is None else d for d in shape)

    def _bind(self, node: ast.Region, clause: ast.BindClause, name: str, local: dict[str, int]) -> str | None:
        def fill(match: re.Match) -> str:
            key = match.group(1)
            if key in local:
                return str(local[key])
            raise KeyError(key)

        try:
            path = _PLACEHOLDER.sub(fill, clause.path)
        except KeyError as missing:
            known = ", ".join(f"{{{k}}}" for k in local) or "none (the region is not a family)"
            self.bag.add(messages.bad_bind(name, f"uses placeholder {{{missing.args[0]}}}; placeholders here: {known}",
                                           clause.span))
            return None
        if path.strip() == "" or any(not _PATH_PART.match(part) for part in path.split(".")):
            self.bag.add(messages.bad_bind(name, f"'{path}' is not an attribute path", clause.span))
            return None
        return path

    def _stage(self, node: ast.Stage, clocks: dict[str, ClockInfo], regions: dict[str, RegionInfo],
               families: dict[str, tuple[str, ...]]) -> StageInfo | None:
        ok = True
        if node.clock not in clocks:
            declaration = self.decls.get(node.clock)
            if declaration is None or declaration.kind != "clock":
                self.bag.add(messages.unknown_name("clock", node.clock, node.clock_span, self.of_kind("clock")))
            ok = False
        callables = node.items_of(ast.ModuleItem) + node.items_of(ast.HookItem)
        if len(callables) != 1:
            self.bag.add(messages.stage_callable(node.name, len(callables),
                                                 callables[1].span if len(callables) > 1 else node.span))
            ok = False
        accesses: list[Access] = []
        for item in node.items:
            if isinstance(item, (ast.ReadItem, ast.UpdateItem, ast.WriteItem)):
                try:
                    accesses.extend(self._accesses(item, regions, families))
                except EvalError as error:
                    self.bag.extend(error.diagnostics)
                    ok = False
                except _Skip:
                    ok = False
        if not ok:
            return None
        target = callables[0]
        kind = "module" if isinstance(target, ast.ModuleItem) else "hook"
        return StageInfo(node.name, node.clock, kind, target.path if kind == "module" else target.name,
                         tuple(accesses), bool(node.items_of(ast.RngItem)), span=node.span,
                         callable_span=target.span)

    def _accesses(self, item, regions: dict[str, RegionInfo], families: dict[str, tuple[str, ...]]) -> list[Access]:
        ref: ast.RegionRef = item.region
        if ref.name in families:
            members = families[ref.name]
            if ref.index is not None:
                position = require_int(self.evaluate_in(ref.index), ref.index, "a family index")
                if not 0 <= position < len(members):
                    self.bag.add(messages.index_out_of_range(ref.name, str(position), len(members), ref.index.span))
                    raise _Skip()
                members = (members[position],)
        elif ref.name in regions:
            if ref.index is not None:
                self.bag.add(messages.index_on_plain_region(ref.name, ref.index.span))
                raise _Skip()
            members = (ref.name,)
        else:
            declaration = self.decls.get(ref.name)
            region_names = list(self.of_kind("region"))
            if declaration is None:
                self.bag.add(messages.unknown_name("region", ref.name, ref.span, region_names))
            elif declaration.kind != "region":
                self.bag.add(messages.wrong_kind_of_name(ref.name, declaration.kind, "region", ref.span,
                                                         declaration.span, region_names))
            raise _Skip()  # a region whose own declaration failed is reported there
        result = []
        for member in members:
            region = regions[member]
            rate = self._clock_rate(region.clock) if region.clock else Fraction(1)
            if isinstance(item, ast.ReadItem):
                window, count, context = "all", 0, 0
                if isinstance(item.span_clause, ast.SpanLast):
                    window = "last"
                    count = count_of(self.evaluate_in(item.span_clause.count), rate, item.span_clause.count,
                                     "a read span", 1)
                elif isinstance(item.span_clause, ast.SpanNew):
                    window = "new"
                    if item.span_clause.context is not None:
                        context = count_of(self.evaluate_in(item.span_clause.context), rate,
                                           item.span_clause.context, "a read context", 0)
                lookahead = 0
                if item.lookahead is not None:
                    lookahead = count_of(self.evaluate_in(item.lookahead), rate, item.lookahead, "a lookahead", 0)
                result.append(Access("read", member, window, count, context, lookahead, item.alias, item.prev,
                                     span=item.span))
            elif isinstance(item, ast.UpdateItem):
                advance = None
                if item.advance is not None:
                    advance = count_of(self.evaluate_in(item.advance), rate, item.advance, "an advance", 0)
                result.append(Access("update", member, advance=advance, span=item.span))
            else:
                advance = None
                if item.advance is not None:
                    advance = count_of(self.evaluate_in(item.advance), rate, item.advance, "an advance", 0)
                latency = 0
                if item.latency is not None:
                    latency = count_of(self.evaluate_in(item.latency), rate, item.latency, "a latency", 0)
                result.append(Access("write", member, advance=advance, latency=latency, span=item.span))
        return result

    def _clock_rate(self, clock: str) -> Fraction:
        return self.value_of(self.decls[clock]).value


class _Skip(Exception):
    """A declaration that depends on one already reported as broken."""


def _no_names(node: ast.Name) -> Quantity:
    raise EvalError(messages.bad_value(f"'{node.id}': a --param value cannot name other declarations", node.span,
                                       "give a literal value"))


def _kind_mismatch(default: Quantity, given: Quantity) -> str | None:
    if default.is_list != given.is_list:
        return f"got {given.kind}"
    if default.is_list:
        return None
    if default.unit != given.unit:
        return f"got {given.kind}"
    if default.unit == PLAIN and default.value.denominator == 1 and given.value.denominator != 1:
        return f"got {given.kind}"
    return None


def free_names(node) -> tuple[str, ...]:
    """Every name an AST node's expressions mention, sorted (for the dependency graph)."""
    found: set[str] = set()

    def walk(value) -> None:
        if isinstance(value, ast.Name):
            found.add(value.id)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif attrs.has(type(value)):
            for field in attrs.fields(type(value)):
                if field.name != "span":
                    walk(getattr(value, field.name))

    walk(node)
    return tuple(sorted(found))


def _python_value(q: Quantity):
    if q.is_list:
        return [_python_value(item) for item in q.value]
    if q.unit == PLAIN and q.value.denominator == 1:
        return q.value.numerator
    return q.value


def resolve(loaded: Loaded, overrides: Mapping[str, str] | None = None) -> tuple[Program, list]:
    """Resolve and evaluate: the program made of every declaration that resolved, and the problems.

    Declarations that failed (and those that depend on them) are left out, so later checks can run
    on the rest without reporting the same mistake twice.
    """
    resolver = _Resolver(loaded, overrides or {})
    program = resolver.resolve()
    return program, list(resolver.bag)
