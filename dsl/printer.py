"""The canonical text of a `.clock` AST (`dsl fmt`): parse(print(tree)) == tree for every tree.

Layout: one statement per line (a blank line between kinds of statements and around stages), region
clauses on the declaration line with each trailing `bind` on a line of its own, stage items one per
line inside the braces. Comments are kept where they were (see `module`); printing is idempotent.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol

import attrs

from duplexcadence.dsl import syntax
from duplexcadence.dsl.source import Span

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def number_text(value: Fraction) -> str:
    """An exact literal: integers as written, terminating decimals as decimals, else a division."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for factor in (2, 5):
        while denominator % factor == 0:
            denominator //= factor
    if denominator == 1:
        digits = 0
        scaled = value
        while scaled.denominator != 1:
            scaled *= 10
            digits += 1
        whole = abs(scaled.numerator)
        text = str(whole).rjust(digits + 1, "0")
        return ("-" if value < 0 else "") + text[:-digits] + "." + text[-digits:]
    return f"{value.numerator}/{value.denominator}"


def expr(node: syntax.Expr, parent: int = 0, right_side: bool = False) -> str:
    if isinstance(node, syntax.Number):
        text = number_text(node.value)
        if node.value.denominator != 1 and "/" in text:
            text = f"({text})" if parent else text
        if node.unit:
            text = f"{text} {node.unit}"
            if parent >= 2:
                text = f"({text})"
        return text
    if isinstance(node, syntax.Name):
        return node.id
    if isinstance(node, syntax.Neg):
        return "-" + expr(node.operand, 3)
    if isinstance(node, syntax.BinOp):
        precedence = _PRECEDENCE[node.op]
        text = f"{expr(node.left, precedence)} {node.op} {expr(node.right, precedence, True)}"
        if precedence < parent or (right_side and precedence == parent):
            return f"({text})"
        return text
    if isinstance(node, syntax.ListExpr):
        return "[" + ", ".join(expr(i) for i in node.items) + "]"
    if isinstance(node, syntax.Index):
        return f"{expr(node.target, 4)}[{expr(node.index)}]"
    if isinstance(node, syntax.Call):
        return f"{node.func}(" + ", ".join(expr(a) for a in node.args) + ")"
    raise AssertionError(f"unknown expression {node!r}")


def _retention(node: syntax.Retention) -> str:
    if isinstance(node, syntax.KeepLast):
        return f"last {expr(node.count)}"
    if isinstance(node, syntax.KeepRing):
        return f"ring {expr(node.count)}"
    if isinstance(node, syntax.KeepFirstLast):
        return f"first {expr(node.first)} + last {expr(node.last)}"
    if isinstance(node, syntax.KeepAll):
        return "all" if node.horizon is None else f"all horizon {expr(node.horizon)}"
    if isinstance(node, syntax.KeepSlide):
        first = f"first {expr(node.first)} + " if node.first is not None else ""
        return f"{first}slide {expr(node.high)} to {expr(node.low)}"
    return "scratch"


def _clause(node: syntax.RegionClause) -> str:
    if isinstance(node, syntax.OnClause):
        return f"on {node.clock}" + (f"[{expr(node.member)}]" if node.member is not None else "")
    if isinstance(node, syntax.RetainClause):
        return f"retain {_retention(node.retention)}"
    if isinstance(node, syntax.StartClause):
        policy = node.policy
        if isinstance(policy, syntax.StartGiven):
            return "start given" if policy.count is None else f"start given {expr(policy.count)}"
        if isinstance(policy, syntax.StartFirst):
            return "start first"
        if isinstance(policy, syntax.StartFirstFiring):
            return "start first-firing"
        return "start zeros" if isinstance(policy, syntax.StartZeros) else "start empty"
    if isinstance(node, syntax.StockClause):
        return f"stock {expr(node.capacity)}"
    if isinstance(node, syntax.BindClause):
        return _bind(node)
    return node.role


def _bind(node: syntax.BindClause) -> str:
    """`bind [private] [OBJECT] "path"`."""
    parts = ["bind"] + (["private"] if node.private else []) + ([node.owner] if node.owner else [])
    return " ".join(parts) + f' "{node.path}"'


