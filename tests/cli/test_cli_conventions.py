"""The `dsl` command at the conventions of ruff and mypy: `--version`, `python -m duplexcadence`, `-` for
standard input, directories, one `--output-format` on every command with JSON on stdout (`--format` its
deprecated spelling), `-q`, one error prefix, a bad `--param` reported once, colour with NO_COLOR/FORCE_COLOR,
stdlib modules by name, validated numbers and devices, the install line of a missing package, and `--help` and
the language commands starting without torch."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

import pytest

import duplexcadence
from duplexcadence.dsl import loader
from duplexcadence.interpreter.cli import common
from duplexcadence.interpreter.cli import main as cli

TAIL = (
    "cadence 1 s\n\nclock frame = 10 Hz\n\nregion x : f32[1, time] on frame retain last 2\n"
    "region y : f32[1, time] on frame output\n\nstage s on frame {\n    hook h\n    update x +1\n    write y +1\n}\n"
)
BROKEN = "cadence 1 s\nclock frame = 10 Hz\nregion x : f32[1, time] on nowhere retain last 2\n"
MIMI = loader.stdlib_path("models.mimi_decoder")


def dsl(capsys, *argv: str) -> tuple[int, str, str]:
    """`dsl ARGV` in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:  # argparse's usage errors and --version
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def feed_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A fresh current folder with a clean program (tail.clock) and one with an error (broken.clock)."""
    monkeypatch.chdir(tmp_path)
    for name in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "tail.clock").write_text(TAIL)
    (tmp_path / "broken.clock").write_text(BROKEN)
    return tmp_path


# --- version and python -m ---------------------------------------------------------------------------


def test_version_prints_the_package_version(capsys) -> None:
    assert dsl(capsys, "--version") == (0, f"duplexcadence {duplexcadence.__version__}\n", "")


@pytest.mark.slow
def test_python_m_duplexcadence_is_the_dsl_command(folder) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplexcadence", "check", "tail.clock"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "All clean: 1 file checked.\n", "")
    listing = subprocess.run(
        [sys.executable, "-m", "duplexcadence", "--help"], capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0 and listing.stdout.startswith("usage: dsl ")
    assert all(f"    {name} " in listing.stdout for name in cli.COMMAND_MODULES)


# --- standard input ----------------------------------------------------------------------------------


def test_check_reads_standard_input_named_stdin(capsys, folder, monkeypatch) -> None:
    feed_stdin(monkeypatch, BROKEN.encode())
    code, out, err = dsl(capsys, "check", "--output-format", "concise", "-")
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "<stdin>:3:28: error: unknown clock 'nowhere' [unknown-name]",
        "Found 1 error in 1 file.",
    ]
    feed_stdin(monkeypatch, TAIL.encode())
    assert dsl(capsys, "check", "-") == (0, "All clean: 1 file checked.\n", "")


def test_stdin_filename_names_standard_input_and_finds_its_imports(capsys, folder, monkeypatch) -> None:
    (folder / "lib").mkdir()
    (folder / "lib" / "clocks.clock").write_text("clock frame = 10 Hz\n")
    feed_stdin(monkeypatch, b"use clocks (frame)\ncadence 1 s\nregion x : f32[1, time] on framez retain last 2\n")
    code, out, _ = dsl(capsys, "check", "--output-format", "concise", "--stdin-filename", "lib/tail.clock", "-")
    assert code == 1 and out.splitlines()[0].startswith("lib/tail.clock:3:28: error: unknown clock 'framez'")


def test_standard_input_that_is_not_text_is_reported_like_a_file(capsys, folder, monkeypatch) -> None:
    feed_stdin(monkeypatch, b"cadence 1 s\n\xff\xfe\n")
    code, out, _ = dsl(capsys, "check", "--output-format", "concise", "-")
    assert code == 1
    assert out.splitlines()[0] == (
        "<stdin>: error: cannot read '<stdin>': it is not UTF-8 text (invalid start byte at byte 12) [unreadable-file]"
    )


def test_fmt_and_plan_read_standard_input(capsys, folder, monkeypatch) -> None:
    feed_stdin(monkeypatch, b"cadence 1 s\nparam n=3   # three\n")
    assert dsl(capsys, "fmt", "-") == (0, "cadence 1 s\n\nparam n = 3  # three\n", "")
    feed_stdin(monkeypatch, TAIL.encode())
    code, out, err = dsl(capsys, "plan", "-")
    assert (code, err) == (0, "") and out.startswith("Plan for <stdin>\n")


def test_standard_input_cannot_be_written_back_or_read_twice(capsys, folder, monkeypatch) -> None:
    feed_stdin(monkeypatch, TAIL.encode())
    assert dsl(capsys, "fmt", "--write", "-") == (
        2,
        "",
        "dsl fmt: error: --write cannot rewrite standard input\n"
        "  help: drop --write: the canonical text goes to stdout\n",
    )
    feed_stdin(monkeypatch, TAIL.encode())
    assert dsl(capsys, "check", "-", "-") == (2, "", "dsl check: error: standard input ('-') is given twice\n")


@pytest.mark.slow
def test_a_real_process_reads_standard_input_for_check_and_render(folder) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplexcadence", "check", "--output-format", "concise", "-"],
        input=BROKEN,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout.startswith("<stdin>:3:28: error: unknown clock 'nowhere'")
    drawn = subprocess.run(
        [sys.executable, "-m", "duplexcadence", "render", "-", "--output-format", "dot"],
        input=TAIL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (drawn.returncode, drawn.stderr) == (0, "") and drawn.stdout.startswith("digraph ")


# --- directories -------------------------------------------------------------------------------------


def test_a_directory_is_every_clock_file_under_it_sorted_hidden_folders_skipped(capsys, folder) -> None:
    (folder / "sub" / "deeper").mkdir(parents=True)
    (folder / "sub" / "deeper" / "b.clock").write_text(BROKEN)
    (folder / "sub" / "a.clock").write_text(TAIL)
    (folder / "sub" / "notes.txt").write_text("not a program")
    (folder / "sub" / ".hidden").mkdir()
    (folder / "sub" / ".hidden" / "c.clock").write_text("nonsense")
    code, out, _ = dsl(capsys, "check", "--output-format", "json", "sub")
    assert code == 1
    assert [entry["path"] for entry in json.loads(out)] == ["sub/a.clock", "sub/deeper/b.clock"]
    code, out, _ = dsl(capsys, "fmt", "--check", "sub")
    assert (code, out) == (1, "would reformat sub/deeper/b.clock\n")


def test_a_directory_without_clock_files_is_a_usage_error(capsys, folder) -> None:
    (folder / "empty").mkdir()
    assert dsl(capsys, "check", "empty") == (2, "", "dsl check: error: no .clock files in the directory 'empty'\n")


# --- --output-format json ----------------------------------------------------------------------------


def test_plan_output_format_json_is_the_plan_and_format_its_deprecated_spelling(capsys, folder) -> None:
    code, out, err = dsl(capsys, "plan", "tail.clock", "--output-format", "json")
    assert (code, err) == (0, "")
    plan = json.loads(out)
    assert plan["schema"] == 1 and plan["file"] == "tail.clock" and plan["trace"]["period_instants"] == 10
    assert dsl(capsys, "plan", "tail.clock", "--format", "json") == (0, out, "")
    code, _, err = dsl(capsys, "plan", "tail.clock", "--json")
    assert code == 2 and "unrecognized arguments: --json" in err


@pytest.mark.parametrize(
    "command, choices",
    [
        ("check", "{text,concise,json}"),
        ("fmt", "{text,json}"),
        ("plan", "{text,json}"),
        ("render", "{dot,svg,png,pdf}"),
        ("bench", "{text,json}"),
        ("loadgen", "{text,json}"),
    ],
)
def test_every_command_spells_its_output_format_one_way(capsys, command, choices) -> None:
    _, out, _ = dsl(capsys, command, "--help")
    flat = " ".join(out.split())
    assert f"--output-format {choices}" in flat
    had_format = command in ("check", "fmt", "plan", "render")  # the old spelling, kept where it was
    assert ("--format" in flat) == had_format
    assert ("deprecated: the old spelling of --output-format" in flat) == had_format
    if "--json" in flat:  # bench and loadgen: the old PATH option, kept
        assert "--json PATH deprecated: also write the JSON to PATH" in flat


def test_plan_errors_in_json_are_the_diagnostics_document_on_stdout(capsys, folder) -> None:
    code, out, err = dsl(capsys, "plan", "broken.clock", "--output-format", "json")
    assert (code, err) == (1, "")
    [entry] = json.loads(out)
    assert entry["path"] == "broken.clock"
    assert [(d["code"], d["span"]["line"], d["span"]["column"]) for d in entry["diagnostics"]] == [
        ("unknown-name", 3, 28)
    ]
    code, out, err = dsl(capsys, "plan", "broken.clock")  # text: the diagnostics go to stderr
    assert code == 1 and out == "" and "error[unknown-name]: unknown clock 'nowhere'" in err


def test_fmt_format_json_gives_each_file_its_change_and_canonical_text(capsys, folder) -> None:
    (folder / "messy.clock").write_text("cadence 1 s\nparam n=3\n")
    (folder / "bad.clock").write_text("param = 3\n")
    code, out, err = dsl(capsys, "fmt", "--check", "--output-format", "json", "messy.clock", "tail.clock", "bad.clock")
    assert (code, err) == (1, "")
    messy, tail, bad = json.loads(out)
    assert messy == {
        "path": "messy.clock",
        "diagnostics": [],
        "changed": True,
        "formatted": "cadence 1 s\n\nparam n = 3\n",
    }
    assert (tail["changed"], tail["formatted"]) == (False, TAIL)
    assert (bad["changed"], bad["formatted"], bad["diagnostics"][0]["code"]) == (None, None, "syntax")


def test_check_format_full_is_kept_as_text(capsys, folder) -> None:
    assert dsl(capsys, "check", "--output-format", "full", "broken.clock") == dsl(capsys, "check", "broken.clock")
    assert "{text,concise,json}" in dsl(capsys, "check", "--help")[1]


# --- -q and usage errors -----------------------------------------------------------------------------


def test_quiet_silences_what_a_command_wrote(capsys, folder) -> None:
    assert dsl(capsys, "render", "tail.clock", "-o", "tail.dot") == (0, "", "wrote tail.dot (timeline, dot)\n")
    assert dsl(capsys, "render", "tail.clock", "-o", "tail.dot", "-q") == (0, "", "")
    assert (folder / "tail.dot").read_text().startswith("digraph")


def test_quiet_prints_the_problems_and_nothing_else(capsys, folder) -> None:
    assert dsl(capsys, "check", "-q", "tail.clock") == (0, "", "")
    code, out, _ = dsl(capsys, "-q", "check", "--output-format", "concise", "broken.clock")
    assert (code, out) == (1, "broken.clock:3:28: error: unknown clock 'nowhere' [unknown-name]\n")
    (folder / "messy.clock").write_text("cadence 1 s\nparam n=3\n")
    assert dsl(capsys, "fmt", "--check", "-q", "messy.clock") == (1, "would reformat messy.clock\n", "")
    assert dsl(capsys, "fmt", "--write", "-q", "messy.clock") == (0, "", "")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["plan", "tail.clock", "--sessions", "0"], "argument --sessions: must be >= 1, not 0"),
        (["plan", "tail.clock", "--sessions", "-2"], "argument --sessions: must be >= 1, not -2"),
        (["plan", "tail.clock", "--max-graphs", "-1"], "argument --max-graphs: must be >= 0, not -1"),
        (["plan", "tail.clock", "--max-arena-bytes", "lots"], "must be an integer >= 0, not 'lots'"),
        (["plan", "tail.clock", "--output-format", "xml"], "argument --output-format: invalid choice: 'xml'"),
        (["render", "tail.clock", "--ticks", "0"], "argument --ticks: must be >= 1, not 0"),
        (["nosuch"], "invalid choice: 'nosuch'"),
    ],
)
def test_numbers_and_choices_are_validated_as_usage_errors(capsys, folder, argv, says) -> None:
    code, out, err = dsl(capsys, *argv)
    assert (code, out) == (2, "") and says in err and "Traceback" not in err


def test_a_param_that_breaks_many_dimensions_is_one_error(capsys, folder) -> None:
    for command in ("check", "plan"):
        code, out, err = dsl(capsys, command, "models.mimi_decoder", "--param", "B=0", "--output-format", "json")
        [entry] = json.loads(out)
        assert (code, err) == (1, "")
        assert [(d["code"], d["message"], d["helps"]) for d in entry["diagnostics"]] == [
            (
                "bad-shape",
                "dimension 0 of region 'codes' is 0, not a positive integer",
                [
                    "--param B=0 gives this value; every other dimension that uses 'B' has the same problem "
                    "(reported once): give a positive integer"
                ],
            )
        ]
        assert (entry["diagnostics"][0]["span"]["line"], entry["diagnostics"][0]["span"]["column"]) == (23, 20)


def test_every_usage_error_has_one_prefix(capsys, folder) -> None:
    for argv in (
        ["bench", "nosuch"],
        ["draft", "nosuch"],
        ["render", "tail.clock", "-o", "x.jpg"],
        ["serve", "toy", "--lanes", "3"],
    ):
        code, _, err = dsl(capsys, *argv)
        assert code == 2 and err.startswith(f"dsl {argv[0]}: error: "), err


def test_a_malformed_param_is_a_usage_error_on_every_command(capsys, folder) -> None:
    for command in ("check", "plan"):
        assert dsl(capsys, command, "tail.clock", "--param", "B") == (
            2,
            "",
            f"dsl {command}: error: --param 'B' is not NAME=VALUE\n"
            "  help: write e.g. --param P=200 or --param ratios=[8,6,5,4]\n",
        )


def test_the_argparse_types_refuse_what_is_out_of_range() -> None:
    assert (common.positive("3"), common.non_negative("0"), common.positive_float("0.5")) == (3, 0, 0.5)
    for parse, text, says in (
        (common.positive, "0", "must be >= 1, not 0"),
        (common.non_negative, "-1", "must be >= 0, not -1"),
        (common.non_negative, "1.5", "must be an integer >= 0, not '1.5'"),
        (common.positive_float, "0", "must be a finite number > 0, not 0"),
        (common.positive_float, "nan", "must be a finite number > 0, not nan"),
        (common.positive_float, "inf", "must be a finite number > 0, not inf"),
        (common.device_name, "gpu", "must be cpu, cuda or cuda:N, not 'gpu'"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            parse(text)
    assert [common.device_name(d) for d in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda:1"]


def test_a_cuda_device_without_cuda_is_a_usage_error_saying_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(common.UsageError) as refused:
        common.resolve_device("cuda")
    reason = "is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
    assert refused.value.message.startswith("--device cuda: ") and reason in refused.value.message
    assert refused.value.helps == (
        "run on the CPU with --device cpu, or install a CUDA build of torch on a machine with a GPU",
    )
    assert common.resolve_device(None) == "cpu" and common.resolve_device("cpu") == "cpu"


# --- colour ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "choice, environment, coloured",
    [
        ("auto", {}, False),  # captured output is not a terminal
        ("auto", {"FORCE_COLOR": "1"}, True),
        ("auto", {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        ("auto", {"FORCE_COLOR": ""}, False),
        ("never", {"FORCE_COLOR": "1"}, False),
        ("always", {"NO_COLOR": "1"}, True),
    ],
)
def test_colour_follows_the_option_then_no_color_then_force_color(
    capsys, folder, monkeypatch, choice, environment, coloured
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    _, check_out, _ = dsl(capsys, "check", "--color", choice, "broken.clock")
    _, plan_out, _ = dsl(capsys, "plan", "--color", choice, "tail.clock")
    _, _, plan_err = dsl(capsys, "plan", "--color", choice, "broken.clock")
    _, _, fmt_err = dsl(capsys, "fmt", "--color", choice, "broken.clock", "-q")
    assert ("\x1b[1;31merror" in check_out) is coloured
    assert plan_out.startswith("\x1b[1mPlan for tail.clock\x1b[0m\n") is coloured
    assert ("\x1b[1;31merror" in plan_err) is coloured
    assert ("\x1b[" in fmt_err) is False  # fmt's input parses: nothing on stderr
    assert dsl(capsys, "--color", choice, "check", "broken.clock")[1] == check_out  # before the command too


# --- stdlib modules by name --------------------------------------------------------------------------


def test_a_stdlib_module_is_named_from_any_folder(capsys, folder) -> None:
    code, out, err = dsl(capsys, "plan", "models.mimi_decoder")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"Plan for {MIMI}"
    assert dsl(capsys, "check", "models.mimi_decoder", "std.audio") == (0, "All clean: 2 files checked.\n", "")


def test_a_module_beside_the_current_folder_comes_first_as_use_finds_it(capsys, folder) -> None:
    (folder / "models").mkdir()
    (folder / "models" / "mimi_decoder.clock").write_text(TAIL)
    assert dsl(capsys, "plan", "models.mimi_decoder")[1].splitlines()[0] == "Plan for models/mimi_decoder.clock"


def test_a_module_name_that_names_nothing_says_what_there_is(capsys, folder) -> None:
    code, out, _ = dsl(capsys, "check", "models.mimi_decodr")
    assert code == 1
    assert out.splitlines()[:3] == [
        "error[unreadable-file]: cannot read 'models.mimi_decodr': no such file, nor a module of that name here "
        "or in the stdlib",
        " --> models.mimi_decodr",
        "  = help: did you mean 'models.mimi_decoder' or 'models.personaplex_mimi_decoder' or "
        "'models.minicpmo45_duplex'?",
    ]


# --- missing packages and a start without torch -----------------------------------------------------


def test_a_missing_optional_package_names_its_extra() -> None:
    def missing(name: str) -> ModuleNotFoundError:
        return ModuleNotFoundError(f"No module named '{name}'", name=name)

    hint = common.missing_package(missing("transformers"), what="the qwen3omni tail")
    assert hint.message == "the qwen3omni tail needs the package 'transformers', which is not installed"
    assert hint.helps == ('pip install "duplexcadence[qwen3omni]"',)
    assert common.missing_package(missing("moshi.models")).helps == (
        'pip install "duplexcadence[moshi]" && pip install --no-deps moshi==0.2.13 (its own pins would move '
        "torch; see scripts/model-pins.txt)",
    )
    assert common.install_hint("stepaudio2") == (
        'pip install "duplexcadence[minicpmo45]" && pip install --no-deps stepaudio2-minicpmo==0.1.1 (its own '
        "pins would move torch; see scripts/model-pins.txt)"
    )
    assert common.install_hint("ray") == 'pip install "duplexcadence[ray]"'  # not the one-host server's extra
    assert common.install_hint("uvicorn") == 'pip install "duplexcadence[serve]"'
    assert common.install_hint("torch") == "pip install torch (a dependency of duplexcadence)"
    assert common.install_hint("einops", extra="moshi").startswith('pip install "duplexcadence[moshi]"')


NO_TORCH = """\
import sys


