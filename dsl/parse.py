"""Parse `.clock` text into the AST (`duplexcadence.dsl.syntax`).

The grammar (`grammar/clock.lark`, shipped as package data) is compiled once with Lark's LALR parser
and contextual lexer. Syntax errors become `Diagnostic`s that say what was found, what was expected
(in words: "a name", "'module'"), which declaration was open, and a close keyword when a name looks
like a misspelt one. After an error the parser resumes at the next line that starts a statement, so
one run reports the syntax errors of every statement. Lark types never leave this module.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from fractions import Fraction
from importlib import resources

import attrs
import lark
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.tree import Meta

from duplexcadence.dsl import messages, syntax
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic, Note
from duplexcadence.dsl.source import SourceFile, Span

MAX_SOURCE_BYTES = 256_000
"""Files larger than this are refused before parsing: a `.clock` file is a few kilobytes, and this
bounds a check to a few seconds whatever the input."""

MAX_NESTING = 100
"""The deepest expression accepted; deeper ones are refused with a located syntax error, so no
later pass (evaluation, printing, equality) can run out of Python stack."""

MAX_NUMBER_LENGTH = 40
"""The longest number literal, in characters: every value is at most 10^15 with a denominator of at
most 10^15, so a longer literal is refused where it is written (Python would not even convert one
of 4 300 digits to text)."""

MAX_SYNTAX_ERRORS = 20
"""Syntax errors reported per file before giving up."""

_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": 'a "string"',
    "UNIT": "a unit (Hz, kHz, s, ms)",
    "PREV": "'prev'",
    "PRIVATE": "'private'",
    "$END": "the end of the file",
}
STATEMENT_KEYWORDS = ("use", "cadence", "param", "clock", "region", "stage", "counter", "object")
UNITS = ("Hz", "kHz", "s", "ms")
_STATEMENT_START = re.compile(r"(?:use|cadence|param|clock|region|stage|counter|object)(?![A-Za-z0-9_])")
_RESERVED_PATTERN = re.compile(r"\(\?!\(\?:([^)]*)\)")


def grammar_text() -> str:
    """The grammar source, read from the installed package (works from any folder)."""
    return resources.files("duplexcadence").joinpath("grammar", "clock.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> Lark:
    return Lark(
        grammar_text(),
        start=["program", "value"],
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
    )


@functools.cache
def reserved_words() -> frozenset[str]:
    """The words NAME never matches: every keyword, the units and `prev` (read from the grammar)."""
    for terminal in _parser().terminals:
        if terminal.name == "NAME":
            found = _RESERVED_PATTERN.search(terminal.pattern.value)
            assert found is not None, "the NAME terminal lost its reserved-word lookahead"
            return frozenset(found.group(1).split("|"))
    raise AssertionError("the grammar has no NAME terminal")


@functools.cache
def _keyword_of_terminal() -> dict[str, str]:
    """Terminal name -> the keyword or punctuation it stands for (`MODULE` -> `module`)."""
    found = {}
    for terminal in _parser().terminals:
        if isinstance(terminal.pattern, lark.lexer.PatternStr):
            found[terminal.name] = terminal.pattern.value
    found["PREV"] = "prev"
    found["PRIVATE"] = "private"
    return found


def parse_module(source: SourceFile) -> syntax.Module:
    """Parse a whole file. Raises `ClockError` with every syntax error found (one per statement)."""
    size = len(source.text.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise ClockError([messages.file_too_large(source.path, size, MAX_SOURCE_BYTES)])
    try:
        tree = _parser().parse(source.text, start="program")
    except UnexpectedInput as error:
        raise ClockError(_all_syntax_errors(source, error)) from None
    _check_nesting(source, tree)
    statements = _transform(source, tree)
    return syntax.Module(source.path, tuple(statements), comments=tuple(scan_comments(source)))


def parse_value(text: str, path: str = "<--param>") -> syntax.Expr:
    """Parse one expression, as given to `--param NAME=VALUE`."""
    source = SourceFile(path, text)
    try:
        tree = _parser().parse(source.text, start="value")
    except UnexpectedInput as error:
        raise ClockError([syntax_diagnostic(source, error)]) from None
    _check_nesting(source, tree)
    return _transform(source, tree)


def scan_comments(source: SourceFile) -> list[syntax.Comment]:
    """Every `# ...` comment of a file that parsed, with its position.

    Strings cannot hold a newline or a quote, so a `#` outside quotes always starts a comment.
    """
    comments = []
    for number, line in enumerate(source.text.split("\n"), start=1):
        line = line.rstrip("\r")
        column = _comment_column(line)
        if column is not None:
            text = line[column - 1 :].rstrip()
            comments.append(syntax.Comment(text, span=Span(source.path, number, column, number, column + len(text))))
    return comments


def _comment_column(line: str) -> int | None:
    """The 1-based column where the line's `# ...` comment starts, or None."""
    in_string = False
    for column, char in enumerate(line, start=1):
        if char == '"':
            in_string = not in_string
        elif char == "#" and not in_string:
            return column
    return None


