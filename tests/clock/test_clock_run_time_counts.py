"""The checked records of the duplex unit's constructs: a bounded clock's bound and the clock it counts per,
a slide's marks, a run-time advance, a stage's rows, durations counted at a bounded clock's most units a
second, and `dsl fmt`'s canonical text of each."""

from __future__ import annotations

from fractions import Fraction

from duplexcadence.dsl import printer
from duplexcadence.dsl.frontend import load_program
from duplexcadence.dsl.parse import parse_module
from duplexcadence.dsl.source import SourceFile

TEXT = """cadence 1 s
clock unit = 2 Hz
clock token = up to 8 per unit
clock position = up to 18 per unit
region audio : f32[1, time] on unit input
region kv : bf16[2, time] on position retain first 16 + slide 512 to 384 start given 16
region cache : bf16[2, time] on position retain all horizon 2 s
region text : i64[1, time] on token output
stage listen on unit {
    hook listen
    rows 4
    read audio
    update kv +10
    update cache +10
}
stage decode on token {
    hook decode
    update kv +1
    update cache up to 1
    write text +1
}
"""


def test_the_records_say_what_is_counted_at_run_time(tmp_path):
    path = tmp_path / "unit.clock"
    path.write_text(TEXT)
    program = load_program(path)
    token = program.clocks["token"]
    assert (token.rate, token.bound, token.per, token.unit_rate) == (Fraction(2), 8, "unit", Fraction(16))
    kv = program.regions["kv"].retention
    assert (kv.kind, kv.first, kv.last, kv.low, kv.describe()) == ("slide", 16, 512, 384, "first 16 + slide 512 to 384")
    assert program.regions["cache"].retention.horizon == 2 * 36  # 2 s at up to 18 units at each of 2 ticks a second
    assert [a.up_to for a in program.stages["decode"].accesses] == [False, True, False]
    assert (program.stages["listen"].rows, program.stages["decode"].rows) == (4, None)
    assert program.burst("decode") == 8 and program.burst("listen") is None
    assert [name for name in program.regions if program.run_time_length(name)] == ["kv", "cache", "text"]
    assert program.run_time_capacity("kv") == 512 + 2 * 18  # a cadence brings two units of the clock
    assert program.run_time_capacity("text") == 8  # scratch: one instant's units


def test_a_capacity_holds_what_one_firing_of_a_slow_writer_brings(tmp_path):
    """A slide fed by a clock slower than the cadence receives a whole firing in some cadences (100, not the
    50 a cadence brings on average); an `all` horizon shorter than one instant's units holds the instant."""
    path = tmp_path / "slow.clock"
    path.write_text(
        "cadence 1 s\nclock unit = 0.5 Hz\nclock frame = 50 Hz\nclock token = up to 18 per unit\n"
        "region enc : bf16[2, time] on frame retain slide 1400 to 0\n"
        "region kv : bf16[2, time] on token retain all horizon 5\n"
        "region out : f32[1, time] on unit output\n"
        "stage listen on unit {\n    hook listen\n    update enc +100\n    write out +1\n}\n"
        "stage decode on token {\n    hook decode\n    update kv +1\n}\n"
    )
    program = load_program(path)
    assert program.run_time_capacity("enc") == 1400 + 100
    assert program.run_time_capacity("kv") == 18


def test_a_failed_writer_gives_no_second_error_about_the_bound(tmp_path):
    """With `rows 0` refused, the bounded region's remaining writers no longer add up to its bound: that is
    the same mistake, reported once."""
    from duplexcadence.dsl.frontend import check_file

    path = tmp_path / "rows0.clock"
    path.write_text(TEXT.replace("rows 4", "rows 0"))
    diagnostics = check_file(path).diagnostics
    assert [(d.code.name, d.message) for d in diagnostics] == [
        ("bad-value", "the rows of stage 'listen' must be at least 1, not 0")
    ]


def test_fmt_prints_each_construct_canonically():
    module = parse_module(SourceFile("unit.clock", TEXT))
    text = printer.module(module)
    for line in (
        "clock token = up to 8 per unit",
        "region kv : bf16[2, time] on position retain first 16 + slide 512 to 384 start given 16",
        "    rows 4",
        "    update cache up to 1",
    ):
        assert line in text.splitlines()
    assert parse_module(SourceFile("unit.clock", text)) == module
