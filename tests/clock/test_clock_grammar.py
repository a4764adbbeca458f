"""The grammar itself: LALR without conflicts, reserved words in step with the keywords, the package
data found from any folder, and the syntax of every construct accepted where documented."""

from __future__ import annotations

import io
import logging
import re

import lark
import pytest

from duplexcadence.dsl import syntax as ast
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.dsl.parse import STATEMENT_KEYWORDS, grammar_text, parse_module, parse_value, reserved_words
from duplexcadence.dsl.source import SourceFile


def test_the_grammar_has_no_lalr_conflicts() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    lark.logger.addHandler(handler)
    level = lark.logger.level
    lark.logger.setLevel(logging.DEBUG)
    try:
        lark.Lark(grammar_text(), start=["program", "value"], parser="lalr", lexer="contextual", debug=True)
    finally:
        lark.logger.removeHandler(handler)
        lark.logger.setLevel(level)
    assert "conflict" not in stream.getvalue().lower(), stream.getvalue()


def test_every_keyword_is_reserved_and_nothing_else() -> None:
    keywords = set(re.findall(r'"([A-Za-z_]+)"', re.sub(r"//[^\n]*", "", grammar_text())))
    units = {"Hz", "kHz", "s", "ms"}  # units only follow a number, where no name can stand
    assert reserved_words() == (keywords - units) | {"prev"}
    assert set(STATEMENT_KEYWORDS) <= reserved_words()


def test_the_grammar_is_read_from_the_package() -> None:
    assert grammar_text().startswith("// The `.clock` language")


def parse(text: str) -> ast.Module:
    return parse_module(SourceFile("g.clock", text))


@pytest.mark.parametrize(
    "name",
    [
        "user",
        "clocks",
        "timer",
        "s",
        "ms",
        "Hz",
        "kHz",
        "_",
        "stage2",
        "input_pcm",
        "prevalue",
        "lastly",
        "newer",
        "as_",
    ],
)
def test_names_that_only_contain_a_keyword_are_names(name: str) -> None:
    assert parse(f"param {name} = 1\n").statements[0].name == name


@pytest.mark.parametrize("word", sorted(reserved_words()))
def test_a_reserved_word_cannot_be_a_name(word: str) -> None:
    with pytest.raises(ClockError) as caught:
        parse(f"param {word} = 1\n")
    [diagnostic] = caught.value.diagnostics
    assert (diagnostic.code.name, diagnostic.span.line, diagnostic.span.column) == ("syntax", 1, 7)


def test_every_construct_parses_to_its_node() -> None:
    module = parse("""
        use std.audio (sample, mel,)
        cadence 1 s
        param P = 150
        clock frame = sample / 1920
        region kv[layer < 8] : bf16[2, P, time, 64,] on frame retain ring 250 start zeros stock 250
            bind "layers.{layer}.kv" output
        region a : f32[time] on frame retain first 3 + last 4 start given 2 input
        region b : f32[time] on frame retain all horizon 10 s start empty
        region c : f32[time] on frame retain scratch
        region d : i64[1] start given
        stage s on frame {
            module "decoder"; hook h
            read prev a last 3 lookahead 1 as x;
            read b new + 2
            read c new
            update kv[3] +2
            write b +1 latency 1
            write c +2 latency 1 dropped
            write d loses 3 intended
            rng
        }
    """)
    kinds = [type(s).__name__ for s in module.statements]
    assert kinds == ["Use", "Cadence", "Param", "Clock", "Region", "Region", "Region", "Region", "Region", "Stage"]
    use = module.statements[0]
    assert (use.module, use.names) == (("std", "audio"), ("sample", "mel"))
    kv = module.statements[4]
    assert kv.family.index == "layer" and [type(c).__name__ for c in kv.clauses] == [
        "OnClause",
        "RetainClause",
        "StartClause",
        "StockClause",
        "BindClause",
        "RoleClause",
    ]
    stage = module.statements[-1]
    read = stage.items[2]
    assert (read.prev, read.alias, type(read.span_clause).__name__) == (True, "x", "SpanLast")
    assert read.lookahead == ast.Number(1)
    assert stage.items[3].span_clause == ast.SpanNew(ast.Number(2))
    assert stage.items[5].region == ast.RegionRef("kv", ast.Number(3))
    assert (stage.items[6].advance, stage.items[6].latency) == (ast.Number(1), ast.Number(1))
    assert not stage.items[6].latency_dropped
    assert (stage.items[7].latency, stage.items[7].latency_dropped) == (ast.Number(1), True)
    assert (stage.items[7].loss, stage.items[8].loss, stage.items[8].loss_intended) == (None, ast.Number(3), True)


def test_spans_are_kept_out_of_equality() -> None:
    assert parse("param a = 1\n") == parse("\n\n   param   a=1   # moved\n")


def test_param_values_parse_alone() -> None:
    assert parse_value("[8, 6, 5, 4]") == ast.ListExpr(tuple(ast.Number(n) for n in (8, 6, 5, 4)))
    assert parse_value("2.5 s") == ast.Number(__import__("fractions").Fraction(5, 2), "s")
    with pytest.raises(ClockError):
        parse_value("1 +")
