"""docs/tutorial.md cannot go stale: it is run from top to bottom in a fresh folder, and every output it
shows is what the code prints.

How the tutorial's fenced blocks are read (the info string after the opening backticks):

* ``LANG file=NAME``: the block is written to NAME; a later block with the same name is appended
  (after one blank line, two for Python);
* ``diff file=NAME``: applied to NAME: the ``-`` lines, found once and in a row, become the ``+`` lines;
* ``clock same=NAME``: NAME, as the blocks before built it, must be exactly this text;
* ``console``: each ``$ `` line is run by bash in the folder (stdout and stderr together, as a terminal
  shows them); the lines up to the next ``$ `` are its expected output;
* ``python``: run in order, in one namespace, in the folder;
* ``text output`` right after a ``python`` block: that block's expected standard output (a block
  that prints must have one).

Outputs are compared line by line, trailing spaces and leading or trailing blank lines ignored (a
progress bar leaves a blank line where there is no terminal). A line ``...`` stands for any number of
lines. The flag ``timing`` marks measurements: every number matches any number, and runs of spaces
(or of a table rule's dashes) match runs of any length. ``needs=dot`` runs a block only where Graphviz's ``dot`` is installed.
Any other python, clock, console, diff or bash block is an error: every code block must be run.

``dsl`` is this Python's ``python -m duplexcadence.interpreter.cli.main`` (a shim first on PATH), so the commands
test this checkout. Torch runs with one thread: on the shared 2-core CI machine, the default two
threads make each of the tutorial's tiny ops spin for milliseconds, and one thread keeps the whole
test near 15 s.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import attrs
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
TIMELINE_GOLDEN = Path(__file__).with_name("golden") / "tinyvoc-timeline.dot"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
RUN_LANGUAGES = {"python", "clock", "console", "diff", "bash"}
MODULES = ("tinyvoc", "tinyvoc_draft", "tinyvoc_cadence", "tinyvoc_bench", "hf_decoder_draft")


@attrs.frozen
class Block:
    """One fenced block: its language, its `key=value` options and bare flags, its text, where it is."""

    language: str
    options: dict
    flags: frozenset
    text: str
    line: int
    start: int
    end: int


def blocks(markdown: str) -> list[Block]:
    found = []
    for match in FENCE.finditer(markdown):
        words = match.group(1).split()
        language = words[0] if words else ""
        options = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        flags = frozenset(word for word in words[1:] if "=" not in word)
        line = markdown.count("\n", 0, match.start()) + 1
        found.append(Block(language, options, flags, match.group(2), line, match.start(), match.end()))
    return found


def normalise(line: str, timing: bool) -> str:
    line = line.rstrip()
    if timing:
        line = re.sub(r"\d+(\.\d+)?", "N", line)
        line = re.sub(r"-{2,}", "--", line)  # a table's rules follow its column widths
        line = re.sub(r"\s+", " ", line)
    return line


def output_matches(expected: str, actual: str, timing: bool = False) -> bool:
    """Whether `actual` is `expected`, where a `...` line of `expected` stands for any lines."""
    want = [normalise(line, timing) for line in expected.strip("\n").split("\n")]
    have = [normalise(line, timing) for line in actual.strip("\n").split("\n")]
    if want == [""]:
        want = []
    if have == [""]:
        have = []

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(have)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(have) + 1))
        return j < len(have) and want[i] == have[j] and match(i + 1, j + 1)

    return match(0, 0)


def explain(what: str, block: Block, expected: str, actual: str) -> str:
    diff = "\n".join(
        difflib.unified_diff(
            expected.rstrip("\n").split("\n"), actual.rstrip("\n").split("\n"), "tutorial", "actual", lineterm=""
        )
    )
    return f"docs/tutorial.md:{block.line}: {what} printed something else than the tutorial shows:\n{diff}"


def apply_diff(text: str, diff: str, block: Block) -> str:
    old = [line[1:] for line in diff.rstrip("\n").split("\n") if line.startswith("-")]
    new = [line[1:] for line in diff.rstrip("\n").split("\n") if line.startswith("+")]
    lines = text.split("\n")
    places = [i for i in range(len(lines)) if lines[i : i + len(old)] == old]
    assert len(places) == 1, f"docs/tutorial.md:{block.line}: the '-' lines occur {len(places)} times, not once"
    at = places[0]
    return "\n".join(lines[:at] + new + lines[at + len(old) :])


def console_commands(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            assert pairs, f"console output before any command: {line!r}"
            pairs[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in pairs]


def dsl_shim(folder: Path) -> Path:
    """A `dsl` command that runs this Python's DuplexCadence."""
    shim = folder / "dsl"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m duplexcadence.interpreter.cli.main "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def write_files(block: Block, workdir: Path, written: set[str]) -> None:
    """Apply a block that writes, patches or checks a file (no-op for other blocks)."""
    if "file" in block.options and block.language != "diff":
        path = workdir / block.options["file"]
        if block.options["file"] in written:
            gap = "\n\n" if block.language == "python" else "\n"
            path.write_text(path.read_text() + gap + block.text)
        else:
            path.write_text(block.text)
            written.add(block.options["file"])
    elif block.language == "diff":
        path = workdir / block.options["file"]
        path.write_text(apply_diff(path.read_text(), block.text, block))
    elif "same" in block.options:
        text = (workdir / block.options["same"]).read_text()
        if text != block.text:
            pytest.fail(explain(f"the file {block.options['same']}", block, block.text, text), pytrace=False)


