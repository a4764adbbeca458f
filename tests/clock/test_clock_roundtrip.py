"""Round trips: the canonical printer (`dsl fmt`) never changes a program's meaning.

For every good example, its imported helpers, every stdlib file and the examples' `.clock` files: parse -> print -> parse gives an
equal AST (spans and comments are out of equality), printing is idempotent, every comment survives,
and the stdlib is already in canonical form (`dsl fmt --check` is clean).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from duplexcadence.dsl import printer
from duplexcadence.dsl import syntax as ast
from duplexcadence.dsl.loader import stdlib_root
from duplexcadence.dsl.parse import parse_module
from duplexcadence.dsl.source import SourceFile
from duplexcadence.interpreter.cli.main import main

HERE = Path(__file__).parent
STDLIB = sorted(stdlib_root().rglob("*.clock"))
EXAMPLES = sorted((HERE.parents[1] / "examples").rglob("*.clock"))
PROGRAMS = sorted((HERE / "good").rglob("*.clock")) + STDLIB + EXAMPLES


def parse(path: str, text: str) -> ast.Module:
    return parse_module(SourceFile(path, text))


def without_positions(node):
    """The same tree with every span removed (as a program built in Python would be)."""
    if isinstance(node, tuple):
        return tuple(without_positions(item) for item in node)
    if not attrs.has(type(node)):
        return node
    changes = {}
    for field in attrs.fields(type(node)):
        value = getattr(node, field.name)
        if field.name.endswith("span") or field.name.endswith("spans") or field.name == "comments":
            changes[field.name] = () if isinstance(value, tuple) else None
        else:
            changes[field.name] = without_positions(value)
    return attrs.evolve(node, **changes)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_print_then_parse_gives_the_same_program(path: Path) -> None:
    tree = parse(str(path), path.read_text(encoding="utf-8"))
    text = printer.module(tree)
    again = parse(str(path), text)
    assert again == tree
    assert printer.module(again) == text, "printing is not idempotent"
    assert [c.text for c in again.comments] == [c.text for c in tree.comments], "a comment was lost or moved"


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_tree_without_positions_prints_and_parses_back(path: Path) -> None:
    tree = without_positions(parse(str(path), path.read_text(encoding="utf-8")))
    assert parse(str(path), printer.module(tree)) == tree


def test_the_stdlib_is_in_canonical_form(capsys) -> None:
    assert main(["fmt", "--check", *map(str, STDLIB)]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "text",
    [
        "param x = 1 - (2 - 3)",
        "param x = (1 - 2) - 3",
        "param x = 2 / (3 * 4)",
        "param x = -(-2)",
        "param x = 2 * (1 s)",
        "param x = (12.5 Hz) / 2",
        "param x = [1, [2, 3], []][1][0]",
        "param x = 0.125",
        "param x = 1.10",
        "param x = 00012",
        "param x = max(1, 2, min(3, 4)) * sum([1])",
        "param x = 1 / 3 * 3",
        "param x = -1 s + 2 ms",
    ],
)
def test_expressions_keep_their_structure(text: str) -> None:
    tree = parse("e.clock", text + "\n")
    assert parse("e.clock", printer.module(tree)) == tree


def test_numbers_print_exactly() -> None:
    from fractions import Fraction

    assert printer.number_text(Fraction(25, 2)) == "12.5"
    assert printer.number_text(Fraction(1, 3)) == "1/3"
    assert printer.number_text(Fraction(-3, 8)) == "-0.375"
    assert printer.number_text(Fraction(10**20)) == str(10**20)


def test_comments_stay_where_they_were() -> None:
    source = (
        "# header\n\nparam a = 1  # trailing\n"
        "stage s on c {  # on the brace line\n    # before the item\n    hook h\n    # before the brace\n}\n"
        "# footer\n"
    )
    assert printer.module(parse("c.clock", source)) == (
        "# header\n\nparam a = 1  # trailing\n\n"
        "stage s on c {  # on the brace line\n    # before the item\n    hook h\n    # before the brace\n}\n"
        "# footer\n"
    )