def _advance(node: syntax.Expr, up_to: bool) -> str:
    """`+2`, or `up to 19` for an advance decided at run time."""
    return f"up to {expr(node)}" if up_to else f"+{expr(node, 3)}"


def _ref(node: syntax.RegionRef) -> str:
    return node.name if node.index is None else f"{node.name}[{expr(node.index)}]"


def _family(node: syntax.Family | None) -> str:
    """`[layer < 8]`, `[stage < 6, layer < 3]`, or nothing."""
    if node is None:
        return ""
    return "[" + ", ".join(f"{f.index} < {expr(f.count)}" for f in node.indices()) + "]"


def _item(node: syntax.StageItem) -> str:
    if isinstance(node, syntax.ModuleItem):
        return f'module private "{node.path}"' if node.private else f'module "{node.path}"'
    if isinstance(node, syntax.HookItem):
        return f"hook {node.name}"
    if isinstance(node, syntax.RngItem):
        return "rng"
    if isinstance(node, syntax.RowsItem):
        return f"rows {expr(node.count)}"
    if isinstance(node, syntax.ReadItem):
        parts = ["read"] + (["prev"] if node.prev else []) + [_ref(node.region)]
        if isinstance(node.span_clause, syntax.SpanLast):
            parts.append(f"last {expr(node.span_clause.count)}")
        elif isinstance(node.span_clause, syntax.SpanNew):
            parts.append("new" if node.span_clause.context is None else f"new + {expr(node.span_clause.context)}")
        if node.lookahead is not None:
            parts.append(f"lookahead {expr(node.lookahead)}")
        if node.alias is not None:
            parts.append(f"as {node.alias}")
        return " ".join(parts)
    if isinstance(node, syntax.WithItem):
        return f"with {node.name} = {_argument_value(node.value)}"
    if isinstance(node, syntax.UpdateItem):
        parts = ["update", _ref(node.region)]
        if node.advance is not None:
            parts.append(_advance(node.advance, node.up_to))
        if node.alias is not None:
            parts.append(f"as {node.alias}")
        if node.field is not None:
            parts.append(f"from {node.field}")
        return " ".join(parts)
    parts = ["write", _ref(node.region)]
    if node.advance is not None:
        parts.append(_advance(node.advance, node.up_to))
    if node.latency is not None:
        parts.append(f"latency {expr(node.latency)}" + (" dropped" if node.latency_dropped else ""))
    if node.loss is not None:
        parts.append(f"loses {expr(node.loss)}" + (" intended" if node.loss_intended else ""))
    if node.field is not None:
        parts.append(f"from {node.field}")
    return " ".join(parts)