@pytest.fixture
def tutorial_folder(tmp_path, monkeypatch):
    """A fresh folder, importable, with `dsl` on PATH and torch on one thread; the tutorial's modules
    are forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    bin_dir = dsl_shim(_bin_dir(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for name in MODULES:
        sys.modules.pop(name, None)
    yield tmp_path
    torch.set_num_threads(threads)
    for name in MODULES:
        sys.modules.pop(name, None)


def _bin_dir(workdir: Path) -> Path:
    folder = workdir / ".bin"
    folder.mkdir()
    return folder


def test_every_code_block_is_run():
    """No code block escapes the test: each has a role the runner knows."""
    for block in blocks(TUTORIAL.read_text()):
        if block.language not in RUN_LANGUAGES:
            continue
        known = (
            (block.language in ("python", "console") and not block.options)
            or "file" in block.options
            or "same" in block.options
            or (block.language == "console" and set(block.options) <= {"needs"})
        )
        assert known, f"docs/tutorial.md:{block.line}: a {block.language} block the test would not run"
        assert block.language != "bash", f"docs/tutorial.md:{block.line}: write shell commands as `console`"


@pytest.mark.slow
def test_the_tutorial_runs_and_prints_what_it_shows(tutorial_folder):
    markdown = TUTORIAL.read_text()
    workdir = tutorial_folder
    written: set[str] = set()
    namespace: dict = {"__name__": "tutorial"}
    previous: Block | None = None
    previous_stdout = ""
    for block in blocks(markdown):
        unshown = (
            previous is not None
            and previous.language == "python"
            and not previous.options
            and previous_stdout
            and not (block.language == "text" and "output" in block.flags)
        )
        assert not unshown, f"docs/tutorial.md:{previous.line}: the block prints, so show its output after it"
        if block.language == "text" and "output" in block.flags:
            assert (
                previous is not None
                and previous.language == "python"
                and not previous.options
                and not markdown[previous.end : block.start].strip()
            ), f"docs/tutorial.md:{block.line}: an output block must follow a python block directly"
            if not output_matches(block.text, previous_stdout, "timing" in block.flags):
                pytest.fail(explain("the python block before", block, block.text, previous_stdout), pytrace=False)
        elif block.options.get("needs") == "dot" and shutil.which("dot") is None:
            pass  # SVG needs Graphviz's dot; CI installs it (scripts/install.sh)
        elif block.language == "console":
            for command, expected in console_commands(block.text):
                result = subprocess.run(
                    ["bash", "-c", command],
                    cwd=workdir,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=300,
                )
                if not output_matches(expected, result.stdout, "timing" in block.flags):
                    pytest.fail(
                        explain(f"`{command}` (exit {result.returncode})", block, expected, result.stdout),
                        pytrace=False,
                    )
        elif block.language == "python" and not block.options:
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                exec(compile(block.text, f"docs/tutorial.md:{block.line}", "exec"), namespace)
            previous_stdout = stdout.getvalue()
        else:
            write_files(block, workdir, written)
        previous = block
    assert not (previous.language == "python" and previous_stdout), "the last block prints: show its output"
    assert {"tinyvoc.py", "tinyvoc.clock", "tinyvoc_cadence.py", "tinyvoc_bench.py"} <= written
    timeline = (workdir / "tinyvoc-timeline.dot").read_text()
    assert timeline == TIMELINE_GOLDEN.read_text(), (
        "the tutorial's timeline changed: review it, then copy tinyvoc-timeline.dot to "
        f"{TIMELINE_GOLDEN.relative_to(ROOT)} and redraw docs/diagrams/tinyvoc-timeline.svg "
        "(bash scripts/render_diagrams.sh)"
    )


def test_the_capture_warning_shown_is_the_runtimes_wording():
    """The capture-blocked warning cannot be produced on a CPU; what it counts can (a CPU constant copied to
    the `meta` device stands for one copied to the GPU), and its wording comes from the runtime, checked
    here; the GPU test below checks the whole line."""
    from duplexcadence.interpreter.runtime.capture.obstacles import diagnostics_of, find_obstacles

    found = find_obstacles(lambda: torch.tensor(0.5).to("meta"), "meta")  # LoudHead's constant, each call
    [copy] = diagnostics_of("speak", [o for o in found if o.operation.startswith("copies host")], None)
    line = f"CaptureWarning: stage 'speak' cannot be captured: {copy.message.split(': ', 1)[1]}; it runs eagerly"
    assert line in TUTORIAL.read_text().split("\n")


def test_output_matching_rules():
    assert output_matches("a\n...\nd", "a\nb\nc\nd")
    assert output_matches("a\n...", "a")
    assert not output_matches("a\n...\nd", "a\nb\nc")
    assert not output_matches("a\nb", "a\nb\nc")
    assert output_matches("stock: 4.1 ms  x", "stock: 12.25 ms x", timing=True)
    assert not output_matches("stock: 4.1 ms", "stock: 4.1 s", timing=True)
    assert not output_matches("stock: 4.1 ms", "stock: 4.2 ms")
    assert output_matches("  ---  ---\n  4.1  4.2", "  ----  ---\n  14.1  4.2", timing=True)


def extract(folder: Path) -> None:
    """Write the tutorial's files into `folder` as the reader ends up with them."""
    written: set[str] = set()
    for block in blocks(TUTORIAL.read_text()):
        if "file" in block.options or "same" in block.options:
            write_files(block, folder, written)


