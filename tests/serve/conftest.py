"""Helpers the server tests share, as fixtures (the tests are not importable modules)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

COMPARE_ALONE = (
    "import sys, torch\n"
    "from duplexcadence.interpreter.serve.loadgen import compare_with_stock\n"
    "from duplexcadence.interpreter.serve.tail import served_tail\n"
    "toy = served_tail('toy')\n"
    "print([compare_with_stock(toy, load) for load in torch.load(sys.argv[1], weights_only=False)])\n"
)


@pytest.fixture
def toy_stock_alone(tmp_path) -> Callable[[list], list[tuple[int, int]]]:
    """`compare_with_stock` of each of the toy's session loads, in a process of its own: the toy's stock draws
    its noise from torch's global generator, which any other thread of a long test process that draws too
    would move. Each load gives (ticks compared, ticks not equal)."""

    def compare(loads) -> list[tuple[int, int]]:
        import torch

        path = tmp_path / "loads.pt"
        torch.save(list(loads), path)
        done = subprocess.run(
            [sys.executable, "-c", COMPARE_ALONE, str(path)], capture_output=True, text=True, timeout=300, check=True
        )
        return ast.literal_eval(done.stdout.strip().splitlines()[-1])

    return compare


def metric_value(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


@pytest.fixture
def metric() -> Callable[[str, str], float]:
    """`metric(text, name)`: the value of the series `name` (no labels) in a `/metrics` text."""
    return metric_value
