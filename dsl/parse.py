"""Parse `.clock` text into the AST (`duplexcadence.dsl.ast`).

The grammar (`grammar/clock.lark`, shipped as package data) is compiled once with Lark's LALR parser
and contextual lexer. Syntax errors become `Diagnostic`s that say what was found, what was expected
and which declaration was open; Lark types never leave this module.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from importlib import resources

import lark
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from . import ast, messages
from .diagnostics import ClockError, Diagnostic
from .source import SourceFile, Span

MAX_SOURCE_BYTES = 1_000_000

_TERMINAL_NAMES = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": 'a "string"',
    "UNIT": "a unit (Hz, kHz, s, ms)",
    "PREV": "'prev'",
}
_STATEMENT_KEYWORDS = {"use", "cadence", "param", "clock", "region", "stage"}


def grammar_text() -> str:
    """The grammar source, read from the installed package (works from any folder)."""
    return resources.files("duplexcadence").joinpath("grammar", "clock.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> Lark:
    return Lark(grammar_text(), start=["program", "value"], parser="lalr", lexer="contextual",
                propagate_positions=True, maybe_placeholders=True)


def parse_module(source: SourceFile) -> ast.Module:
    """Parse a whole file. Raises `ClockError` with one located syntax diagnostic on bad input."""
    if len(source.text.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        raise ClockError([messages.file_too_large(source.path, len(source.text.encode("utf-8", "surrogatepass")),
                                                  MAX_SOURCE_BYTES)])
    tree = _run(source, "program")
    statements = _transform(source, tree)
    return ast.Module(source.path, tuple(statements))


def parse_value(text: str, path: str = "<--param>") -> ast.Expr:
    """Parse one expression, as given to `--param NAME=VALUE`."""
    source = SourceFile(path, text)
    tree = _run(source, "value")
    return _transform(source, tree)


def _run(source: SourceFile, start: str) -> lark.Tree:
    try:
        return _parser().parse(source.text, start=start)
    except UnexpectedInput as error:
        raise ClockError([_syntax_diagnostic(source, error)]) from None
    except RecursionError:
        span = Span.point(source.path, 1, 1)
        raise ClockError([messages.bad_value("the text nests too deeply to parse", span,
                                             "flatten the expression")]) from None


def _transform(source: SourceFile, tree: lark.Tree):
    try:
        return _ToAst(source.path).transform(tree)
    except VisitError as error:
        original = error.orig_exc
        if isinstance(original, ClockError):
            raise ClockError(original.diagnostics) from None
        if isinstance(original, RecursionError):
            raise ClockError([messages.bad_value("the text nests too deeply to parse",
                                                 Span.point(source.path, 1, 1), "flatten the expression")]) from None
        raise
    except RecursionError:
        raise ClockError([messages.bad_value("the text nests too deeply to parse",
                                             Span.point(source.path, 1, 1), "flatten the expression")]) from None


# --- syntax errors ------------------------------------------------------------------------------


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    for terminal in _parser().terminals:
        if terminal.name == name:
            pattern = terminal.pattern
            if isinstance(pattern, lark.lexer.PatternStr):
                return f"'{pattern.value}'"
    if name == "$END":
        return "the end of the file"
    return name.lower()


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type in _TERMINAL_NAMES:
        return f"{_TERMINAL_NAMES[token.type].split(' (')[0]} '{token.value}'"
    return f"'{token.value}'"


def _open_declaration(source: SourceFile, position: int) -> str | None:
    """The innermost declaration open at `position`, e.g. "stage 'decode'", from the text before it."""
    words: list[tuple[str, str | None]] = []
    depth = 0
    try:
        for token in _parser().lex(source.text[:position]):
            value = str(token)
            if value in _STATEMENT_KEYWORDS:
                words.append((value, None))
            elif token.type == "NAME" and words and words[-1][1] is None:
                words[-1] = (words[-1][0], value)
            elif value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
    except UnexpectedInput:
        pass
    if not words:
        return None
    keyword, name = words[-1]
    if keyword == "stage" and depth <= 0 and name is not None and source.text[:position].rstrip().endswith("}"):
        return None
    return f"{keyword} '{name}'" if name else keyword


def _syntax_diagnostic(source: SourceFile, error: UnexpectedInput) -> Diagnostic:
    if isinstance(error, UnexpectedCharacters):
        char = source.text[error.pos_in_stream] if error.pos_in_stream < len(source.text) else "?"
        return messages.syntax_bad_character(char, Span.point(source.path, error.line, error.column))
    expected = sorted({_describe_terminal(name) for name in getattr(error, "expected", set()) or set()})
    if isinstance(error, UnexpectedToken):
        token = error.token
        position = token.start_pos if token.start_pos is not None else len(source.text)
        context = _open_declaration(source, position)
        if token.type == "$END":
            return messages.syntax_unexpected_end(expected, source.end_span(), context)
        span = Span(source.path, token.line, token.column, token.end_line or token.line,
                    token.end_column or token.column + len(str(token)))
        return messages.syntax_unexpected(_describe_token(token), expected, span, context)
    return messages.syntax_unexpected_end(expected, source.end_span(), None)


# --- tree -> AST --------------------------------------------------------------------------------


@v_args(meta=True)
class _ToAst(Transformer):
    """Turns the Lark tree into AST nodes; every method gets Lark's `meta` for the span."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def _span(self, meta) -> Span | None:
        if getattr(meta, "empty", True):
            return None
        return Span(self.path, meta.line, meta.column, meta.end_line, meta.end_column)

    def _token_span(self, token: Token) -> Span:
        return Span(self.path, token.line, token.column, token.end_line, token.end_column)

    def __default__(self, data, children, meta):
        raise AssertionError(f"grammar rule '{data}' has no AST constructor")

    # statements
    def program(self, meta, statements):
        return list(statements)

    def value(self, meta, children):
        return children[0]

    def use_stmt(self, meta, children):
        module, *names = children
        return ast.Use(tuple(module), tuple(names[0]) if names and names[0] is not None else None,
                       span=self._span(meta))

    def dotted_name(self, meta, parts):
        return [str(p) for p in parts]

    def import_names(self, meta, names):
        return [str(n) for n in names]

    def cadence_stmt(self, meta, children):
        return ast.Cadence(children[0], span=self._span(meta))

    def param_stmt(self, meta, children):
        name, default = children
        return ast.Param(str(name), default, span=self._span(meta))

    def clock_stmt(self, meta, children):
        name, rate = children
        return ast.Clock(str(name), rate, span=self._span(meta))

    def region_stmt(self, meta, children):
        name, family, dtype, shape, *clauses = children
        return ast.Region(str(name), family, str(dtype), tuple(shape), tuple(clauses), span=self._span(meta),
                          dtype_span=self._token_span(dtype))

    def family(self, meta, children):
        index, count = children
        return ast.Family(str(index), count, span=self._span(meta))

    def shape(self, meta, dims):
        return list(dims)

    def time_axis(self, meta, children):
        return ast.TimeAxis(span=self._span(meta))

    def on_clause(self, meta, children):
        return ast.OnClause(str(children[0]), span=self._span(meta))

    def retain_clause(self, meta, children):
        return ast.RetainClause(children[0], span=self._span(meta))

    def start_clause(self, meta, children):
        return ast.StartClause(children[0], span=self._span(meta))

    def stock_clause(self, meta, children):
        return ast.StockClause(children[0], span=self._span(meta))

    def bind_clause(self, meta, children):
        return ast.BindClause(str(children[0])[1:-1], span=self._span(meta))

    def input_clause(self, meta, children):
        return ast.RoleClause("input", span=self._span(meta))

    def output_clause(self, meta, children):
        return ast.RoleClause("output", span=self._span(meta))

    def keep_last(self, meta, children):
        return ast.KeepLast(children[0], span=self._span(meta))

    def keep_ring(self, meta, children):
        return ast.KeepRing(children[0], span=self._span(meta))

    def keep_first_last(self, meta, children):
        first, last = children
        return ast.KeepFirstLast(first, last, span=self._span(meta))

    def keep_all(self, meta, children):
        return ast.KeepAll(children[0] if children else None, span=self._span(meta))

    def keep_scratch(self, meta, children):
        return ast.KeepScratch(span=self._span(meta))

    def start_zeros(self, meta, children):
        return ast.StartZeros(span=self._span(meta))

    def start_empty(self, meta, children):
        return ast.StartEmpty(span=self._span(meta))

    def start_given(self, meta, children):
        return ast.StartGiven(children[0] if children else None, span=self._span(meta))

    def stage_stmt(self, meta, children):
        name, clock, *items = children
        return ast.Stage(str(name), str(clock), tuple(items), span=self._span(meta),
                         clock_span=self._token_span(clock))

    def module_item(self, meta, children):
        return ast.ModuleItem(str(children[0])[1:-1], span=self._span(meta))

    def hook_item(self, meta, children):
        return ast.HookItem(str(children[0]), span=self._span(meta))

    def read_item(self, meta, children):
        prev = False
        if children and isinstance(children[0], Token) and children[0].type == "PREV":
            prev = True
            children = children[1:]
        region, span_clause, lookahead, alias = (list(children) + [None] * 4)[:4]
        # Optional parts arrive in grammar order but only when present: sort them by type.
        parts = [c for c in (span_clause, lookahead, alias) if c is not None]
        span_clause = next((p for p in parts if isinstance(p, (ast.SpanLast, ast.SpanNew))), None)
        lookahead = next((p[1] for p in parts if isinstance(p, tuple) and p[0] == "lookahead"), None)
        alias = next((p[1] for p in parts if isinstance(p, tuple) and p[0] == "alias"), None)
        return ast.ReadItem(region, span_clause, lookahead, alias, prev, span=self._span(meta))

    def update_item(self, meta, children):
        region, *advance = children
        return ast.UpdateItem(region, advance[0][1] if advance else None, span=self._span(meta))

    def write_item(self, meta, children):
        region, *rest = children
        advance = next((p[1] for p in rest if p[0] == "advance"), None)
        latency = next((p[1] for p in rest if p[0] == "latency"), None)
        return ast.WriteItem(region, advance, latency, span=self._span(meta))

    def rng_item(self, meta, children):
        return ast.RngItem(span=self._span(meta))

    def region_ref(self, meta, children):
        name, *index = children
        return ast.RegionRef(str(name), index[0] if index else None, span=self._span(meta))

    def span_last(self, meta, children):
        return ast.SpanLast(children[0], span=self._span(meta))

    def span_new(self, meta, children):
        return ast.SpanNew(children[0] if children else None, span=self._span(meta))

    def lookahead(self, meta, children):
        return ("lookahead", children[0])

    def alias(self, meta, children):
        return ("alias", str(children[0]))

    def advance(self, meta, children):
        return ("advance", children[0])

    def latency(self, meta, children):
        return ("latency", children[0])

    # expressions
    def number(self, meta, children):
        literal, *unit = children
        return ast.Number(Fraction(str(literal)), str(unit[0]) if unit else None, span=self._span(meta))

    def name(self, meta, children):
        return ast.Name(str(children[0]), span=self._span(meta))

    def _binop(op):  # noqa: N805 - a factory used inside the class body
        def method(self, meta, children):
            left, right = children
            return ast.BinOp(op, left, right, span=self._span(meta))
        return method

    add, sub, mul, div = _binop("+"), _binop("-"), _binop("*"), _binop("/")

    def neg(self, meta, children):
        return ast.Neg(children[0], span=self._span(meta))

    def index(self, meta, children):
        target, index = children
        return ast.Index(target, index, span=self._span(meta))

    def call(self, meta, children):
        func, *args = children
        return ast.Call(str(func), tuple(a for a in args if a is not None), span=self._span(meta))

    def list(self, meta, children):
        return ast.ListExpr(tuple(c for c in children if c is not None), span=self._span(meta))