class NoTorch:
    '''As on a machine without torch: importing it fails.'''

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTorch())
"""


@pytest.fixture
def without_torch(folder) -> dict[str, str]:
    """The environment of a child process that cannot import torch."""
    (folder / "blocker").mkdir()
    (folder / "blocker" / "sitecustomize.py").write_text(NO_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder / "blocker"), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and "No module named 'torch'" in probe.stderr
    return env


@pytest.mark.parametrize(
    "argv, code, starts",
    [
        (["--help"], 0, "usage: dsl "),
        (["--version"], 0, "duplexcadence "),
        (["check", "--help"], 0, "usage: dsl check "),
        (["fmt", "--help"], 0, "usage: dsl fmt "),
        (["plan", "--help"], 0, "usage: dsl plan "),
        (["render", "--help"], 0, "usage: dsl render "),
        (["check", "tail.clock", "models.mimi_decoder"], 0, "All clean: 2 files checked."),
        (["fmt", "tail.clock"], 0, "cadence 1 s"),
        (["plan", "tail.clock"], 0, "Plan for tail.clock"),
        (["plan", "models.mimi_decoder", "--output-format", "json"], 0, "{"),
        (["render", "tail.clock", "--output-format", "dot"], 0, "digraph"),
        (["render", "tail.clock", "--view", "graph", "--output-format", "dot"], 0, "digraph"),
        (["render", "tail.clock", "--view", "arena", "--output-format", "dot"], 0, "digraph"),
        (["render", "--list-views"], 0, "timeline  "),
        (["check", "broken.clock", "--output-format", "concise"], 1, "broken.clock:3:28: error"),
    ],
)
def test_help_and_the_language_commands_start_without_torch(without_torch, argv, code, starts) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplexcadence", *argv], env=without_torch, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (code, ""), done.stderr
    assert done.stdout.startswith(starts), done.stdout[:300]


@pytest.mark.parametrize("argv", [["bench", "toy"], ["bench", "--device", "cuda", "toy"]])
def test_a_command_that_needs_torch_says_so_without_a_traceback(without_torch, argv) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "duplexcadence", *argv], env=without_torch, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "dsl bench: error: dsl bench needs the package 'torch', which is not installed\n"
        "  help: pip install torch (a dependency of duplexcadence)\n"
    )
