"""Shared pytest configuration.

* GPU tests are skipped cleanly where CUDA is absent.
* Tests marked `own_process` (those that start a Ray cluster) run in a child pytest, one per module, and
  their results are reported here, test by test. Ray does not survive being started and shut down
  several times in one process (ray-project/ray#31145: its background threads keep pointers into the
  core worker that `ray.shutdown()` frees), so the suite's own process never starts it.
* `dsl`: the `dsl` command run in the test's process -> (exit code, stdout, stderr).
* `counting_backend`: a `torch.compile` backend that counts the calls of what it compiled.
* Hypothesis explores new examples on every run; with `HYPOTHESIS_PROFILE=ci` (set by `.ci/run`) it draws the
  same examples every time, so a landing run passes or fails on the code alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch

if os.environ.get("HYPOTHESIS_PROFILE"):  # `ci`: Hypothesis's own profile, derandomized
    from hypothesis import settings

    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])

CHILD_ENV = "DUPLEXCADENCE_TEST_CHILD"
CHILD_TIMEOUT_S = 1800
OUTPUT_TAIL_CHARS = 6000


def pytest_configure(config):
    config.addinivalue_line("markers", "own_process: runs in a child pytest of its own (tests that start Ray)")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (on a machine with one: pytest -m gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if not os.environ.get(CHILD_ENV):
        by_module: dict[Path, list[pytest.Item]] = {}
        for item in items:
            if item.get_closest_marker("own_process") is not None:
                by_module.setdefault(item.path, []).append(item)
        config.stash[CHILD_RUNS] = {path: ChildRun(selected) for path, selected in by_module.items()}


class ChildRun:
    """The selected tests of one module, run once in a child pytest when the first of them comes up."""

    def __init__(self, items: list[pytest.Item]) -> None:
        self.items = items
        self.outcomes: dict[tuple[str, str], tuple[str, str]] | None = None
        self.output = ""
        self.returncode: int | None = None

    def outcome(self, item: pytest.Item) -> tuple[str, str]:
        if self.outcomes is None:
            self.run(item.config)
        assert self.outcomes is not None
        found = self.outcomes.get(junit_key(item.nodeid))
        if found is not None:
            if self.returncode not in (0, 1, 5) and item is self.items[-1]:
                item.warn(pytest.PytestWarning(f"the child pytest exited with {self.returncode}:\n{self.output}"))
            return found
        return "failed", f"the child pytest reported nothing for this test (exit {self.returncode}):\n{self.output}"

    def run(self, config: pytest.Config) -> None:
        with tempfile.TemporaryDirectory() as folder:
            xml = Path(folder) / "results.xml"
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
            command += [item.nodeid for item in self.items]
            env = dict(os.environ, **{CHILD_ENV: "1"})
            try:
                done = subprocess.run(
                    command,
                    cwd=config.rootpath,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=CHILD_TIMEOUT_S,
                )
                self.returncode = done.returncode
                self.output = (done.stdout + done.stderr)[-OUTPUT_TAIL_CHARS:]
            except subprocess.TimeoutExpired as expired:
                self.output = f"the child pytest ran past {CHILD_TIMEOUT_S} s: {expired}"
            self.outcomes = junit_outcomes(xml) if xml.exists() else {}


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) under which pytest's junitxml writes the test `nodeid`."""
    *path_and_classes, name = nodeid.split("::")
    path_and_classes[0] = re.sub(r"\.py$", "", path_and_classes[0].replace("/", "."))
    return ".".join(path_and_classes), name


def junit_outcomes(xml: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """{(classname, name): (outcome, text)} from a JUnit XML file pytest wrote."""
    outcomes: dict[tuple[str, str], tuple[str, str]] = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for tag, kind in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome = kind
                text = element.get("message", "") if kind == "skipped" else (element.text or element.get("message", ""))
                break
        outcomes[case.get("classname", ""), case.get("name", "")] = (outcome, text)
    return outcomes


CHILD_RUNS = pytest.StashKey[dict[Path, ChildRun]]()


def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if os.environ.get(CHILD_ENV) or item.get_closest_marker("own_process") is None:
        return None
    child = item.config.stash[CHILD_RUNS][item.path]
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    outcome, text = child.outcome(item)
    longrepr: object = None
    if outcome == "failed":
        longrepr = f"in a child pytest (own_process):\n{text}"
    elif outcome == "skipped":
        reason = re.sub(r"^Skipped: ", "", text) or "skipped in the child pytest"
        longrepr = (str(item.path), item.location[1] or 0, reason)
    report = pytest.TestReport(
        item.nodeid, item.location, dict.fromkeys(item.keywords, 1), outcome, longrepr, "call", sections=[]
    )
    item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.fixture
def counting_backend():
    """(backend, calls): a `torch.compile` backend whose compiled code appends 1 to `calls` each time it runs;
    dynamo's caches are reset before and after."""
    torch._dynamo.reset()
    calls: list[int] = []

    def backend(graph, example_inputs):
        def run(*args):
            calls.append(1)
            return graph(*args)

        return run

    yield backend, calls
    torch._dynamo.reset()


@pytest.fixture
def dsl(capsys):
    """`dsl(*argv)` -> (exit code, stdout, stderr): `dsl` run in this process, its output taken from capsys."""
    from duplexcadence.interpreter.cli import main as cli

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = cli.main(list(argv))
        except SystemExit as stop:
            code = stop.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
