"""`dsl check` and `dsl fmt` as a user runs them: output formats against golden files, the summary
line, exit codes, colour, and a clear message (never a traceback) for files that are not programs.

The golden files live in tests/clock/snapshots/. After an intended change of wording or layout,
regenerate them and review the diff:

    UPDATE_SNAPSHOTS=1 python -m pytest tests/clock/test_clock_cli.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from duplexcadence.interpreter.cli import check as check_command
from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).parent
SNAPSHOTS = HERE / "snapshots"
UPDATE = os.environ.get("UPDATE_SNAPSHOTS") == "1"
BAD_FILES = [
    "bad/retention_too_short.clock",
    "bad/instant_cycle.clock",
    "bad/duplicate_name.clock",
    "bad/syntax_missing_brace.clock",
    "bad/warnings.clock",
]
GOOD_FILES = sorted(f"good/{p.name}" for p in (HERE / "good").glob("*.clock"))


def dsl(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the `dsl` command in-process; returns (exit code, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no snapshot {name}: run with UPDATE_SNAPSHOTS=1 to create it"
    assert text == path.read_text(encoding="utf-8"), f"output differs from {path}; see the module docstring"


@pytest.fixture
def in_tests_dir(monkeypatch):
    """Paths in outputs are relative to tests/clock, whatever the checkout's location."""
    monkeypatch.chdir(HERE)
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


# --- formats -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["full", "concise", "json"])
def test_check_output_formats_match_their_snapshots(capsys, in_tests_dir, fmt: str) -> None:
    code, out, err = dsl(capsys, "check", "--output-format", fmt, *BAD_FILES, GOOD_FILES[0])
    assert (code, err) == (1, "")
    assert_snapshot(f"check_{fmt}.{'json' if fmt == 'json' else 'txt'}", out)


def test_json_output_is_one_document_per_run_with_every_field(capsys, in_tests_dir) -> None:
    _code, out, _ = dsl(capsys, "check", "--output-format", "json", *BAD_FILES)
    payload = json.loads(out)
    assert [entry["path"] for entry in payload] == BAD_FILES
    diagnostic = payload[0]["diagnostics"][0]
    assert set(diagnostic) == {"code", "severity", "message", "span", "notes", "helps"}
    assert set(diagnostic["span"]) == {"path", "line", "column", "end_line", "end_column"}


def test_clean_files_print_the_summary_only_and_exit_0(capsys, in_tests_dir) -> None:
    code, out, err = dsl(capsys, "check", *GOOD_FILES)
    assert (code, out, err) == (0, f"All clean: {len(GOOD_FILES)} files checked.\n", "")


def test_the_summary_counts_errors_warnings_and_files(capsys, in_tests_dir) -> None:
    _, out, _ = dsl(capsys, "check", "--output-format", "concise", "bad/warnings.clock")
    assert out.splitlines()[-1] == "Found 2 warnings in 1 file."
    code, out, _ = dsl(capsys, "check", "--output-format", "concise", "bad/warnings.clock", "bad/duplicate_name.clock")
    assert (code, out.splitlines()[-1]) == (1, "Found 3 errors and 2 warnings in 2 files.")


def test_warnings_alone_exit_0(capsys, in_tests_dir) -> None:
    assert dsl(capsys, "check", "bad/warnings.clock")[0] == 0


def test_fmt_prints_the_canonical_form_keeping_comments(capsys, in_tests_dir) -> None:
    code, out, err = dsl(capsys, "fmt", "good/layout_and_comments.clock")
    assert (code, err) == (0, "")
    assert_snapshot("fmt_layout_and_comments.clock", out)


def test_fmt_check_and_write(capsys, tmp_path) -> None:
    messy = tmp_path / "messy.clock"
    messy.write_text("cadence 1 s\nparam n=3   # three\nclock c = 10 Hz\n")
    code, out, err = dsl(capsys, "fmt", "--check", str(messy))
    assert (code, out, err) == (
        1,
        f"would reformat {messy}\n",
        "1 file would be reformatted, 0 already in canonical form.\n",
    )
    assert dsl(capsys, "fmt", "--write", str(messy))[0] == 0
    assert messy.read_text() == "cadence 1 s\n\nparam n = 3  # three\n\nclock c = 10 Hz\n"
    assert dsl(capsys, "fmt", "--check", str(messy))[:2] == (0, "")


def test_fmt_of_a_file_with_a_syntax_error_exits_1_and_leaves_it(capsys, tmp_path) -> None:
    broken = tmp_path / "broken.clock"
    broken.write_text("param = 3\n")
    code, _out, err = dsl(capsys, "fmt", "--write", str(broken))
    assert code == 1 and "error[syntax]" in err and broken.read_text() == "param = 3\n"


def test_a_file_ending_inside_a_statement_is_one_syntax_error(capsys, tmp_path) -> None:
    cut = tmp_path / "cut.clock"
    cut.write_text("cadence 1 s\nparam x = \n")
    for command in ("check", "fmt"):
        code, out, _err = dsl(capsys, command, "--output-format", "json", str(cut))
        [document] = json.loads(out)
        assert code == 1 and [d["message"] for d in document["diagnostics"]] == ["the file ended inside param 'x'"]


# --- exit codes and colour ----------------------------------------------------------------------------


