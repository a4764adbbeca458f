"""`--param NAME=VALUE`: overrides of the right kind take effect everywhere the param is used; an
unknown name, a value of the wrong kind and a malformed pair are reported clearly."""

from __future__ import annotations

from fractions import Fraction

from duplexcadence.dsl.frontend import check_file
from duplexcadence.interpreter.cli import main as cli

PROGRAM = """\
use std.audio
cadence 1 s
param B = 1
param ratio = 2.5
param ratios = [8, 6, 5, 4]
param window = 2 s
param hop = 1920
clock frame = sample / hop
region codes : i64[B, prod(ratios), time] on frame input retain last window
stage s on frame { hook s; read codes last ratio * 2 }
"""


def check(**overrides: str):
    return check_file("p.clock", overrides, text=PROGRAM)


def messages_of(result) -> list[str]:
    return [d.message for d in result.diagnostics]


def test_defaults_without_overrides() -> None:
    program = check().program
    assert program.params["B"] == 1 and program.params["ratio"] == Fraction(5, 2)
    assert program.regions["codes"].shape == (1, 960, None)
    assert program.regions["codes"].retention.last == 25  # 2 s at 12.5 Hz


def test_overrides_of_the_right_kind_take_effect_everywhere() -> None:
    program = check(B="4", ratios="[2, 3]", window="800 ms", hop="960", ratio="3").program
    assert program.regions["codes"].shape == (4, 6, None)
    assert program.clocks["frame"].rate == 25
    assert program.regions["codes"].retention.last == 20  # 800 ms at 25 Hz
    assert program.stages["s"].accesses[0].count == 6


def test_a_fraction_param_takes_an_integer_and_a_list_may_change_length() -> None:
    program = check(ratio="2", ratios="[1, 2, 3, 4, 5, 6]").program
    assert program.params["ratio"] == 2 and program.params["ratios"] == [1, 2, 3, 4, 5, 6]


def test_an_imported_param_the_file_sees_can_be_overridden() -> None:
    program = check(mel_hop="240").program
    assert program.clocks["mel"].rate == 100


def test_a_param_only_an_import_sees_cannot_be_overridden() -> None:
    text = "use std.audio (mel)\ncadence 1 s\n"
    result = check_file("p.clock", {"mel_hop": "240"}, text=text)
    assert messages_of(result) == ["--param mel_hop: the program has no param 'mel_hop'"]


def test_unknown_param_suggests_the_close_one() -> None:
    result = check(ratioz="2")
    [diagnostic] = result.diagnostics
    assert (diagnostic.code.name, diagnostic.span) == ("param-override", None)
    assert diagnostic.helps == ("did you mean 'ratio' or 'ratios'?",)


def test_wrong_kinds_are_refused_and_the_default_kept() -> None:
    assert messages_of(check(B="[1, 2]")) == ["--param B=[1, 2]: 'B' is an integer, default 1 (got a list)"]
    assert messages_of(check(B="1 s")) == ["--param B=1 s: 'B' is an integer, default 1 (got a duration (s))"]
    assert messages_of(check(ratios="4")) == [
        "--param ratios=4: 'ratios' is a list, default [8, 6, 5, 4] (got an integer)"
    ]
    assert messages_of(check(window="2")) == [
        "--param window=2: 'window' is a duration (s), default 2 s (got an integer)"
    ]
    assert messages_of(check(window="2 Hz")) == [
        "--param window=2 Hz: 'window' is a duration (s), default 2 s (got a rate (Hz))"
    ]


def test_values_that_are_not_literals_are_refused_with_the_reason() -> None:
    assert messages_of(check(B="hop")) == [
        "--param B=hop: 'B' is an integer, default 1 ('hop': a --param value cannot name other declarations)"
    ]
    [message] = messages_of(check(B="(2"))
    assert message.startswith("--param B=(2: 'B' is an integer, default 1 (the file ended")
    [message] = messages_of(check(B="1/0"))
    assert message == "--param B=1/0: 'B' is an integer, default 1 (division by zero)"


def test_an_override_that_makes_the_program_wrong_is_reported_where_it_bites() -> None:
    [diagnostic] = check(B="0").diagnostics
    assert (diagnostic.code.name, diagnostic.span.line, diagnostic.span.column) == ("bad-shape", 9, 20)


def test_the_command_line_reports_overrides_and_malformed_pairs(capsys, tmp_path) -> None:
    path = tmp_path / "p.clock"
    path.write_text(PROGRAM)
    assert cli.main(["check", "--param", "B=2", "--param", "window=800 ms", str(path)]) == 0
    assert capsys.readouterr().out == "All clean: 1 file checked.\n"
    assert cli.main(["check", "--output-format", "concise", "--param", "Bee=2", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{path}: error: --param Bee: the program has no param 'Bee' [param-override]"
    assert cli.main(["check", "--param", "B 2", str(path)]) == 2
    assert "--param 'B 2' is not NAME=VALUE" in capsys.readouterr().err
    assert cli.parse_params(["a=1", "b = [1, 2] ", "bad"])[0] == {"a": "1", "b": "[1, 2]"}