def _transform(source: SourceFile, tree: lark.Tree):
    try:
        return _ToAst(source.path).transform(tree)
    except VisitError as error:
        if isinstance(error.orig_exc, ClockError):
            raise ClockError(error.orig_exc.diagnostics) from None
        raise error.orig_exc from None


def _check_nesting(source: SourceFile, tree: lark.Tree) -> None:
    """Refuse expressions nested deeper than MAX_NESTING, without recursion."""
    stack: list[tuple[lark.Tree, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            meta = node.meta
            span = (
                Span(source.path, meta.line, meta.column, meta.end_line, meta.end_column)
                if not getattr(meta, "empty", True)
                else Span.point(source.path, 1, 1)
            )
            raise ClockError([messages.too_deep(MAX_NESTING, span)])
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, lark.Tree))


# --- syntax errors ------------------------------------------------------------------------------


def _all_syntax_errors(source: SourceFile, first: UnexpectedInput) -> list[Diagnostic]:
    """The first error, then one per later statement: the parser restarts at the next line that
    begins (at column 1) with a statement keyword, with the text before it blanked out."""
    found = [syntax_diagnostic(source, first)]
    error: UnexpectedInput | None = first
    lines = source.text.split("\n")
    previous_restart = 1
    while error is not None and len(found) < MAX_SYNTAX_ERRORS:
        error_line = error.line if isinstance(error.line, int) and error.line > 0 else len(lines)
        restart = next(
            (
                number
                for number in range(max(error_line, previous_restart + 1), len(lines) + 1)
                if _STATEMENT_START.match(lines[number - 1])
            ),
            None,
        )
        if restart is None:
            break
        previous_restart = restart
        rest = "\n" * (restart - 1) + "\n".join(lines[restart - 1 :])
        try:
            _parser().parse(rest, start="program")
            error = None
        except UnexpectedInput as later:
            error = later
            diagnostic = syntax_diagnostic(SourceFile(source.path, rest), later)
            if diagnostic not in found:  # a restart at the failed statement itself meets the same error again
                found.append(diagnostic)
    return found


