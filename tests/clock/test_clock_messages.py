"""The exact wording of the diagnostics that matter most: wording is part of the contract.

Each test checks a small program's diagnostics as the user sees them (`dsl check`'s full form), or
the message, notes and help lines one by one where the layout is not the point.
"""

from __future__ import annotations

import textwrap

from duplexcadence.dsl.diagnostic_text import format_full
from duplexcadence.dsl.diagnostics import Diagnostic
from duplexcadence.dsl.frontend import check_file

HEADER = "cadence 1 s\nclock frame = 12.5 Hz\nclock latent = frame * 2\n"


def diagnose(text: str, **overrides: str) -> list[Diagnostic]:
    return list(check_file("prog.clock", overrides, text=textwrap.dedent(text)).diagnostics)


def full(text: str, **overrides: str) -> str:
    result = check_file("prog.clock", overrides, text=textwrap.dedent(text))
    return "\n\n".join(format_full(d, result.sources, path="prog.clock") for d in result.diagnostics)


def only(text: str, **overrides: str) -> Diagnostic:
    found = diagnose(text, **overrides)
    assert len(found) == 1, [d.message for d in found]
    return found[0]


# --- did you mean -----------------------------------------------------------------------------------


def test_unknown_clock_suggests_the_close_one() -> None:
    assert full(HEADER + "region r : f32[time] on latnet retain last 2\n") == textwrap.dedent("""\
        error[unknown-name]: unknown clock 'latnet'
         --> prog.clock:4:25
          |
        4 | region r : f32[time] on latnet retain last 2
          |                         ^^^^^^
          = help: did you mean 'latent'?""")


def test_unknown_name_without_a_close_one_lists_what_is_defined() -> None:
    found = only(HEADER + "region r : f32[zzz, time] on frame retain last 2\n")
    assert found.message == "unknown name 'zzz'"
    assert found.helps == ("defined param or clocks: frame, latent",) or found.helps == (
        "defined names: frame, latent",
    )


def test_unknown_region_in_a_stage_suggests_the_close_one() -> None:
    found = only(
        HEADER + 'region history : f32[time] on frame retain last 2\nstage s on frame { module "s"; read histroy }\n'
    )
    assert (found.message, found.helps) == ("unknown region 'histroy'", ("did you mean 'history'?",))


def test_a_name_of_the_wrong_kind_says_what_it_is_and_where() -> None:
    found = only(HEADER + 'stage s on frame { module "s"; read latent }\n')
    assert found.message == "'latent' is a clock, not a region"
    assert [(n.message, n.span.line, n.span.column) for n in found.notes] == [("'latent' is declared here", 3, 7)]


def test_unknown_function_and_unknown_import_and_imported_name() -> None:
    assert only("param x = mx(1, 2)\n").helps == ("did you mean 'max'?",)
    found = only("use std.audi\n")
    assert (found.code.name, found.message, found.helps) == (
        "unknown-import",
        "no module 'std.audi' in the stdlib or beside this file",
        ("did you mean 'std.audio'?",),
    )
    found = only("use std.audio (sampel)\n")
    assert (found.message, found.helps) == (
        "module 'std.audio' defines no 'sampel'",
        ("did you mean 'sample' or 'mel'?",),
    )


def test_unknown_dtype_and_bind_placeholder_suggest() -> None:
    found = only(HEADER + "region r : fp32[time] on frame retain last 2\n")
    assert found.helps[0] == "did you mean 'f32'?"
    found = only(HEADER + 'region kv[layer < 2] : f32[time] on frame retain last 2 bind "l.{layr}.kv"\n')
    assert found.message == "the binding of region 'kv' uses the unknown placeholder {layr}"
    assert found.helps == (
        "did you mean 'layer'?",
        "the placeholders here are {layer}, or an expression of them and the params, such as {layer + 1}",
    )


def test_misspelt_keywords_and_units_are_suggested_in_syntax_errors() -> None:
    assert only(HEADER + 'stage s on frame { modul "x" }\n').helps[0] == "did you mean 'module'?"
    assert only("clock c = 10 hz\n").helps[0] == "did you mean 'Hz'?"
    assert only("regoin r : f32[time]\n").helps[0] == "did you mean 'region'?"


def test_unknown_param_override_suggests() -> None:
    found = only("param batch = 1\n", batchh="2")
    assert (found.span, found.message, found.helps) == (
        None,
        "--param batchh: the program has no param 'batchh'",
        ("did you mean 'batch'?",),
    )