def _argument_value(value: syntax.Expr | str | bool) -> str:
    """A `with` item's value: `true`, `false`, a "string" or an expression."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return expr(value)


LINE_LENGTH = 100
"""A region declaration longer than this moves its trailing `stock` clauses to lines of their own."""


def _region_lines(node: syntax.Region) -> list[tuple[str, syntax.RegionClause | None]]:
    """The region's output lines, each with the clause it holds (None for the declaration line).

    The declaration line holds every clause but the trailing `stock`/`bind` ones; each trailing
    `bind` goes on a line of its own, and so does a trailing `stock` when the declaration line
    would otherwise pass LINE_LENGTH. Clauses keep their written order, so the clause tuple
    round-trips.
    """
    family = _family(node.family)
    dims = ", ".join("time" if isinstance(d, syntax.TimeAxis) else expr(d) for d in node.shape)
    line = f"region {node.name}{family} : {node.dtype}[{dims}]"
    clauses = list(node.clauses)
    tail = len(clauses)
    while tail > 0 and isinstance(clauses[tail - 1], (syntax.StockClause, syntax.BindClause)):
        tail -= 1
    line += "".join(" " + _clause(c) for c in clauses[:tail])
    for clause in clauses[tail:]:
        if isinstance(clause, syntax.BindClause) or len(line) + 1 + len(_clause(clause)) > LINE_LENGTH:
            break
        line += " " + _clause(clause)
        tail += 1
    return [(line, None)] + [("    " + _clause(c), c) for c in clauses[tail:]]


def statement(node: syntax.Statement) -> str:
    if isinstance(node, syntax.Use):
        names = f" ({', '.join(node.names)})" if node.names is not None else ""
        return f"use {node.dotted}{names}"
    if isinstance(node, syntax.Cadence):
        return f"cadence {expr(node.period)}"
    if isinstance(node, syntax.Param):
        return f"param {node.name} = {expr(node.default)}"
    if isinstance(node, syntax.Clock):
        if node.bound is not None:
            return f"clock {node.name} = up to {expr(node.bound)} per {expr(node.rate)}"
        return f"clock {node.name}{_family(node.family)} = {expr(node.rate)}"
    if isinstance(node, syntax.Region):
        return "\n".join(text for text, _ in _region_lines(node))
    if isinstance(node, syntax.Stage):
        items = "".join(f"    {_item(i)}\n" for i in node.items)
        return f"stage {node.name} on {node.clock} {{\n{items}}}"
    if isinstance(node, syntax.Counter):
        modulo = f" mod {expr(node.modulo)}" if node.modulo is not None else ""
        bind = f" {_bind(node.bind)}" if node.bind is not None else ""
        return f"counter {node.name} +{expr(node.step, 3)}{modulo} on {node.clock}{bind}"
    if isinstance(node, syntax.Object):
        if node.stage is not None:
            return f"object {node.name} from stage {node.stage}"
        return f"object {node.name}" + (f" from {node.factory}" if node.factory else "")
    raise AssertionError(f"unknown statement {node!r}")


def _blank_between(previous: syntax.Statement, current: syntax.Statement) -> bool:
    """The canonical layout's blank lines: between statements of different kinds, around stages."""
    return type(previous) is not type(current) or isinstance(current, syntax.Stage)


def module(node: syntax.Module) -> str:
    """The canonical text of a whole file (ends with one newline).

    Comments (`node.comments`, located by their spans) are kept: a comment on a line of its own stays
    on a line of its own before what followed it; a comment after code stays at the end of that
    code's line, and the comments of consecutive lines are aligned. Blank lines the source had
    between statements are kept (several become one), and the canonical ones are added.
    """
    if not node.comments or any(item.span is None for item in node.statements):
        return _module_without_comments(node)
    return _CommentedPrinter(node).text()


def _module_without_comments(node: syntax.Module) -> str:
    lines: list[str] = []
    previous = None
    for item in node.statements:
        if previous is not None and _blank_between(previous, item):
            lines.append("")
        lines.append(statement(item))
        previous = item
    return "\n".join(lines) + "\n"


class _Line:
    """One output line: its code, the source line it comes from, and the comments that end it."""

    def __init__(self, code: str, anchor: int):
        self.code = code
        self.anchor = anchor
        self.comments: list[str] = []


class _Located(Protocol):
    @property
    def span(self) -> Span | None: ...


def _span_of(node: _Located) -> Span:
    """Where a node is written: the commented layout is only used for parsed modules (see `module`)."""
    assert node.span is not None, f"{type(node).__name__} has no position"
    return node.span


@attrs.frozen
class _PlacedComment:
    text: str
    span: Span


