"""`dsl plan` as a user reads it: condensed by default (the members of a family alike in one row
`kv[0..7] ×8`, one line per graph, firings as ranges, no line past the tables' width) and `--verbose`
with every member, the views of every graph and the units of every firing; `--seconds` sets the
session the samples are counted over."""

from __future__ import annotations

import json
import sys

import pytest

from duplexcadence.dsl import loader
from duplexcadence.interpreter.cli import main as cli
from duplexcadence.interpreter.plans.plan import plan_file
from duplexcadence.interpreter.plans.plan_text import family_label, format_plan, member_range, number_ranges, plural

MIMI = loader.stdlib_path("models.mimi_decoder")
STDLIB_MODELS = [name for name in loader.stdlib_modules() if name.startswith("models.")]


def plan_text(capsys, *argv: str) -> str:
    assert cli.main(["plan", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def section(text: str, title: str) -> list[str]:
    """The lines of one section, from its title to the blank line after it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_alike_family_members_share_one_row_with_their_offsets(capsys) -> None:
    regions = section(plan_text(capsys, str(MIMI)), "Regions")
    rows = {line.split()[0]: line.split() for line in regions[3:] if line.startswith("  ") and "[" in line.split()[0]}
    assert rows["kv[0..7]"][:8] == ["kv[0..7]", "×8", "f32", "2x1x8x250x64", "ring", "250", "250", "1000.0"]
    assert "0..7168000" in rows["kv[0..7]"]
    assert rows["kv_end[0..7]"][:3] == ["kv_end[0..7]", "×8", "i64"] and "8242688..8246272" in rows["kv_end[0..7]"]
    assert "rope_offset[0..7]" in rows
    assert not any(line.lstrip().startswith("kv[3]") for line in regions)
    assert any(line.startswith("  a row `name[i..j] ×n` stands for n family members alike") for line in regions)


def test_verbose_lists_every_member_and_the_views_of_every_graph(capsys) -> None:
    text = plan_text(capsys, str(MIMI), "--verbose")
    plan = plan_file(MIMI)
    regions = section(text, "Regions")
    names = [line.split()[0] for line in regions[3:] if line.startswith("  ") and not line.startswith("   ")]
    expected = [a.name for a in plan.arena.allocations if not a.name.endswith("~double")]
    assert names[: len(expected)] == expected
    assert "×8" not in "\n".join(regions)
    capture = section(text, "Capture plan")
    assert "  views of each graph (units of the region's clock; update: held +advance = in flight -> kept):" in capture
    assert "    0 upsample: codes +1; codes 1; upsample_partial 2 +0 = 2 -> 2; embedded +2" in capture
    views = "\n".join(capture)
    assert all(f"kv[{i}] 250 +0 = 250 -> 250" in views for i in range(8))


def test_one_line_per_graph_and_firings_as_ranges(capsys) -> None:
    capture = section(plan_text(capsys, str(MIMI)), "Capture plan")
    assert capture[1:6] == [
        "  graph  stage        used in  captured  stage firings",
        "  -----  -----------  -------  --------  -------------",
        "      0  upsample     steady   yes       0..149",
        "      1  transformer  steady   yes       0..149",
        "      2  seanet       steady   yes       0..149",
    ]
    assert capture[6] == "  3 of 3 graphs captured (no budget); eager firings in warm-up + one period: 0"
    assert not any("views of each graph" in line for line in capture)


@pytest.mark.parametrize("module", STDLIB_MODELS)
@pytest.mark.parametrize("verbose", [False, True])
def test_no_line_is_longer_than_a_wide_terminal(capsys, module: str, verbose: bool) -> None:
    text = plan_text(capsys, module, *(["--verbose"] if verbose else []))
    longest = max(text.splitlines(), key=len)
    assert len(longest) <= 150, longest


def test_on_a_terminal_the_tables_fit_its_width(capsys, monkeypatch) -> None:
    def regions_table(text: str) -> list[str]:
        lines = section(text, "Regions")[1:]
        return lines[: next(i for i, line in enumerate(lines) if line.startswith("  per session"))]

    def cells(lines: list[str]) -> list[str]:
        return sorted(c for c in "".join(lines) if c not in " -")

    whole = regions_table(plan_text(capsys, "models.step_audio2_token2wav"))  # a pipe: whole lines
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    narrow = regions_table(plan_text(capsys, "models.step_audio2_token2wav"))
    assert max(map(len, whole)) > 80 >= max(map(len, narrow))
    assert len(narrow) > len(whole) and cells(narrow) == cells(whole)  # wrapped, nothing left out


def test_counts_of_one_are_singular(capsys, tmp_path) -> None:
    clock = tmp_path / "once.clock"
    clock.write_text(
        "cadence 1 s\nclock tick = 1 Hz\nregion x : f32[1, time] on tick retain last 1\n"
        "region y : f32[1, time] on tick output\nstage s on tick { hook h; update x +1; write y +1 }\n"
    )
    text = plan_text(capsys, str(clock))
    assert "hyperperiod 1 s = 1 instant\n" in text
    assert "steady period: 1 instant (1 s), repeated forever" in text
    assert "2 of 2 graphs captured" in text  # the warm-up's firing sees an empty `x`
    before_samples = text[: text.index("Samples over")]
    assert " instants" not in before_samples.replace("(dataflow order within an instant)", "")


def test_the_helpers_name_families_and_ranges() -> None:
    assert member_range(["kv[0]", "kv[1]", "kv[2]"]) == "kv[0..2]"
    assert member_range(["kv[0]", "kv[2]", "kv[5]"]) == "kv[0, 2, 5]"
    assert (family_label(["kv[4]"]), family_label(["kv[0]", "kv[1]"])) == ("kv[4]", "kv[0..1] ×2")
    assert number_ranges([0, 1, 2, 3]) == "0..3"
    assert number_ranges([1, 2, 5, 7, 8, 9]) == "1, 2, 5, 7..9"
    assert number_ranges(list(range(0, 20, 2)), limit=4) == "0, 2, 4, 6, ... (10 firings)"
    assert (plural(1, "instant"), plural(0, "instant"), plural(25, "instant")) == (
        "1 instant",
        "0 instants",
        "25 instants",
    )


def test_the_text_is_a_pure_function_of_the_plan() -> None:
    plan = plan_file(MIMI)
    assert format_plan(plan) == format_plan(plan_file(MIMI))
    assert format_plan(plan, color=True).replace("\x1b[1m", "").replace("\x1b[0m", "") == format_plan(plan)


def test_the_samples_close_the_plan_and_seconds_sets_the_session(capsys) -> None:
    text = plan_text(capsys, "models.qwen3_omni_code2wav", "--seconds", "3")
    samples = section(text, "Samples over")
    assert samples == [
        "Samples over 3 s (3 instants; units of each output's clock)",
        "  output  clock   input           firings  emitted  flushed  dropped  total  offline  short",
        "  ------  ------  --------------  -------  -------  -------  -------  -----  -------  -----",
        "  wav     sample  37 codes x1920        3    69375        0     1110  69375    70485   1110",
        "  wav: 555 samples (23.1 ms at 24 kHz) lost at each of 2 boundaries, 1110 samples (46.2 ms) in all",
        "      (boundary-loss)",
        "  wav: one offline call loses 555 samples too: 37 codes x 1920 - 555 = 70485",
        "  dsl plan --verbose: every family member, the views of every graph, the units of every firing",
    ]
    assert text.endswith(samples[-1] + "\n")


@pytest.mark.parametrize(
    ("seconds", "says"),
    [
        ("0", "argument --seconds: must be a positive number of seconds (60, 2.5), not '0'"),
        ("1e3", "argument --seconds: must be a positive number of seconds (60, 2.5), not '1e3'"),
        ("900000", "a session of 900000 s has 11250000 instants; the sample accounting sums at most 10000000"),
    ],
)
def test_a_session_the_accounting_refuses_is_a_usage_error(capsys, seconds: str, says: str) -> None:
    try:
        code = cli.main(["plan", str(MIMI), "--seconds", seconds])
    except SystemExit as exited:  # argparse refuses the value itself
        code = exited.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == "" and f"dsl plan: error: {says}" in err


MEGAHERTZ_CLOCK = """\
cadence 0.001 ms
clock sample = 1000 kHz
region x : f32[1, time] on sample input
region y : f32[1, time] on sample output
stage s on sample {
    hook copy
    read x
    write y +1
}
"""


def test_the_default_session_is_shortened_to_what_the_accounting_sums(tmp_path, capsys) -> None:
    """60 s of a 1 MHz clock are 60 000 000 instants: the default session is cut to the first 10 s, said in
    the plan; given with --seconds, the same length is refused (above)."""
    path = tmp_path / "fast.clock"
    path.write_text(MEGAHERTZ_CLOCK)
    assert cli.main(["plan", str(path), "--output-format", "json"]) == 0
    samples = json.loads(capsys.readouterr().out)["samples"]
    assert (samples["seconds"], samples["instants"]) == ("10", 10_000_000)
    assert samples["clamped"] == (
        "a session of 60 s has 60000000 instants; the sample accounting sums at most 10000000: accounted over "
        "the first 10 s"
    )
    assert cli.main(["plan", str(path), "--seconds", "60"]) == 2
    assert capsys.readouterr().err.startswith("dsl plan: error: a session of 60 s has 60000000 instants")


def test_off_plan_steps_are_traced_and_counted_and_a_bad_one_is_a_usage_error(capsys) -> None:
    """`--off-plan`: MiniCPM-o 4.5's forced flushes of a turn's first chunk and its turn ends, as its
    `load_runtime` declares them (examples/minicpmo45/cadence.py, `turn_boundaries(range(5, 25))`)."""
    token2wav = str(loader.stdlib_path("models.step_audio2_token2wav"))
    text = plan_text(capsys, token2wav, "--off-plan", "step tokens=5-24 at start", "--off-plan", "finish tokens=0")
    assert section(text, "Off-plan instants") == [
        "Off-plan instants (declared steps, captured like planned instants)",
        "  declared: step tokens=5-24 at start; finish tokens=0 at any",
        "  instant         starts from   instants  units         at instants",
        "  --------------  ------------  --------  ------------  -----------",
        "  step            the plan            20  tokens 5..24  0",
        "  finish          the plan             3  tokens 0      0..2",
        "  planned inputs  off the plan        40  as planned    1, 2",
        "  finish          off the plan        40  tokens 0      1, 2",
        "  103 instants off the plan (40 states off the plan reached); 147 stage graphs more than the capture",
        "  plan's; 0 declared steps the runtime would refuse where they were tried",
        "  each off-plan instant is captured as a planned one is, per session slot, and a session that takes",
        "  only declared steps fires nothing eagerly; an undeclared step runs eagerly",
    ]
    assert "Off-plan instants" not in plan_text(capsys, token2wav)
    assert cli.main(["plan", token2wav, "--off-plan", "finish pcm=0"]) == 2
    assert capsys.readouterr().err.startswith(
        "dsl plan: error: off-plan step 'finish pcm=0 at any': 'pcm' is not an input region; the inputs are tokens"
    )
    with pytest.raises(SystemExit) as usage:
        cli.main(["plan", token2wav, "--off-plan", "flush tokens=3"])
    assert usage.value.code == 2
    assert "argument --off-plan: off-plan step 'flush tokens=3': write 'step NAME=COUNTS" in capsys.readouterr().err