def test_usage_errors_exit_2(capsys, in_tests_dir) -> None:
    assert dsl(capsys, "check")[0] == 2
    assert dsl(capsys, "check", "--output-format", "xml", GOOD_FILES[0])[0] == 2
    assert dsl(capsys)[0] == 2
    code, out, err = dsl(capsys, "check", "--param", "B", GOOD_FILES[0])
    assert (code, out) == (2, "")
    assert err == (
        "dsl check: error: --param 'B' is not NAME=VALUE\n"
        "  help: write e.g. --param P=200 or --param ratios=[8,6,5,4]\n"
    )
    for malformed in ("=3", "B=", "3B=1", "a.b=2"):
        assert dsl(capsys, "check", "--param", malformed, GOOD_FILES[0])[0] == 2


def test_limit_flags_raise_a_limit_or_are_usage_errors(capsys, in_tests_dir, tmp_path) -> None:
    """`--limit NAME=VALUE` on check, plan and render; a wrong one exits 2 before any work."""
    code, out, err = dsl(capsys, "check", "--limit", "regoins=5", GOOD_FILES[0])
    assert (code, out) == (2, "")
    assert err.startswith("dsl check: error: --limit regoins: no such limit (the limits: regions, stages, ")
    assert dsl(capsys, "plan", "--limit", "views=0", GOOD_FILES[0])[0] == 2
    assert dsl(capsys, "render", "--limit", "views", GOOD_FILES[0])[0] == 2
    window = tmp_path / "window.clock"
    window.write_text(
        "cadence 1 s\nclock c = 10 Hz\nregion h : f32[1, time] on c retain last 20000000 start zeros\n"
        'stage s on c {\n    module "s"\n    update h +1\n}\n'
    )
    assert dsl(capsys, "check", str(window))[0] == 1
    code, out, _ = dsl(capsys, "check", "--limit", "retention=20000000", str(window))
    assert (code, out.splitlines()[-1]) == (0, "All clean: 1 file checked.")
    code, out, err = dsl(capsys, "plan", "--limit", "warmup=2", "../../examples/toy/toy.clock")
    assert (code, out) == (1, "") and "error[warmup-too-long]" in err
    assert dsl(capsys, "render", "--ticks", "10001", "../../examples/toy/toy.clock")[0] == 2


def test_an_internal_error_exits_2_with_one_line_and_no_traceback(capsys, monkeypatch, in_tests_dir) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(check_command, "check_file", broken)
    code, _out, err = dsl(capsys, "check", GOOD_FILES[0])
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[0] == "dsl: internal error: RuntimeError: boom"


def test_no_colour_unless_asked(capsys, monkeypatch, in_tests_dir) -> None:
    assert "\x1b[" not in dsl(capsys, "check", BAD_FILES[0])[1]  # captured stdout is not a TTY
    assert "\x1b[1;31merror" in dsl(capsys, "check", "--color", "always", BAD_FILES[0])[1]
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in dsl(capsys, "check", "--color", "auto", BAD_FILES[0])[1]


# --- files that are not programs ---------------------------------------------------------------------


def test_files_that_are_not_programs_get_a_clear_message(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("folder.clock").mkdir()
    Path("binary.clock").write_bytes(bytes(range(256)) * 4)
    Path("latin1.clock").write_bytes("param caf\u00e9 = 1\n".encode("latin-1"))
    Path("empty.clock").write_text("")
    Path("huge.clock").write_text("# padding\n" * 1_000_000)  # 10 MB
    Path("garbage.clock").write_text("\u2603\u00a0\ufffd \x1b[31m {{{ }}} ;;; ''")
    files = [
        "missing.clock",
        "folder.clock",
        "binary.clock",
        "latin1.clock",
        "empty.clock",
        "huge.clock",
        "garbage.clock",
    ]
    code, out, err = dsl(capsys, "check", *files)
    assert (code, err) == (1, "")
    assert "Traceback" not in out and "\x1b" not in out  # no escape sequence from a file reaches the terminal
    assert_snapshot("check_files.txt", out)


@pytest.mark.slow
def test_the_installed_command_never_prints_a_traceback(tmp_path) -> None:
    """One real process per case: what a shell user sees, with its exit code."""
    (tmp_path / "binary.clock").write_bytes(b"\x00\xff" * 100)
    (tmp_path / "ok.clock").write_text("cadence 1 s\n")
    command = [sys.executable, "-m", "duplexcadence.interpreter.cli.main", "check"]
    for args, expected_code in ((["binary.clock", "nothing.clock"], 1), (["ok.clock"], 0), ([], 2)):
        done = subprocess.run(command + args, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == expected_code, done.stderr
        assert "Traceback" not in done.stdout + done.stderr


def test_check_and_fmt_start_without_importing_torch(tmp_path) -> None:
    """Only the module of the command being run is imported, so an editor can run `dsl check` on
    every save (tests/cli/test_cli_conventions.py runs every language command where torch cannot be
    imported at all)."""
    (tmp_path / "ok.clock").write_text("cadence 1 s\n")
    code = (
        "import sys; from duplexcadence.interpreter.cli.main import main; "
        "codes = [main(['check', 'ok.clock']), main(['fmt', '--check', 'ok.clock'])]; "
        "print(codes, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "[0, 0] False", done.stdout + done.stderr