class _CommentedPrinter:
    def __init__(self, node: syntax.Module):
        self.node = node
        placed = (_PlacedComment(c.text, _span_of(c)) for c in node.comments)
        self.comments = sorted(placed, key=lambda c: (c.span.line, c.span.column))

    def _own_line(self, comment: _PlacedComment) -> bool:
        """Whether no code precedes the comment on its line."""
        first_code = self._source_columns.get(comment.span.line)
        return first_code is None or first_code > comment.span.column

    def text(self) -> str:
        self._source_columns = self._columns_of_code()
        statements = list(self.node.statements)
        out: list[tuple[str, str | None]] = []
        last_end = 0  # the last source line already printed
        previous: syntax.Statement | None = None
        pending = [c for c in self.comments]
        for item in statements:
            item_span = _span_of(item)
            leading = [c for c in pending if c.span.line < item_span.line]
            pending = [c for c in pending if c.span.line >= item_span.line]
            group_start = leading[0].span.line if leading else item_span.line
            if previous is not None and (group_start - last_end > 1 or _blank_between(previous, item)):
                out.append(("", None))
            for position, comment in enumerate(leading):
                out.append((comment.text, None))
                following = leading[position + 1].span.line if position + 1 < len(leading) else item_span.line
                if following - comment.span.line > 1:
                    out.append(("", None))
            inner = [c for c in pending if c.span.line <= item_span.end_line]
            pending = [c for c in pending if c.span.line > item_span.end_line]
            out.extend(self._render(item, inner))
            last_end = item_span.end_line
            previous = item
        if pending:
            if out and pending[0].span.line - last_end > 1:
                out.append(("", None))
            for position, comment in enumerate(pending):
                out.append((comment.text, None))
                if position + 1 < len(pending) and pending[position + 1].span.line - comment.span.line > 1:
                    out.append(("", None))
        return "\n".join(_aligned(out)) + "\n"

    def _columns_of_code(self) -> dict[int, int]:
        """For each source line of a statement, the column where its code starts (spans of the
        statement's parts); lines holding only a comment inside a statement are absent."""
        columns: dict[int, int] = {}

        def visit(value) -> None:
            span = getattr(value, "span", None)
            if span is not None:
                columns[span.line] = min(columns.get(span.line, span.column), span.column)
            if isinstance(value, (list, tuple)):
                for element in value:
                    visit(element)
            elif attrs.has(type(value)):
                for field in attrs.fields(type(value)):
                    if field.eq:
                        visit(getattr(value, field.name))

        for item in self.node.statements:
            visit(item)
            if isinstance(item, syntax.Stage):  # the closing brace
                item_span = _span_of(item)
                columns.setdefault(item_span.end_line, item_span.end_column - 1)
        return columns

    def _lines_of(self, item: syntax.Statement) -> list[_Line]:
        item_span = _span_of(item)
        if isinstance(item, syntax.Region):
            result = []
            for text, clause in _region_lines(item):
                result.append(_Line(text, _span_of(clause).line if clause is not None else item_span.line))
            return result
        if isinstance(item, syntax.Stage):
            result = [_Line(f"stage {item.name} on {item.clock} {{", item_span.line)]
            result += [_Line("    " + _item(i), _span_of(i).line) for i in item.items]
            result.append(_Line("}", item_span.end_line))
            return result
        return [_Line(statement(item), item_span.line)]

    def _render(self, item: syntax.Statement, comments: list[_PlacedComment]) -> list[tuple[str, str | None]]:
        lines = self._lines_of(item)
        before: dict[int, list[str]] = {}
        for comment in comments:
            line = comment.span.line
            if self._own_line(comment) and line != _span_of(item).line:
                target = next((i for i, candidate in enumerate(lines) if candidate.anchor > line), len(lines) - 1)
                before.setdefault(target, []).append(comment.text)
                continue
            exact = [candidate for candidate in lines if candidate.anchor == line]
            target_line = exact[-1] if exact else [c for c in lines if c.anchor <= line][-1]
            target_line.comments.append(comment.text)
        out: list[tuple[str, str | None]] = []
        for index, printed in enumerate(lines):
            indent = " " * (len(printed.code) - len(printed.code.lstrip(" ")))
            if isinstance(item, syntax.Stage) and index == len(lines) - 1:
                indent = "    "  # comments before the closing brace stay inside the stage
            for text in before.get(index, []):
                out.append((indent + text, None))
            out.append((printed.code, " ".join(printed.comments) if printed.comments else None))
        return out


ALIGN_LIMIT = 60
"""Trailing comments of consecutive lines line up after the longest code up to this width; longer
lines keep two spaces before their comment."""


def _aligned(lines: list[tuple[str, str | None]]) -> list[str]:
    """Code lines with their trailing comments; consecutive commented lines share one comment column."""
    result: list[str] = []
    index = 0
    while index < len(lines):
        if lines[index][1] is None:
            result.append(lines[index][0])
            index += 1
            continue
        run: list[tuple[str, str]] = []  # consecutive commented lines
        while index < len(lines) and (comment := lines[index][1]) is not None:
            run.append((lines[index][0], comment))
            index += 1
        widths = [len(code) for code, _ in run if len(code) <= ALIGN_LIMIT]
        column = max(widths, default=0) + 2
        for code, comment in run:
            result.append(code.ljust(column) + comment if len(code) + 2 <= column else f"{code}  {comment}")
    return result