def _describe_expected(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    literal = _keyword_of_terminal().get(name)
    return f"'{literal}'" if literal is not None else name.lower()


def _describe_token(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    if token.type == "NAME":
        return f"name '{token.value}'"
    if token.type == "NUMBER":
        return f"number {token.value}"
    if token.type == "STRING":
        return f"string {token.value}"
    if token.type == "UNIT":
        return f"unit '{token.value}'"
    if str(token.value) in reserved_words():
        return f"keyword '{token.value}'"
    return f"'{token.value}'"


def _context(source: SourceFile, position: int) -> tuple[tuple[str, Span] | None, str | None]:
    """The innermost declaration open at `position` ("stage 'decode'") with where its keyword is,
    and a description of the token just before `position` (None at the start of the file)."""
    words: list[tuple[str, str | None, Span]] = []
    depth = 0
    last: Token | None = None
    try:
        for token in _parser().lex(source.text[:position]):
            last = token
            value = str(token)
            if value in STATEMENT_KEYWORDS:
                start = _span_of_token(source.path, token)
                words.append((value, None, Span.point(source.path, start.line, start.column, len(value))))
            elif token.type == "NAME" and words and words[-1][1] is None and words[-1][0] not in ("use", "cadence"):
                words[-1] = (words[-1][0], value, words[-1][2])
            elif value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
    except UnexpectedInput:
        last = None
    previous = _describe_token(last) if last is not None else None
    if not words:
        return None, previous
    keyword, name, span = words[-1]
    if keyword == "stage" and depth <= 0 and source.text[:position].rstrip().endswith("}"):
        return None, previous
    return ((f"{keyword} '{name}'" if name else keyword), span), previous


def _expected_terminals(error: UnexpectedInput) -> set[str]:
    accepts = None
    if isinstance(error, UnexpectedToken) and error.interactive_parser is not None:
        try:
            accepts = error.accepts
        except Exception:  # the exact set is a refinement; Lark's LALR set is the fallback
            accepts = None
    return set(accepts or getattr(error, "expected", None) or ())


def _close_keywords(word: str, expected: set[str]) -> list[str]:
    """Keywords or units among the expected terminals that `word` looks like a misspelling of."""
    keyword_of = _keyword_of_terminal()
    candidates = {keyword_of[name] for name in expected if name in keyword_of and keyword_of[name].isalpha()}
    if "UNIT" in expected:
        candidates |= set(UNITS)
    lowered = {candidate.lower(): candidate for candidate in candidates}
    exact = lowered.get(word.lower())
    if exact is not None and exact != word:
        return [exact]
    return [lowered[c] for c in messages.suggest(word.lower(), lowered)]


_GROUPS = (
    (frozenset(STATEMENT_KEYWORDS), "the next statement (use, cadence, param, clock, region, stage, counter, object)"),
    (
        frozenset({"module", "hook", "read", "update", "write", "rng", "rows", "with"}),
        "a stage item (module, hook, read, update, write, rng, rows, with)",
    ),
    (
        frozenset({"on", "retain", "start", "stock", "bind", "input", "output"}),
        "a region clause (on, retain, start, stock, bind, input, output)",
    ),
    (frozenset({"+", "-", "*", "/"}), "an operator (+, -, *, /)"),
)


def _expected_words(expected: set[str]) -> list[str]:
    """The expected terminals in words, with families of keywords folded into one phrase."""
    literals = {_keyword_of_terminal()[name] for name in expected if name in _keyword_of_terminal()}
    others = {name for name in expected if name not in _keyword_of_terminal()}
    phrases = []
    if {"(", "-", "["} <= literals and {"NAME", "NUMBER"} <= others:
        literals -= {"(", "-", "["}
        others -= {"NAME", "NUMBER"}
        phrases.append("an expression")
    for members, phrase in _GROUPS:
        if members <= literals:
            literals -= members
            phrases.append(phrase)
    words = sorted(f"'{literal}'" for literal in literals)
    words += sorted(_describe_expected(name) for name in others if name != "$END")
    return words + phrases + (["the end of the file"] if "$END" in others else [])


def syntax_diagnostic(source: SourceFile, error: UnexpectedInput) -> Diagnostic:
    """One located syntax diagnostic for a Lark error."""
    if isinstance(error, UnexpectedCharacters):
        position: int = error.pos_in_stream  # type: ignore[assignment]  # Lark declares None; the lexer sets its offset
        char = source.text[position] if position < len(source.text) else "?"
        return messages.syntax_bad_character(char, Span.point(source.path, error.line, error.column))
    expected = _expected_terminals(error)
    described = _expected_words(expected)
    if not isinstance(error, UnexpectedToken):
        return messages.syntax_unexpected_end(described, source.end_span(), None)
    token = error.token
    position = token.start_pos if token.start_pos is not None and token.type != "$END" else len(source.text)
    context, previous = _context(source, position)
    description, opened = context if context is not None else (None, None)
    if token.type == "$END":
        end = source.end_span()
        notes = (Note(f"{description} begins here", opened),) if opened is not None and opened.line != end.line else ()
        return messages.syntax_unexpected_end(described, end, description, notes)
    span = Span(
        source.path,
        token.line,
        token.column,
        token.end_line or token.line,
        token.end_column or token.column + len(str(token)),
    )
    notes = ()
    if opened is not None and opened.line != span.line:
        notes = (Note(f"{description} begins here", opened),)
    if str(token) in STATEMENT_KEYWORDS and token.column == 1 and description is not None:
        # A statement cut short: point just after its last token, where something is missing.
        end = _end_of_previous_token(source, position)
        return messages.syntax_unfinished(
            description, described, previous, end, (Note("the next statement begins here", span),)
        )
    suggestions: list[str] = []
    reserved = None
    if token.type == "NAME":
        suggestions = _close_keywords(str(token), expected)
    elif str(token.value) in reserved_words() and "NAME" in expected:
        reserved = str(token.value)
    where = description if description is not None and "'" in description else None
    return messages.syntax_unexpected(
        _describe_token(token), described, span, where, notes, suggestions, reserved, previous
    )


def _end_of_previous_token(source: SourceFile, position: int) -> Span:
    """A one-column span just after the last non-blank, non-comment text before `position`."""
    before = source.text[:position]
    lines = before.split("\n")
    for number in range(len(lines), 0, -1):
        code = lines[number - 1]
        column = _comment_column(code)
        if column is not None:
            code = code[: column - 1]
        code = code.rstrip()
        if code:
            return Span.point(source.path, number, len(code) + 1)
    return Span.point(source.path, 1, 1)


# --- tree -> AST --------------------------------------------------------------------------------


def _span_of_token(path: str, token: Token) -> Span:
    """Where a lexed token is written (Lark types positions as optional for tokens made by hand; its
    lexer sets them all)."""
    assert token.line is not None and token.column is not None, f"token {token!r} has no position"
    assert token.end_line is not None and token.end_column is not None, f"token {token!r} has no end"
    return Span(path, token.line, token.column, token.end_line, token.end_column)


def _binop_rule(op: str) -> Callable[[_ToAst, Meta, list[syntax.Expr]], syntax.BinOp]:
    """The transformer method of the rule of a binary operator."""

    def method(self: _ToAst, meta: Meta, children: list[syntax.Expr]) -> syntax.BinOp:
        left, right = children
        return syntax.BinOp(op, left, right, span=self._span(meta))

    return method


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
        return _span_of_token(self.path, token)

    def __default__(self, data, children, meta):
        raise AssertionError(f"grammar rule '{data}' has no AST constructor")

    # statements
    def program(self, meta, statements):
        return list(statements)

    def value(self, meta, children):
        return children[0]

    def use_stmt(self, meta, children):
        (module, module_span), *names = children
        listed = names[0] if names and names[0] is not None else None
        return syntax.Use(
            tuple(module),
            tuple(str(n) for n in listed) if listed is not None else None,
            span=self._span(meta),
            module_span=module_span,
            name_spans=tuple(self._token_span(n) for n in listed or ()),
        )

    def dotted_name(self, meta, parts):
        return [str(p) for p in parts], self._span(meta)

    def import_names(self, meta, names):
        return list(names)

    def cadence_stmt(self, meta, children):
        return syntax.Cadence(children[0], span=self._span(meta))

    def param_stmt(self, meta, children):
        name, default = children
        return syntax.Param(str(name), default, span=self._span(meta), name_span=self._token_span(name))

    def clock_stmt(self, meta, children):
        name, rate = children
        return syntax.Clock(str(name), rate, span=self._span(meta), name_span=self._token_span(name))

    def bounded_clock_stmt(self, meta, children):
        name, (_, bound), per = children
        per_name = syntax.Name(str(per), span=self._token_span(per))
        return syntax.Clock(str(name), per_name, span=self._span(meta), name_span=self._token_span(name), bound=bound)

    def region_stmt(self, meta, children):
        name, family, dtype, shape, *clauses = children
        return syntax.Region(
            str(name),
            family,
            str(dtype),
            tuple(shape),
            tuple(clauses),
            span=self._span(meta),
            name_span=self._token_span(name),
            dtype_span=self._token_span(dtype),
        )

    def family(self, meta, children):
        pairs = [
            syntax.Family(str(index), count, span=self._span(meta), index_span=self._token_span(index))
            for index, count in zip(children[::2], children[1::2], strict=True)
        ]
        return attrs.evolve(pairs[0], more=tuple(pairs[1:]))

    def clock_family_stmt(self, meta, children):
        name, family, rate = children
        return syntax.Clock(str(name), rate, span=self._span(meta), name_span=self._token_span(name), family=family)

    def on_member_clause(self, meta, children):
        name, member = children
        return syntax.OnClause(str(name), span=self._span(meta), clock_span=self._token_span(name), member=member)

    def shape(self, meta, dims):
        return list(dims)

    def time_axis(self, meta, children):
        return syntax.TimeAxis(span=self._span(meta))

    def on_clause(self, meta, children):
        return syntax.OnClause(str(children[0]), span=self._span(meta), clock_span=self._token_span(children[0]))

    def retain_clause(self, meta, children):
        return syntax.RetainClause(children[0], span=self._span(meta))

    def start_clause(self, meta, children):
        return syntax.StartClause(children[0], span=self._span(meta))

    def stock_clause(self, meta, children):
        return syntax.StockClause(children[0], span=self._span(meta))

    def bind_clause(self, meta, children):
        path = children[-1]
        private = any(isinstance(c, Token) and c.type == "PRIVATE" for c in children[:-1])
        owner = next((str(c) for c in children[:-1] if isinstance(c, Token) and c.type == "NAME"), None)
        return syntax.BindClause(
            str(path)[1:-1], private, owner, span=self._span(meta), path_span=self._token_span(path)
        )

    def input_clause(self, meta, children):
        return syntax.RoleClause("input", span=self._span(meta))

    def output_clause(self, meta, children):
        return syntax.RoleClause("output", span=self._span(meta))

    def keep_last(self, meta, children):
        return syntax.KeepLast(children[0], span=self._span(meta))

    def keep_ring(self, meta, children):
        return syntax.KeepRing(children[0], span=self._span(meta))

    def keep_first_last(self, meta, children):
        first, last = children
        return syntax.KeepFirstLast(first, last, span=self._span(meta))

    def keep_all(self, meta, children):
        return syntax.KeepAll(children[0] if children else None, span=self._span(meta))

    def keep_scratch(self, meta, children):
        return syntax.KeepScratch(span=self._span(meta))

    def slide_retention(self, meta, children):
        first, high, low = children if len(children) == 3 else (None, *children)
        return syntax.KeepSlide(first, high, low, span=self._span(meta))

    def start_zeros(self, meta, children):
        return syntax.StartZeros(span=self._span(meta))

    def start_empty(self, meta, children):
        return syntax.StartEmpty(span=self._span(meta))

    def start_given(self, meta, children):
        return syntax.StartGiven(children[0] if children else None, span=self._span(meta))

    def start_first(self, meta, children):
        return syntax.StartFirst(span=self._span(meta))

    def start_first_firing(self, meta, children):
        return syntax.StartFirstFiring(span=self._span(meta))

    # counters and objects
    def counter_stmt(self, meta, children):
        name, step, *rest = children
        modulo = next((c[1] for c in rest if isinstance(c, tuple) and c[0] == "mod"), None)
        clock = next(c for c in rest if isinstance(c, Token) and c.type == "NAME")
        bind = next((c for c in rest if isinstance(c, syntax.BindClause)), None)
        return syntax.Counter(
            str(name),
            step,
            modulo,
            str(clock),
            bind,
            span=self._span(meta),
            name_span=self._token_span(name),
            clock_span=self._token_span(clock),
        )

    def counter_mod(self, meta, children):
        return ("mod", children[0])

    def counter_bind(self, meta, children):
        return self.bind_clause(meta, children)

    def object_stmt(self, meta, children):
        name, *made = children
        made = [f for f in made if f is not None]
        factory = [f for f in made if isinstance(f, Token)]
        stage = [f[1] for f in made if isinstance(f, tuple)]
        return syntax.Object(
            str(name),
            str(factory[0]) if factory else None,
            span=self._span(meta),
            name_span=self._token_span(name),
            factory_span=self._token_span(factory[0]) if factory else None,
            stage=str(stage[0]) if stage else None,
            stage_span=self._token_span(stage[0]) if stage else None,
        )

    def object_factory(self, meta, children):
        return children[0]

    def object_stage(self, meta, children):
        return ("stage", children[0])

    def stage_stmt(self, meta, children):
        name, clock, *items = children
        return syntax.Stage(
            str(name),
            str(clock),
            tuple(items),
            span=self._span(meta),
            name_span=self._token_span(name),
            clock_span=self._token_span(clock),
        )

    def module_item(self, meta, children):
        *private, path = children
        return syntax.ModuleItem(
            str(path)[1:-1], bool(private), span=self._span(meta), path_span=self._token_span(path)
        )

    def hook_item(self, meta, children):
        return syntax.HookItem(str(children[0]), span=self._span(meta))

    def read_item(self, meta, children):
        prev = bool(children) and isinstance(children[0], Token) and children[0].type == "PREV"
        if prev:
            children = children[1:]
        region, *optional = children
        # Optional parts arrive in grammar order, None where absent (maybe_placeholders).
        span_clause = next((p for p in optional if isinstance(p, (syntax.SpanLast, syntax.SpanNew))), None)
        lookahead = next((p[1] for p in optional if isinstance(p, tuple) and p[0] == "lookahead"), None)
        alias = next((p for p in optional if isinstance(p, tuple) and p[0] == "alias"), None)
        return syntax.ReadItem(
            region,
            span_clause,
            lookahead,
            alias[1] if alias else None,
            prev,
            span=self._span(meta),
            alias_span=alias[2] if alias else None,
        )

    def update_item(self, meta, children):
        region, *rest = children
        rest = [p for p in rest if p is not None]
        advance = next((p for p in rest if p[0] in ("advance", "up_to")), None)
        alias = next((p for p in rest if p[0] == "alias"), None)
        field = next((p for p in rest if p[0] == "field"), None)
        return syntax.UpdateItem(
            region,
            advance[1] if advance else None,
            alias[1] if alias else None,
            field[1] if field else None,
            span=self._span(meta),
            alias_span=alias[2] if alias else None,
            field_span=field[2] if field else None,
            up_to=advance is not None and advance[0] == "up_to",
        )

    def write_item(self, meta, children):
        region, *rest = children
        rest = [p for p in rest if p is not None]
        advance = next((p for p in rest if p[0] in ("advance", "up_to")), None)
        latency = next((p for p in rest if p[0] == "latency"), None)
        loss = next((p for p in rest if p[0] == "loss"), None)
        field = next((p for p in rest if p[0] == "field"), None)
        return syntax.WriteItem(
            region,
            advance[1] if advance else None,
            latency[1] if latency else None,
            latency_dropped=bool(latency and latency[2]),
            loss=loss[1] if loss else None,
            loss_intended=bool(loss and loss[2]),
            field=field[1] if field else None,
            span=self._span(meta),
            field_span=field[2] if field else None,
            up_to=advance is not None and advance[0] == "up_to",
        )

    def with_item(self, meta, children):
        name, value = children
        return syntax.WithItem(str(name), value, span=self._span(meta), name_span=self._token_span(name))

    def field(self, meta, children):
        return ("field", str(children[0]), self._token_span(children[0]))

    def text_value(self, meta, children):
        return str(children[0])[1:-1]

    def true_value(self, meta, children):
        return True

    def false_value(self, meta, children):
        return False

    def rng_item(self, meta, children):
        return syntax.RngItem(span=self._span(meta))

    def rows_item(self, meta, children):
        return syntax.RowsItem(children[0], span=self._span(meta))

    def region_ref(self, meta, children):
        name, *index = children
        index = [i for i in index if i is not None]
        return syntax.RegionRef(
            str(name), index[0] if index else None, span=self._span(meta), name_span=self._token_span(name)
        )

    def span_last(self, meta, children):
        return syntax.SpanLast(children[0], span=self._span(meta))

    def span_new(self, meta, children):
        return syntax.SpanNew(children[0] if children else None, span=self._span(meta))

    def lookahead(self, meta, children):
        return ("lookahead", children[0])

    def alias(self, meta, children):
        return ("alias", str(children[0]), self._token_span(children[0]))

    def advance(self, meta, children):
        [value] = children
        return value if isinstance(value, tuple) else ("advance", value)

    def up_to(self, meta, children):
        return ("up_to", children[0])

    def latency(self, meta, children):
        value, *dropped = children
        return ("latency", value, any(d is not None for d in dropped))

    def loss(self, meta, children):
        value, *intended = children
        return ("loss", value, any(i is not None for i in intended))

    # expressions
    def number(self, meta, children):
        literal, *unit = children
        unit = [u for u in unit if u is not None]
        if len(literal) > MAX_NUMBER_LENGTH:
            raise ClockError([messages.number_too_long(len(literal), MAX_NUMBER_LENGTH, self._token_span(literal))])
        return syntax.Number(Fraction(str(literal)), str(unit[0]) if unit else None, span=self._span(meta))

    def name(self, meta, children):
        return syntax.Name(str(children[0]), span=self._span(meta))

    add, sub, mul, div = _binop_rule("+"), _binop_rule("-"), _binop_rule("*"), _binop_rule("/")

    def neg(self, meta, children):
        return syntax.Neg(children[0], span=self._span(meta))

    def index(self, meta, children):
        target, index = children
        return syntax.Index(target, index, span=self._span(meta))

    def call(self, meta, children):
        func, *args = children
        return syntax.Call(str(func), tuple(a for a in args if a is not None), span=self._span(meta))

    def list(self, meta, children):
        return syntax.ListExpr(tuple(c for c in children if c is not None), span=self._span(meta))