@pytest.mark.gpu
def test_the_tutorial_model_on_the_gpu_replays_graphs_bit_identically(tmp_path, monkeypatch):
    """On CUDA: all 11 planned stage graphs are captured and the outputs equal stock eager's; a head
    that copies a CPU constant every call is blocked from capture with the warning the tutorial shows,
    and still matches; the fix (a buffer) is captured."""
    from duplexcadence.interpreter.runtime.errors import CaptureWarning
    from duplexcadence.interpreter.runtime.runtime import Runtime

    extract(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in MODULES:
        sys.modules.pop(name, None)
    import tinyvoc
    import tinyvoc_cadence

    codes = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(0)).cuda()
    feed = lambda t: {"codes": codes[:, t : t + 1]}  # noqa: E731
    runtime = tinyvoc_cadence.load_runtime(tinyvoc.build_model(device="cuda"), device="cuda")
    report = runtime.verify(tinyvoc.StockStream(tinyvoc.build_model(device="cuda")), feed, ticks=60)
    assert report.equal, str(report)
    assert runtime.report().stage_graphs_covered == 11 and not runtime.report().blocked
    assert report.runtime_counters.replays > 0 and report.runtime_counters.eager_planned == 0

    heads_block = next(b for b in blocks(TUTORIAL.read_text()) if "class LoudHead(" in b.text)
    heads: dict = {"torch": torch, "model": tinyvoc.build_model()}
    exec(compile(heads_block.text, "docs/tutorial.md", "exec"), heads)
    shown = next(line for line in TUTORIAL.read_text().split("\n") if line.startswith("CaptureWarning: "))
    for head, blocked in ((heads["LoudHead"], True), (heads["LoudHeadOnDevice"], False)):
        model, stock_model = tinyvoc.build_model(device="cuda"), tinyvoc.build_model(device="cuda")
        model.head, stock_model.head = head(model.head, 0.5).cuda(), head(stock_model.head, 0.5).cuda()
        # the .clock file's own params are the model's defaults; load_runtime would look inside the head
        runtime = Runtime.load(tinyvoc_cadence.CLOCK, model, hooks=tinyvoc_cadence.HOOKS, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runtime.session().close()
        found = [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, CaptureWarning)]
        assert found == ([shown] if blocked else []), found
        report = runtime.verify(tinyvoc.StockStream(stock_model), feed, ticks=40)
        assert report.equal, str(report)
    for name in MODULES:
        sys.modules.pop(name, None)


if __name__ == "__main__":  # python tests/docs/test_tutorial.py FOLDER: the tutorial's files, for scripts
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    extract(target)
