"""Fuzzing the front end with hypothesis: whatever the text, `check_file` returns diagnostics (each
located in a file it read, or one of the file-level kinds) and never raises; `dsl check` exits 0 or 1.

Two generators:
- from the grammar (`hypothesis.extra.lark.from_lark`), every token padded with spaces (generated
  tokens are otherwise glued together: HypothesisWorks/hypothesis#1804) and names drawn from a small
  pool so that references sometimes resolve: every sentence of the grammar must parse;
- mutations of the real stdlib and good files: tokens and lines deleted, duplicated and swapped,
  numbers made huge, zero or negative, unicode and binary garbage, deep parentheses, import cycles.

Reduced for CI time: 150-200 examples per test, no deadline (a 2-core runner is slow and uneven).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from duplexcadence.dsl import messages
from duplexcadence.dsl.frontend import CheckResult, check_file
from duplexcadence.dsl.loader import stdlib_root
from duplexcadence.dsl.parse import grammar_text, reserved_words
from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).parent
SEEDS = sorted((HERE / "good").glob("*.clock")) + sorted(stdlib_root().rglob("*.clock"))
FILE_LEVEL = {messages.UNREADABLE, messages.PARAM_OVERRIDE, messages.EMPTY_FILE}
FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def assert_well_formed(result: CheckResult) -> None:
    """Every diagnostic is located in a file that was read (on a line it has), or is file-level."""
    for diagnostic in result.diagnostics:
        if diagnostic.span is None:
            assert diagnostic.code in FILE_LEVEL, diagnostic
            continue
        source = result.sources.get(diagnostic.span.path)
        assert source is not None, f"{diagnostic} points into a file that was not read"
        assert 1 <= diagnostic.span.line <= source.line_count + 1, diagnostic
        assert diagnostic.span.column >= 1, diagnostic
        for note in diagnostic.notes:
            assert note.span is None or note.span.path in result.sources, note
    if result.program is not None:
        assert not result.errors


# --- from the grammar ----------------------------------------------------------------------------------

NAMES = ["a", "b", "c", "B", "frame", "sample", "kv", "x", "layer", "mel", "_t0"]
_PARSER = lark.Lark(grammar_text(), start=["program", "value"], parser="lalr", lexer="contextual")


def _spaced(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return strategy.map(lambda text: f" {text} ")


def _explicit() -> dict[str, st.SearchStrategy[str]]:
    explicit: dict[str, st.SearchStrategy[str]] = {}
    for terminal in _PARSER.terminals:
        if isinstance(terminal.pattern, lark.lexer.PatternStr):
            explicit[terminal.name] = st.just(f" {terminal.pattern.value} ")
    free_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
        lambda name: name not in reserved_words()
    )
    explicit.update(
        {
            "NAME": _spaced(st.sampled_from(NAMES) | free_names),
            "NUMBER": _spaced(
                st.sampled_from(["0", "1", "2", "12.5", "1920", "0.001", "24000", "99999999999999999"])
                | st.integers(0, 10**6).map(str)
            ),
            "UNIT": _spaced(st.sampled_from(["Hz", "kHz", "s", "ms"])),
            "STRING": _spaced(
                st.sampled_from(['""', '"decoder"', '"layers.{layer}.kv"', '"a..b"', '"{x}"', '"m.0.state"'])
            ),
            "PREV": st.just(" prev "),
            "COMMENT": st.just(" # note\n"),
            "WS": st.sampled_from([" ", "\n", "\t", "\r\n"]),
        }
    )
    return explicit


def _small_sentences(strategy):
    """`from_lark` has no depth bound: recursive rules (expressions, lists, statement lists) make most
    draws overrun and generation take ~0.15 s a sentence. Favour each rule's shortest expansions two
    to one (rules whose expansions are all as short, like `statement`, stay uniform), which keeps
    sentences small and generation several times faster. Falls back to the plain strategy if
    Hypothesis's LarkStrategy changes shape."""
    lark_strategy = getattr(strategy, "wrapped_strategy", None)
    table = getattr(lark_strategy, "nonterminal_strategies", None)
    if not isinstance(table, dict):
        return strategy
    for name, expansions in list(table.items()):
        options = list(getattr(expansions, "elements", ()))
        if not options:
            return strategy
        shortest = [e for e in options if len(e) == min(map(len, options))]
        table[name] = st.one_of(st.sampled_from(options), st.sampled_from(shortest), st.sampled_from(shortest))
    return lark_strategy


_USE = re.compile(r"\buse\s+[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*")

PROGRAMS = _small_sentences(from_lark(_PARSER, start="program", explicit=_explicit())).map(
    lambda text: _USE.sub("use std.audio", text)
)  # an unknown module stops a check before resolution


@FUZZ
@given(PROGRAMS)
@pytest.mark.slow
def test_every_sentence_of_the_grammar_parses_and_checks_without_raising(text: str) -> None:
    result = check_file("fuzz.clock", text=text)
    assert_well_formed(result)
    syntax = [d for d in result.diagnostics if d.code is messages.SYNTAX]
    assert all("nests more than" in d.message for d in syntax), syntax  # a sentence is never a syntax error


# --- mutations of real files ---------------------------------------------------------------------------

