"""Exact evaluation of `.clock` expressions, with units.

A value is a `Quantity`: an exact `Fraction` (or a list of quantities) and a unit written as the
exponent of seconds: 0 is a plain number, 1 a duration (s), -1 a rate (Hz). So `10 s * 25 Hz` is
the plain number 250, `sample / 1920` is a rate, and `1 s + 3` is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import attrs

from duplexcadence.dsl import messages, syntax
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic

PLAIN, SECONDS, HERTZ = 0, 1, -1
_UNIT_SCALE = {
    "Hz": (Fraction(1), HERTZ),
    "kHz": (Fraction(1000), HERTZ),
    "s": (Fraction(1), SECONDS),
    "ms": (Fraction(1, 1000), SECONDS),
}
_UNIT_NAMES = {PLAIN: "a plain number", SECONDS: "a duration (s)", HERTZ: "a rate (Hz)"}
MAX_MAGNITUDE = 10**15


@attrs.frozen
class Quantity:
    """An exact value with a unit (exponent of seconds), or a list of values (`unit` is then PLAIN)."""

    value: Fraction | tuple[Quantity, ...]
    unit: int = PLAIN

    @property
    def is_list(self) -> bool:
        return isinstance(self.value, tuple)

    @property
    def fraction(self) -> Fraction:
        """The exact value of a single quantity (callers have checked `is_list`)."""
        assert isinstance(self.value, Fraction), "a list has no single value"
        return self.value

    @property
    def items(self) -> tuple[Quantity, ...]:
        """The quantities of a list (callers have checked `is_list`)."""
        assert isinstance(self.value, tuple), "a single value has no items"
        return self.value

    def describe(self) -> str:
        if isinstance(self.value, tuple):
            return "[" + ", ".join(q.describe() for q in self.value) + "]"
        text = _fraction_text(self.value)
        return {PLAIN: text, SECONDS: f"{text} s", HERTZ: f"{text} Hz"}[self.unit]

    @property
    def kind(self) -> str:
        if isinstance(self.value, tuple):
            return "a list"
        if self.unit != PLAIN:
            return _UNIT_NAMES[self.unit]
        return "an integer" if self.value.denominator == 1 else "a fraction"


def _fraction_text(value: Fraction) -> str:
    """Exact text: `12.5` where a decimal is exact, `1/3` where it is not."""
    from duplexcadence.dsl.printer import number_text

    return number_text(value)


def unit_name(unit: int) -> str:
    return _UNIT_NAMES.get(unit, f"s^{unit}")


class EvalError(ClockError):
    """An expression that cannot be evaluated; carries one located diagnostic."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__([diagnostic])


Lookup = Callable[[syntax.Name], Quantity]


def evaluate(expr: syntax.Expr, lookup: Lookup) -> Quantity:
    """Evaluate `expr`; `lookup` resolves names (and raises EvalError for unknown ones)."""
    if isinstance(expr, syntax.Number):
        if expr.unit is None:
            return _bounded(Quantity(expr.value), expr)
        scale, unit = _UNIT_SCALE[expr.unit]
        return _bounded(Quantity(expr.value * scale, unit), expr)
    if isinstance(expr, syntax.Name):
        return lookup(expr)
    if isinstance(expr, syntax.Neg):
        operand = _scalar(evaluate(expr.operand, lookup), expr.operand, "negate")
        return Quantity(-operand.fraction, operand.unit)
    if isinstance(expr, syntax.BinOp):
        return _binop(expr, lookup)
    if isinstance(expr, syntax.ListExpr):
        return Quantity(tuple(evaluate(item, lookup) for item in expr.items))
    if isinstance(expr, syntax.Index):
        return _index(expr, lookup)
    if isinstance(expr, syntax.Call):
        return _call(expr, lookup)
    raise AssertionError(f"unknown expression node {expr!r}")


def _bounded(quantity: Quantity, expr: syntax.Expr) -> Quantity:
    if isinstance(quantity.value, tuple):
        return quantity
    if abs(quantity.value) > MAX_MAGNITUDE:
        raise EvalError(
            messages.bad_value(
                f"{quantity.describe()} is too large (the limit is 10^15)",
                expr.span,
                "a region or rate this large cannot be allocated or scheduled",
            )
        )
    if quantity.value.denominator > MAX_MAGNITUDE:
        raise EvalError(
            messages.bad_value(
                f"a value of {_fraction_text(quantity.value)} is too fine: its denominator "
                f"{quantity.value.denominator} is over the limit of 10^15",
                expr.span,
                "no rate, duration or count needs a fraction that fine: check the divisions",
            )
        )
    return quantity


def _scalar(q: Quantity, expr: syntax.Expr, what: str) -> Quantity:
    if q.is_list:
        raise EvalError(
            messages.bad_value(
                f"cannot {what} a list", expr.span, "index the list (`ratios[0]`) or reduce it (`prod(ratios)`)"
            )
        )
    return q


