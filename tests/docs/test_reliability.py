"""docs/reliability.md cannot go stale: it is run from top to bottom in a fresh folder, every diagnostic
code of dsl/messages.py has its section with an example whose real output is shown, and every
exception the runtime defines is documented.

The page uses the block rules of docs/tutorial.md (tests/docs/test_tutorial.py, whose helpers this
reuses): ``clock file=NAME`` writes NAME; ``console`` runs each ``$ dsl ...`` line (in this process,
through `duplexcadence.interpreter.cli.main.main`: stdout and stderr together) and the lines below it are its
output; ``python`` runs in one namespace; ``text output`` right after it is what it prints.

When an output changes on purpose: ``python tests/docs/test_reliability.py --update`` writes the
outputs the page's commands print now into it; review the diff.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import pkgutil
import re
import shlex
import sys
from pathlib import Path

import pytest

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError, InternalError
from duplexcadence.interpreter import runtime as runtime_package
from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PAGE = ROOT / "docs" / "reliability.md"
_spec = importlib.util.spec_from_file_location("tutorial_runner", HERE / "test_tutorial.py")
tutorial = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tutorial)


def run_dsl(command: str) -> str:
    """`dsl ARGS` in this process: what a terminal shows (stdout and stderr, in order)."""
    words = shlex.split(command)
    assert words[0] == "dsl", f"the page may only run dsl commands, not {command!r}"
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        cli.main(words[1:])
    return output.getvalue()


def run_page(markdown: str, folder: Path) -> list[tuple[tutorial.Block, str]]:
    """Run the page in `folder`; (output block, what its command or python block printed) in order."""
    written: set[str] = set()
    namespace: dict = {"__name__": "reliability"}
    printed: list[tuple[tutorial.Block, str]] = []
    previous, previous_stdout = None, ""
    for block in tutorial.blocks(markdown):
        if block.language == "console":
            actual = "".join(run_dsl(command) for command, _ in tutorial.console_commands(block.text))
            printed.append((block, actual))
        elif block.language == "python":
            assert not block.options, f"reliability.md:{block.line}: a python block with options"
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                exec(compile(block.text, f"docs/reliability.md:{block.line}", "exec"), namespace)
            previous_stdout = stdout.getvalue()
        elif block.language == "text" and "output" in block.flags:
            assert previous is not None and previous.language == "python", (
                f"reliability.md:{block.line}: an output block must follow a python block"
            )
            printed.append((block, previous_stdout))
        elif block.language == "clock":
            assert "file" in block.options, f"reliability.md:{block.line}: a clock block without file="
            tutorial.write_files(block, folder, written)
        else:
            assert block.language not in tutorial.RUN_LANGUAGES, (
                f"reliability.md:{block.line}: a {block.language} block the test would not run"
            )
        previous = block
    return printed


def shown(block: tutorial.Block) -> str:
    """What the page shows a block printing (a console block: the lines after its `$` lines)."""
    if block.language == "console":
        return "\n".join(expected for _, expected in tutorial.console_commands(block.text) if expected)
    return block.text


@pytest.fixture
def page_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NO_COLOR", "1")
    return tmp_path


@pytest.mark.slow
def test_the_page_runs_and_prints_what_it_shows(page_folder):
    markdown = PAGE.read_text()
    for block, actual in run_page(markdown, page_folder):
        if not tutorial.output_matches(shown(block), actual):
            pytest.fail(
                tutorial.explain("this block", block, shown(block), actual).replace(
                    "docs/tutorial.md", "docs/reliability.md"
                ),
                pytrace=False,
            )


def sections(markdown: str) -> dict[str, str]:
    """The text under each `### `name`` heading, up to the next heading."""
    parts = re.split(r"^### `([^`]+)`.*$", markdown, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_diagnostic_code_has_an_example_that_prints_it():
    found = sections(PAGE.read_text())
    for code in messages.ALL_CODES:
        assert code.name in found, f"docs/reliability.md has no section ### `{code.name}`"
        outputs = "\n".join(
            shown(b)
            for b in tutorial.blocks(found[code.name])
            if b.language == "console" or (b.language == "text" and "output" in b.flags)
        )
        kind = "warning" if code.severity is messages.Severity.WARNING else "error"
        printed = (
            f"{kind}[{code.name}]" in outputs
            or f"[{code.name}]" in outputs
            or (code is messages.CAPTURE_BLOCKED and "cannot be captured" in outputs)
        )
        assert printed, f"the example of `{code.name}` does not show it"
        assert "Fix:" in found[code.name], f"the section of `{code.name}` gives no fix"


def test_every_runtime_exception_is_documented():
    modules = [
        importlib.import_module(found.name)
        for found in pkgutil.walk_packages(runtime_package.__path__, f"{runtime_package.__name__}.")
    ]
    defined = {
        name
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__
    }
    # binding.py's own: bind_program and bind_objects report them as located diagnostics (binding-mismatch,
    # unsafe-path)
    defined -= {"PathError", "PathLeavesModel", "StageCallFailed"}
    assert defined == {"StepError", "SessionFailed", "SessionsFailed", "CaptureWarning", "LockstepError"}
    found = sections(PAGE.read_text())
    for name in defined | {ClockError.__name__, InternalError.__name__, "RuntimeError"}:
        assert name in found, f"docs/reliability.md has no section ### `{name}`"


def test_the_page_is_linked_from_the_readme_and_the_architecture():
    assert "(docs/reliability.md)" in (ROOT / "README.md").read_text()
    assert "(reliability.md)" in (ROOT / "docs" / "architecture.md").read_text()


def update(folder: Path) -> None:
    """Write what the page's blocks print now into the page (its `--update` mode)."""
    markdown = PAGE.read_text()
    for block, actual in reversed(run_page(markdown, folder)):
        if block.language == "console":
            lines = []
            for command, _ in tutorial.console_commands(block.text):
                lines += [f"$ {command}", *run_dsl(command).rstrip("\n").split("\n")]
            text = "\n".join(lines) + "\n"
        else:
            text = actual if actual.endswith("\n") or not actual else actual + "\n"
        head = markdown[block.start :].index("\n") + 1
        markdown = markdown[: block.start + head] + text + markdown[block.end - 3 :]
    PAGE.write_text(markdown)


if __name__ == "__main__":
    import os
    import tempfile

    assert sys.argv[1:] == ["--update"], "usage: python tests/docs/test_reliability.py --update"
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        os.environ["NO_COLOR"] = "1"
        update(Path(folder))
