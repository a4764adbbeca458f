"""`dsl bench` at the conventions of the other commands: a device this machine does not have, a number out of
range and a malformed `--option` are usage errors (exit 2, what is wrong and what would be legal), never an
internal error; `--output-format json` prints the run with its environment on stdout, and the deprecated
`--json PATH` still writes it (saying so on stderr, unless `-q`)."""

from __future__ import annotations

import json

import pytest

from duplexcadence.interpreter.cli import main as cli

torch = pytest.importorskip("torch")


def dsl(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:  # argparse's usage errors
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--device", "gpu"], "dsl bench: error: argument --device: must be cpu, cuda or cuda:N, not 'gpu'"),
        (["--seconds", "0"], "dsl bench: error: argument --seconds: must be >= 1, not 0"),
        (["--seconds", "ten"], "dsl bench: error: argument --seconds: must be an integer >= 1, not 'ten'"),
        (["--batch", "-1"], "dsl bench: error: argument --batch: must be >= 1, not -1"),
        (["--compile-budget", "0"], "dsl bench: error: argument --compile-budget: must be a finite number > 0, not 0"),
        (["--option", "steps"], "dsl bench: error: --option 'steps' is not KEY=VALUE\n  help: e.g. --option steps=5"),
    ],
)
def test_bad_options_are_usage_errors(capsys, argv, says):
    code, out, err = dsl(capsys, "bench", "toy", *argv)
    assert (code, out) == (2, "")
    assert says in err
    assert "internal error" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_usage_error(capsys):
    code, out, err = dsl(capsys, "bench", "toy", "--device", "cuda", "--seconds", "1")
    assert (code, out) == (2, "")
    reason = "is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
    assert err.startswith("dsl bench: error: --device cuda: ") and reason in err
    assert "help: run on the CPU with --device cpu" in err


def test_output_format_json_prints_the_run_and_its_environment(capsys, tmp_path):
    torch.set_num_threads(1)
    path = tmp_path / "toy.json"
    argv = ("bench", "toy", "--device", "cpu", "--seconds", "1", "--no-progress", "--output-format", "json")
    code, out, err = dsl(capsys, *argv, "--json", str(path), "-q")
    assert (code, err) == (0, "")
    run = json.loads(out)
    assert json.loads(path.read_text()) == run  # the deprecated --json PATH writes the same document
    assert (run["model"], run["device"], run["torch"], run["gpu"], run["driver"]) == (
        "toy",
        "cpu",
        torch.__version__,
        None,
        None,
    )
    assert [v["name"] for v in run["variants"]] == ["stock eager", "duplexcadence"]
    assert all(v["bit_identical"] for v in run["variants"])
    assert all(len(v["per_second_ms"]) == 1 for v in run["variants"])