def _binop(expr: syntax.BinOp, lookup: Lookup) -> Quantity:
    verb = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}[expr.op]
    left = _scalar(evaluate(expr.left, lookup), expr.left, verb)
    right = _scalar(evaluate(expr.right, lookup), expr.right, verb)
    if expr.op in "+-":
        if left.unit != right.unit:
            raise EvalError(
                messages.bad_value(
                    f"cannot {verb} {unit_name(left.unit)} and {unit_name(right.unit)}",
                    expr.span,
                    "both sides of + and - need the same unit",
                )
            )
        value = left.fraction + right.fraction if expr.op == "+" else left.fraction - right.fraction
        return _bounded(Quantity(value, left.unit), expr)
    if expr.op == "*":
        unit, value = left.unit + right.unit, left.fraction * right.fraction
    else:
        if right.fraction == 0:
            raise EvalError(messages.bad_value("division by zero", expr.span, "the divisor must not be zero"))
        unit, value = left.unit - right.unit, left.fraction / right.fraction
    if unit not in _UNIT_NAMES:
        raise EvalError(
            messages.bad_value(
                f"{unit_name(left.unit)} {expr.op} {unit_name(right.unit)} has no unit DuplexCadence uses",
                expr.span,
                "values are plain numbers, durations (s) or rates (Hz)",
            )
        )
    return _bounded(Quantity(value, unit), expr)


def _index(expr: syntax.Index, lookup: Lookup) -> Quantity:
    target = evaluate(expr.target, lookup)
    if not isinstance(target.value, tuple):
        raise EvalError(
            messages.bad_value(
                f"{target.describe()} is not a list and cannot be indexed", expr.span, "only list params can be indexed"
            )
        )
    elements = target.value
    position = require_int(evaluate(expr.index, lookup), expr.index, "a list index")
    if not 0 <= position < len(elements):
        raise EvalError(
            messages.bad_value(
                f"index {position} is out of range for a list of {len(elements)}",
                expr.index.span,
                f"use an index from 0 to {len(elements) - 1}",
            )
        )
    return elements[position]


def _call(expr: syntax.Call, lookup: Lookup) -> Quantity:
    if expr.func not in messages.BUILTIN_FUNCTIONS:
        raise EvalError(messages.unknown_function(expr.func, expr.span))
    args = [evaluate(a, lookup) for a in expr.args]
    if expr.func == "len":
        if len(args) != 1 or not args[0].is_list:
            raise EvalError(messages.bad_value("len() takes one list", expr.span, "write len(ratios)"))
        return Quantity(Fraction(len(args[0].items)))
    items = args[0].items if len(args) == 1 and args[0].is_list else tuple(args)
    if not items:
        raise EvalError(
            messages.bad_value(
                f"{expr.func}() of nothing", expr.span, f"give {expr.func}() a non-empty list or several values"
            )
        )
    for item, node in zip(items, expr.args if len(args) > 1 else [expr] * len(items)):
        _scalar(item, node, f"take {expr.func}() of")
    units = {q.unit for q in items}
    if len(units) > 1:
        raise EvalError(
            messages.bad_value(f"{expr.func}() of values with different units", expr.span, "give values of one unit")
        )
    unit = units.pop()
    if expr.func == "prod":
        value = Fraction(1)
        for q in items:
            value = _bounded(Quantity(value * q.fraction), expr).fraction  # bounded at each step: no huge products
        if unit != PLAIN:
            raise EvalError(messages.bad_value("prod() takes plain numbers", expr.span, "drop the units"))
        return _bounded(Quantity(value), expr)
    if expr.func == "sum":
        return _bounded(Quantity(sum((q.fraction for q in items), Fraction(0)), unit), expr)
    pick = max if expr.func == "max" else min
    return Quantity(pick(q.fraction for q in items), unit)


def require_int(q: Quantity, expr: syntax.Expr | None, what: str, minimum: int | None = None) -> int:
    """The integer value of a plain number, or a located bad-value error naming `what`."""
    span = expr.span if expr is not None else None
    if isinstance(q.value, tuple) or q.unit != PLAIN or q.value.denominator != 1:
        raise EvalError(
            messages.bad_value(f"{what} must be an integer, not {q.describe()}", span, "write a whole number of units")
        )
    value = q.value.numerator
    if minimum is not None and value < minimum:
        raise EvalError(
            messages.bad_value(f"{what} must be at least {minimum}, not {value}", span, f"write a number >= {minimum}")
        )
    return value


def count_of(q: Quantity, rate: Fraction, expr: syntax.Expr, what: str, minimum: int = 0) -> int:
    """A count of clock units from a plain integer or a duration converted with `rate` (Hz)."""
    if isinstance(q.value, Fraction) and q.unit == SECONDS:
        units = q.value * rate
        if units.denominator != 1:
            raise EvalError(
                messages.bad_value(
                    f"{what} of {q.describe()} is {_fraction_text(units)} units at {_fraction_text(rate)} Hz, "
                    "not a whole number",
                    expr.span,
                    "pick a duration that is a whole number of units",
                )
            )
        q = Quantity(units)
    return require_int(q, expr, what, minimum)
