"""The docs cannot rot: every python block in them runs, and every API name they mention exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = [
    "README.md",  # the quickstart, on the toy tail
    "docs/runtime.md",
    "docs/bench.md",
    pytest.param("docs/engine.md", marks=pytest.mark.slow),  # MiniCPM-o 4.5's engine at the reduced sizes
]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", RUNNABLE)
@pytest.mark.slow
def test_python_blocks_run(doc, monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python block"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"{doc}:python", "exec"), namespace)


def test_runtime_api_names_exist():
    from duplexcadence.interpreter.runtime.reports import RuntimeReport
    from duplexcadence.interpreter.runtime.runtime import Runtime
    from duplexcadence.interpreter.runtime.session import Session
    from duplexcadence.interpreter.runtime.verify import VerifyReport

    text = (ROOT / "docs/runtime.md").read_text()
    owners = {"runtime": Runtime, "Runtime": Runtime, "session": Session, "report": VerifyReport}
    mentioned = set(re.findall(r"`(runtime|Runtime|session)\.([a-z_]+)", text))
    assert mentioned, "the doc names no API"
    for owner, name in mentioned:
        assert hasattr(owners[owner], name), f"docs/runtime.md mentions {owner}.{name}, which does not exist"
    for field in ("graphs_captured", "capture_seconds", "replays", "eager_planned", "eager_off_plan", "blocked"):
        assert field in RuntimeReport.__annotations__