TOKEN = re.compile(r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|[0-9]+(?:\.[0-9]+)?|\S')
INSERTS = [
    "999999999999999999999999",
    "0",
    "-3",
    "0 Hz",
    "-12.5 Hz",
    "1 / 0",
    "((((((((((1))))))))))",
    "(" * 300 + "1" + ")" * 300,
    "- " * 300 + "1",
    "1 + " * 150 + "1",
    "\u00e9t\u00e9",
    "\u2603",
    "\x00",
    "\x1b[2J",
    "\ufeff",
    "{",
    "}",
    "[",
    "]",
    "time",
    "stage",
    "region r : f32[time]",
    "use std.audio",
    "use models.mimi_decoder",
    "cadence 0 s",
    "\n",
    ";",
    "#",
    '"',
    "prev",
    "kv[99]",
]


@st.composite
def mutated(draw) -> tuple[Path, str]:
    seed = draw(st.sampled_from(SEEDS))
    text = seed.read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(
                [
                    "delete",
                    "duplicate",
                    "swap",
                    "insert",
                    "number",
                    "line-delete",
                    "line-duplicate",
                    "line-swap",
                    "truncate",
                ]
            )
        )
        if kind.startswith("line"):
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if kind == "line-delete":
                del lines[i]
            elif kind == "line-duplicate":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
            continue
        if kind == "truncate":
            text = text[: draw(st.integers(0, len(text)))]
            continue
        tokens = [(m.start(), m.end()) for m in TOKEN.finditer(text)]
        if not tokens:
            text += draw(st.sampled_from(INSERTS))
            continue
        start, end = tokens[draw(st.integers(0, len(tokens) - 1))]
        if kind == "delete":
            text = text[:start] + text[end:]
        elif kind == "duplicate":
            text = text[:end] + " " + text[start:end] + text[end:]
        elif kind == "swap":
            other_start, other_end = tokens[draw(st.integers(0, len(tokens) - 1))]
            if other_start > end:
                text = (
                    text[:start]
                    + text[other_start:other_end]
                    + text[end:other_start]
                    + text[start:end]
                    + text[other_end:]
                )
        elif kind == "insert":
            text = text[:start] + draw(st.sampled_from(INSERTS) | st.text(max_size=8)) + " " + text[start:]
        else:
            numbers = [m for m in re.finditer(r"[0-9]+(?:\.[0-9]+)?", text)]
            if numbers:
                m = numbers[draw(st.integers(0, len(numbers) - 1))]
                replacement = draw(st.sampled_from(["0", "-1", "0.0", "1" + "0" * 40, "1.5", "7", "-0"]))
                text = text[: m.start()] + replacement + text[m.end() :]
    return seed, text


@FUZZ
@given(mutated())
def test_mutated_real_files_give_located_diagnostics_and_never_raise(case: tuple[Path, str]) -> None:
    seed, text = case
    assert_well_formed(check_file(str(seed), text=text))  # the seed's path, so its imports resolve


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(case=mutated(), garbage=st.binary(max_size=64), where=st.floats(0, 1))
def test_dsl_check_exits_0_or_1_on_mutated_bytes(tmp_path: Path, capsys, case, garbage: bytes, where: float) -> None:
    _, text = case
    data = text.encode("utf-8")
    cut = int(len(data) * where)
    path = tmp_path / "mutant.clock"
    path.write_bytes(data[:cut] + garbage + data[cut:])
    for lib in ("good/lib",):  # keep `use lib.x` of the good files resolvable beside the mutant
        target = tmp_path / "lib"
        if not target.exists():
            shutil.copytree(HERE / lib, target)  # a copy: `use` follows no link out of the folder
    code = cli.main(["check", "--output-format", "concise", str(path)])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert err == "" and "Traceback" not in out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edges=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=10))
def test_import_graphs_with_cycles_are_reported_not_followed(tmp_path_factory, edges) -> None:
    folder = tmp_path_factory.mktemp("imports")
    for node in range(5):
        uses = sorted({f"use m{b}\n" for a, b in edges if a == node})
        (folder / f"m{node}.clock").write_text("".join(uses) + f"param p{node} = {node}\n")
    result = check_file(folder / "m0.clock")
    assert_well_formed(result)
    reachable, frontier = {0}, [0]
    while frontier:
        node = frontier.pop()
        for a, b in edges:
            if a == node and b not in reachable:
                reachable.add(b)
                frontier.append(b)
    has_cycle = _has_cycle({(a, b) for a, b in edges if a in reachable})
    assert has_cycle == any(d.code is messages.IMPORT_CYCLE for d in result.diagnostics)


def _has_cycle(edges: set[tuple[int, int]]) -> bool:
    import networkx as nx

    graph = nx.DiGraph(list(edges))
    return not nx.is_directed_acyclic_graph(graph)


PATHOLOGICAL = {
    "deep parentheses": "param x = " + "(" * 20_000 + "1" + ")" * 20_000,
    "deep negation": "param x = " + "-" * 5_000 + "1",
    "long sum": "param x = " + " + ".join(["1"] * 5_000),
    "deep lists": "param x = [" * 2_000 + "]" * 2_000,
    "unclosed stages": "stage s on c {" * 1_000,
    "blank lines": "\n" * 100_000 + "param",
    "long comment": "# " + "\u2603" * 50_000,
    "over the size limit": "param x = 1\n" * 30_000,
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_texts_are_refused_cleanly(name: str) -> None:
    assert_well_formed(check_file("p.clock", text=PATHOLOGICAL[name]))
