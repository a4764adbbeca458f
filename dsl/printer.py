"""The canonical text of a `.clock` AST (`dsl fmt`): parse(print(tree)) == tree for every tree.

Layout: one statement per line (a blank line between kinds of statements), region clauses on the
declaration line, stage items one per line inside the braces. Comments are not kept.
"""

from __future__ import annotations

from fractions import Fraction

from . import ast

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


def expr(node: ast.Expr, parent: int = 0, right_side: bool = False) -> str:
    if isinstance(node, ast.Number):
        text = number_text(node.value)
        if node.value.denominator != 1 and "/" in text:
            text = f"({text})" if parent else text
        if node.unit:
            text = f"{text} {node.unit}"
            if parent >= 2:
                text = f"({text})"
        return text
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Neg):
        return "-" + expr(node.operand, 3)
    if isinstance(node, ast.BinOp):
        precedence = _PRECEDENCE[node.op]
        text = f"{expr(node.left, precedence)} {node.op} {expr(node.right, precedence, True)}"
        if precedence < parent or (right_side and precedence == parent):
            return f"({text})"
        return text
    if isinstance(node, ast.ListExpr):
        return "[" + ", ".join(expr(i) for i in node.items) + "]"
    if isinstance(node, ast.Index):
        return f"{expr(node.target, 4)}[{expr(node.index)}]"
    if isinstance(node, ast.Call):
        return f"{node.func}(" + ", ".join(expr(a) for a in node.args) + ")"
    raise AssertionError(f"unknown expression {node!r}")


def _retention(node: ast.Retention) -> str:
    if isinstance(node, ast.KeepLast):
        return f"last {expr(node.count)}"
    if isinstance(node, ast.KeepRing):
        return f"ring {expr(node.count)}"
    if isinstance(node, ast.KeepFirstLast):
        return f"first {expr(node.first)} + last {expr(node.last)}"
    if isinstance(node, ast.KeepAll):
        return "all" if node.horizon is None else f"all horizon {expr(node.horizon)}"
    return "scratch"


def _clause(node: ast.RegionClause) -> str:
    if isinstance(node, ast.OnClause):
        return f"on {node.clock}"
    if isinstance(node, ast.RetainClause):
        return f"retain {_retention(node.retention)}"
    if isinstance(node, ast.StartClause):
        policy = node.policy
        if isinstance(policy, ast.StartGiven):
            return "start given" if policy.count is None else f"start given {expr(policy.count)}"
        return "start zeros" if isinstance(policy, ast.StartZeros) else "start empty"
    if isinstance(node, ast.StockClause):
        return f"stock {expr(node.capacity)}"
    if isinstance(node, ast.BindClause):
        return f'bind "{node.path}"'
    return node.role


def _ref(node: ast.RegionRef) -> str:
    return node.name if node.index is None else f"{node.name}[{expr(node.index)}]"


def _item(node: ast.StageItem) -> str:
    if isinstance(node, ast.ModuleItem):
        return f'module "{node.path}"'
    if isinstance(node, ast.HookItem):
        return f"hook {node.name}"
    if isinstance(node, ast.RngItem):
        return "rng"
    if isinstance(node, ast.ReadItem):
        parts = ["read"] + (["prev"] if node.prev else []) + [_ref(node.region)]
        if isinstance(node.span_clause, ast.SpanLast):
            parts.append(f"last {expr(node.span_clause.count)}")
        elif isinstance(node.span_clause, ast.SpanNew):
            parts.append("new" if node.span_clause.context is None else f"new + {expr(node.span_clause.context)}")
        if node.lookahead is not None:
            parts.append(f"lookahead {expr(node.lookahead)}")
        if node.alias is not None:
            parts.append(f"as {node.alias}")
        return " ".join(parts)
    if isinstance(node, ast.UpdateItem):
        if node.advance is None:
            return f"update {_ref(node.region)}"
        return f"update {_ref(node.region)} +{expr(node.advance, 3)}"
    parts = ["write", _ref(node.region)]
    if node.advance is not None:
        parts.append(f"+{expr(node.advance, 3)}")
    if node.latency is not None:
        parts.append(f"latency {expr(node.latency)}")
    return " ".join(parts)


def statement(node: ast.Statement) -> str:
    if isinstance(node, ast.Use):
        names = f" ({', '.join(node.names)})" if node.names is not None else ""
        return f"use {node.dotted}{names}"
    if isinstance(node, ast.Cadence):
        return f"cadence {expr(node.period)}"
    if isinstance(node, ast.Param):
        return f"param {node.name} = {expr(node.default)}"
    if isinstance(node, ast.Clock):
        return f"clock {node.name} = {expr(node.rate)}"
    if isinstance(node, ast.Region):
        family = f"[{node.family.index} < {expr(node.family.count)}]" if node.family else ""
        dims = ", ".join("time" if isinstance(d, ast.TimeAxis) else expr(d) for d in node.shape)
        inline = "".join(" " + _clause(c) for c in node.clauses if not isinstance(c, ast.BindClause))
        binds = "".join("\n    " + _clause(c) for c in node.clauses if isinstance(c, ast.BindClause))
        if binds and any(isinstance(c, ast.BindClause) for c in node.clauses[:-1]):
            # keep written order when a bind is not last, so the clause tuple round-trips
            inline, binds = "".join(" " + _clause(c) for c in node.clauses), ""
        return f"region {node.name}{family} : {node.dtype}[{dims}]{inline}{binds}"
    if isinstance(node, ast.Stage):
        items = "".join(f"    {_item(i)}\n" for i in node.items)
        return f"stage {node.name} on {node.clock} {{\n{items}}}"
    raise AssertionError(f"unknown statement {node!r}")


def module(node: ast.Module) -> str:
    """The canonical text of a whole file (ends with one newline)."""
    lines: list[str] = []
    previous = None
    for item in node.statements:
        kind = type(item)
        if previous is not None and (kind is not previous or kind is ast.Stage):
            lines.append("")
        lines.append(statement(item))
        previous = kind
    return "\n".join(lines) + "\n"