# --- both sites ------------------------------------------------------------------------------------


def test_duplicate_names_point_at_both_sites() -> None:
    assert (
        full("param B = 1\nclock c = 1 Hz\nparam B = 2\n")
        == textwrap.dedent("""\
        error[duplicate-name]: param 'B' is defined twice
         --> prog.clock:3:7
          |
        3 | param B = 2
          |       ^
          = note: 'B' is first defined here (prog.clock:1:7)
        1 | param B = 1
          |       ^
          = help: params, clocks, regions, counters, objects and stages share one namespace: rename one of them, or delete the second""")
    )


def test_a_duplicate_of_another_kind_names_both_kinds() -> None:
    found = only("param frame = 1\nclock frame = 1 Hz\n")
    assert found.message == "'frame' is defined twice: as a param and as a clock"


def test_a_name_clashing_with_an_import_points_at_the_use() -> None:
    found = only("use std.audio (sample)\nclock sample = 16 kHz\n")
    assert found.message == "clock 'sample' is defined twice"
    assert [(n.message, n.span.line, n.span.column) for n in found.notes] == [
        ("'sample' is first imported here", 1, 16)
    ]


def test_a_region_written_by_two_stages_points_at_both_writes() -> None:
    found = only(
        HEADER + "region r : f32[time] on frame retain last 2\n"
        'stage a on frame { module "a"; update r +1 }\n'
        'stage b on frame { module "b"; update r +1 }\n'
    )
    assert found.message == "region 'r' is written by stage 'a' and by stage 'b'"
    assert (found.span.line, found.notes[0].span.line) == (6, 5)


# --- both numbers ----------------------------------------------------------------------------------


def test_retention_too_short_gives_both_numbers_and_the_retention_site() -> None:
    assert full(
        HEADER + "region kv : f32[time] on latent retain last 2048\n"
        'stage lm on latent { module "lm"; read kv last 3000; update kv +1 }\n'
    ) == textwrap.dedent("""\
        error[retention-too-short]: stage 'lm' reads 3000 units of region 'kv' (last 3000), which keeps 2048
         --> prog.clock:5:35
          |
        5 | stage lm on latent { module "lm"; read kv last 3000; update kv +1 }
          |                                   ^^^^^^^^^^^^^^^^^
          = note: 'kv' declares its retention here (prog.clock:4:33)
        4 | region kv : f32[time] on latent retain last 2048
          |                                 ^^^^^^^^^^^^^^^^
          = help: raise the retention of 'kv' to at least 3000, or shorten the read""")


def test_a_read_of_new_units_needs_only_its_context_kept() -> None:
    found = only(
        "cadence 1 s\nclock code = 12.5 Hz\nclock tick = 1 Hz\n"
        "region codes : i64[time] on code input retain last 20\n"
        "region wav : f32[time] on tick output\n"
        "stage decode on tick { hook d; read codes new + 25; write wav }\n"
    )
    assert (
        found.message == "stage 'decode' reads 25 units of region 'codes' (context before the new ones), which keeps 20"
    )


def test_an_input_read_counts_what_arrives_for_the_firing() -> None:
    found = only(
        "cadence 1 s\nclock code = 12.5 Hz\nclock tick = 1 Hz\n"
        "region codes : i64[time] on code input retain last 5\n"
        "stage decode on tick { hook d; read codes last 30 }\n"
    )
    assert found.message == (
        "stage 'decode' reads 30 units of region 'codes' (last 30), but only 17 are there when "
        "it fires (5 kept + 12 arriving)"
    )
    assert found.helps == ("raise the retention of 'codes' to at least 18, or shorten the read",)


def test_an_advance_mismatch_gives_both_rates() -> None:
    found = only(
        HEADER + 'region r : f32[time] on latent retain last 4\nstage s on frame { module "s"; update r +3 }\n'
    )
    assert found.message == (
        "stage 's' on clock 'frame' (12.5 Hz) updates 3 units of region 'r' per firing, but 'r' "
        "advances on clock 'latent' (25 Hz), i.e. 2 units per firing"
    )
    assert found.helps == ("write `+2`, or put the region on a clock that advances 3 units per firing",)


def test_a_family_error_is_reported_once_for_the_family() -> None:
    found = only(
        HEADER + 'region kv[layer < 8] : f32[time] on latent retain last 4 bind "l.{layer}"\n'
        'stage s on frame { module "s"; update kv +3 }\n'
    )
    assert found.message.startswith("stage 's' on clock 'frame' (12.5 Hz) updates 3 units of region 'kv' per")


