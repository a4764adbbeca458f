"""The TextMate grammar (`grammar/clock.tmLanguage.json`): every pattern compiles, every reserved word of
the language is highlighted as a keyword, and the lines of a sample file get the expected scopes.

The tokeniser is a small matcher over the grammar's `match` rules in their order (first match wins at each
position, as TextMate does for single-line rules), which is all the grammar uses.
"""

from __future__ import annotations

import json
import re
from importlib import resources

from duplexcadence.dsl.parse import reserved_words

GRAMMAR = json.loads(resources.files("duplexcadence").joinpath("grammar", "clock.tmLanguage.json").read_text())


def rules(grammar: dict) -> list[dict]:
    """The grammar's match rules in the order they are tried."""
    found = []

    def expand(pattern: dict) -> None:
        if "include" in pattern:
            expand(grammar["repository"][pattern["include"].lstrip("#")])
        elif "patterns" in pattern:
            for item in pattern["patterns"]:
                expand(item)
        else:
            found.append(pattern)

    for pattern in grammar["patterns"]:
        expand(pattern)
    return found


RULES = [(re.compile(rule["match"]), rule) for rule in rules(GRAMMAR)]


def tokens(line: str) -> list[tuple[str, str]]:
    """(text, scope) for every scoped piece of `line`."""
    found, position = [], 0
    while position < len(line):
        for pattern, rule in RULES:
            match = pattern.match(line, position)
            if match is None or match.end() == position:
                continue
            if "captures" in rule:
                for group, capture in sorted(rule["captures"].items(), key=lambda item: int(item[0])):
                    if match.group(int(group)) is not None:
                        found.append((match.group(int(group)), capture["name"]))
            else:
                found.append((match.group(0), rule["name"]))
            position = match.end()
            break
        else:
            position += 1
    return found


def test_every_pattern_compiles_and_names_a_clock_scope():
    assert GRAMMAR["scopeName"] == "source.clock" and GRAMMAR["fileTypes"] == ["clock"]
    assert len(RULES) == 14
    for _, rule in RULES:
        names = [rule["name"]] if "name" in rule else [c["name"] for c in rule["captures"].values()]
        assert all(name.endswith(".clock") for name in names)


def test_every_reserved_word_is_a_keyword():
    for word in sorted(reserved_words()):
        [(text, scope)] = tokens(word)
        assert text == word
        assert scope.startswith(("keyword.", "variable.language.")), (word, scope)
    assert tokens("timer last_frame input_pcm") == [
        ("timer", "variable.other.clock"),
        ("last_frame", "variable.other.clock"),
        ("input_pcm", "variable.other.clock"),
    ]


def test_the_duplex_units_words_are_keywords():
    assert tokens("clock text = up to 21 per unit") == [
        ("clock", "keyword.control.statement.clock"),
        ("text", "entity.name.definition.clock"),
        ("=", "keyword.operator.clock"),
        ("up", "keyword.other.run-time.clock"),
        ("to", "keyword.other.run-time.clock"),
        ("21", "constant.numeric.clock"),
        ("per", "keyword.other.run-time.clock"),
        ("unit", "variable.other.clock"),
    ]
    assert [scope for _, scope in tokens("retain first system + slide high to low")][4:] == [
        "keyword.other.run-time.clock",
        "variable.other.clock",
        "keyword.other.run-time.clock",
        "variable.other.clock",
    ]
    assert tokens("rows conversations")[0] == ("rows", "keyword.other.run-time.clock")


def test_sample_lines_get_their_scopes():
    assert tokens("use std.audio (sample, mel)  # the 24 kHz clock") == [
        ("use", "keyword.control.statement.clock"),
        ("std", "variable.other.clock"),
        ("audio", "variable.other.clock"),
        ("sample", "variable.other.clock"),
        (",", "keyword.operator.clock"),
        ("mel", "variable.other.clock"),
        ("# the 24 kHz clock", "comment.line.number-sign.clock"),
    ]
    assert tokens("clock frame = sample / 1920") == [
        ("clock", "keyword.control.statement.clock"),
        ("frame", "entity.name.definition.clock"),
        ("=", "keyword.operator.clock"),
        ("sample", "variable.other.clock"),
        ("/", "keyword.operator.clock"),
        ("1920", "constant.numeric.clock"),
    ]
    assert tokens("cadence 1 s") == [
        ("cadence", "keyword.control.statement.clock"),
        ("1", "constant.numeric.clock"),
        ("s", "keyword.other.unit.clock"),
    ]
    assert tokens('region kv[layer < 8] : f32[2, B, time] on latent retain ring 250 bind "a.{layer}.b"') == [
        ("region", "keyword.control.statement.clock"),
        ("kv", "entity.name.definition.clock"),
        ("layer", "variable.other.clock"),
        ("<", "keyword.operator.clock"),
        ("8", "constant.numeric.clock"),
        (":", "keyword.operator.clock"),
        ("f32", "storage.type.dtype.clock"),
        ("2", "constant.numeric.clock"),
        (",", "keyword.operator.clock"),
        ("B", "variable.other.clock"),
        (",", "keyword.operator.clock"),
        ("time", "variable.language.time.clock"),
        ("on", "keyword.other.clause.clock"),
        ("latent", "variable.other.clock"),
        ("retain", "keyword.other.clause.clock"),
        ("ring", "keyword.other.policy.clock"),
        ("250", "constant.numeric.clock"),
        ("bind", "keyword.other.clause.clock"),
        ('"a.{layer}.b"', "string.quoted.double.clock"),
    ]
    assert tokens("    write pcm +80ms latency 555 dropped; rng") == [
        ("write", "keyword.other.item.clock"),
        ("pcm", "variable.other.clock"),
        ("+", "keyword.operator.clock"),
        ("80", "constant.numeric.clock"),
        ("ms", "keyword.other.unit.clock"),
        ("latency", "keyword.other.item.clock"),
        ("555", "constant.numeric.clock"),
        ("dropped", "keyword.other.item.clock"),
        (";", "keyword.operator.clock"),
        ("rng", "keyword.other.item.clock"),
    ]
    assert tokens("param hops = prod([8, 6]) * 12.5 Hz") == [
        ("param", "keyword.control.statement.clock"),
        ("hops", "entity.name.definition.clock"),
        ("=", "keyword.operator.clock"),
        ("prod", "support.function.builtin.clock"),
        ("8", "constant.numeric.clock"),
        (",", "keyword.operator.clock"),
        ("6", "constant.numeric.clock"),
        ("*", "keyword.operator.clock"),
        ("12.5", "constant.numeric.clock"),
        ("Hz", "keyword.other.unit.clock"),
    ]