# --- cycles ----------------------------------------------------------------------------------------


def test_an_instant_cycle_is_printed_with_each_edge() -> None:
    found = only(
        HEADER + "region x : f32[time] on frame retain last 1\nregion y : f32[time] on frame retain last 1\n"
        'stage b on frame { module "b"; read x; write y +1 }\n'
        'stage a on frame { module "a"; read y; write x +1 }\n'
    )
    assert found.message == "stages depend on each other within one instant: a -> b -> a"
    assert [n.message for n in found.notes] == ["'b' reads 'x', written by 'a'", "'a' reads 'y', written by 'b'"]
    assert [(n.span.line, n.span.column) for n in found.notes] == [(6, 32), (7, 32)]
    assert found.helps == (
        "break the cycle with a delayed read: `read prev REGION` sees the version before this instant's writes",
    )


def test_an_import_cycle_is_printed(tmp_path) -> None:
    (tmp_path / "a.clock").write_text("use b\ncadence 1 s\n")
    (tmp_path / "b.clock").write_text("use c\n")
    (tmp_path / "c.clock").write_text("use a\n")
    [found] = check_file(tmp_path / "a.clock").diagnostics
    assert found.message == "import cycle: a -> b -> c -> a"
    assert (found.span.path, found.span.line, found.span.column) == (str(tmp_path / "c.clock"), 1, 5)


def test_a_param_defined_from_itself_prints_the_chain() -> None:
    found = only("param a = b + 1\nparam b = c\nparam c = a\n")
    assert found.message == "param 'a' depends on itself: a -> b -> c -> a"


# --- syntax ----------------------------------------------------------------------------------------


def test_a_missing_brace_points_where_the_stage_stops() -> None:
    assert full(HEADER + 'stage a on frame {\n    module "a"\n\nstage b on frame { module "b" }\n') == textwrap.dedent("""\
        error[syntax]: stage 'a' is unfinished: expected '}' or another item after string "a"
         --> prog.clock:5:15
          |
        5 |     module "a"
          |               ^
          = note: the next statement begins here (prog.clock:7:1)
        7 | stage b on frame { module "b" }
          | ^^^^^
          = help: expected ';', '}' or a stage item (module, hook, read, update, write, rng, rows, with)""")


def test_the_file_ending_early_names_the_open_declaration() -> None:
    found = only(HEADER + 'stage a on frame {\n    module "a"\n')
    assert (found.message, found.span.line, found.span.column) == ("the file ended inside stage 'a'", 5, 15)
    assert found.notes[0].message == "stage 'a' begins here"
    assert found.helps == ("expected ';', '}' or a stage item (module, hook, read, update, write, rng, rows, with)",)


def test_a_keyword_used_as_a_name_is_called_reserved() -> None:
    found = only("param stock = 3\n")
    assert found.message == "expected a name after keyword 'param', found keyword 'stock'"
    assert found.helps == ("'stock' is a reserved word and cannot be used as a name; pick another name",)


def test_a_bad_character_and_an_open_string() -> None:
    assert only("param x = 3 ?\n").message == "unexpected character '?'"
    assert only("param x = 3 \u00e9\n").message == "unexpected character '\u00e9'"
    assert only("param x = 3 \x07\n").message == "unexpected character U+0007"
    assert only('stage s on c { module "abc }\n').message == "this string is not closed on its line"


def test_each_broken_statement_gets_its_own_syntax_error() -> None:
    found = diagnose("param a = \nparam b = 1\nparam c = ]\nclock d = 1 Hz\nregion\n")
    assert [(d.span.line, d.message) for d in found] == [
        (1, "param 'a' is unfinished: expected an expression after '='"),
        (3, "expected an expression after '=', found ']' in param 'c'"),
        (5, "the file ended inside region"),
    ]


def test_override_of_the_wrong_kind_names_the_kind_and_the_default() -> None:
    program = "param ratios = [8, 6, 5, 4]\nparam window = 2 s\nparam steps = 10\n"
    assert (
        only(program, ratios="8").message
        == "--param ratios=8: 'ratios' is a list, default [8, 6, 5, 4] (got an integer)"
    )
    assert (
        only(program, window="3").message
        == "--param window=3: 'window' is a duration (s), default 2 s (got an integer)"
    )
    assert only(program, steps="2.5").message == "--param steps=2.5: 'steps' is an integer, default 10 (got a fraction)"
    assert only(program, ratios="[8, 1 s]").message == (
        "--param ratios=[8, 1 s]: 'ratios' is a list, default [8, 6, 5, 4] "
        "(item 1 is a duration (s), the default's items are an integer)"
    )


# --- chunk boundaries --------------------------------------------------------------------------------

CHUNKED = """\
use std.audio (sample, mimi_frame)
cadence 1 s
clock code = mimi_frame
clock tick = 1 Hz
region codes : i64[1, 16, time] on code input retain last 25
region wav : f32[1, 1, time] on sample output
stage decode on tick {
    hook chunk
    read codes new + 25
    write wav WRITE
}
"""


def test_a_loss_at_every_boundary_gives_the_units_the_time_and_the_session_count() -> None:
    assert full(CHUNKED.replace("WRITE", "loses 555")) == textwrap.dedent("""\
        warning[boundary-loss]: region 'wav' loses 555 samples, 23.1 ms at 24 kHz, at each of 59 boundaries in 60 s: 32745 samples (1.36 s) fewer than one offline call over the same input
          --> prog.clock:10:5
           |
        10 |     write wav loses 555
           |     ^^^^^^^^^^^^^^^^^^^
           = note: each firing's output is short by the loss, as one call of the model is; one offline call loses it once, a stream of firings at every boundary (heard as a click, and the audio runs early)
           = help: to keep them, carry what the last 555 samples of a firing wait for: hold them back (`latency 555`, released by the end of the stream) and keep the state, or a context that covers the receptive field, so that the next firing completes them
           = help: if the clock reproduces a stock loop that loses them, say so: `loses 555 intended`""")


def test_an_intended_loss_is_not_reported_and_the_count_follows_the_stage_clock() -> None:
    assert diagnose(CHUNKED.replace("WRITE", "loses 555 intended")) == []
    per_code = CHUNKED.replace("on tick {", "on code {").replace("new + 25", "new").replace("WRITE", "+1920 loses 3")
    assert only(per_code).message == (
        "region 'wav' loses 3 samples, 0.125 ms at 24 kHz, at each of 749 boundaries in 60 s: "
        "2247 samples (93.6 ms) fewer than one offline call over the same input"
    )


def test_a_loss_must_fit_the_advance_and_belong_to_an_output() -> None:
    per_code = CHUNKED.replace("on tick {", "on code {").replace("new + 25", "new")
    assert only(per_code.replace("WRITE", "+1920 latency 1800 loses 555")).message == (
        "stage 'decode' writes region 'wav' with a loss of 555 units, more than its advance of 1920 "
        "less its latency of 1800"
    )
    state = per_code.replace("on sample output", "on sample retain last 4").replace("WRITE", "+1920 loses 1")
    assert only(state).message == "stage 'decode' writes region 'wav' with `loses`, but 'wav' is not an output"


# --- counters and caller-owned objects ---------------------------------------------------------------

COUNTED = HEADER + "object cache\nregion x : f32[1, time] on frame input\n"
PASSED = "stage s on frame { hook h; read x; update cache; read c }\n"


def test_a_counters_binding_is_reported_as_the_counters() -> None:
    shared = only(
        COUNTED + 'counter c +1 on frame bind "n"\ncounter d +1 on frame bind "n"\n' + PASSED[:-3] + "; read d }\n"
    )
    assert (shared.message, shared.helps) == (
        "counter 'd' binds to 'n', which counter 'c' binds to already",
        ("two counters cannot share one attribute: bind one of them elsewhere",),
    )
    placeholder = only(COUNTED + 'counter c +1 on frame bind "n.{i}"\n' + PASSED)
    assert placeholder.message == "the binding of counter 'c' uses the unknown placeholder {i}"
    empty = only(COUNTED + 'counter c +1 on frame bind "a..b"\n' + PASSED)
    assert empty.message == "the binding 'a..b' of counter 'c' has an empty part between dots"
    unpassed = only(COUNTED + 'counter c +1 on frame bind cache "n"\nstage s on frame { hook h; read x; read c }\n')
    assert unpassed.message == "counter 'c' binds into object 'cache', which no stage passes"


def test_a_private_path_into_an_object_opts_in_with_the_object_named() -> None:
    found = only(COUNTED + 'counter c +1 on frame bind cache "_n"\n' + PASSED)
    assert found.message == "the binding '_n' of counter 'c' goes through '_n', a private attribute"
    assert found.helps[0].endswith('opt in: `bind private cache "_n"`')
