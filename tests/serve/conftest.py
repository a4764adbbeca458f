"""Helpers the server tests share, as fixtures (the tests are not importable modules)."""

from __future__ import annotations

import ast
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import pytest

COMPARE_ALONE = (
    "import sys, torch\n"
    "from duplexcadence.interpreter.serve.loadgen import compare_with_stock\n"
    "from duplexcadence.interpreter.serve.tail import served_tail\n"
    "toy = served_tail('toy')\n"
    "print([compare_with_stock(toy, load) for load in torch.load(sys.argv[1], weights_only=False)])\n"
)


@pytest.fixture(scope="module")
def toy_server(request):
    """The toy tail behind the websocket server (uvicorn on 127.0.0.1, a free port, started here), its pool
    configured by the test module's `TOY_POOL` (a `PoolConfig`)."""
    from duplexcadence.interpreter.serve.app import make_app
    from duplexcadence.interpreter.serve.pool import SessionPool
    from duplexcadence.interpreter.serve.server import ServerThread
    from duplexcadence.interpreter.serve.tail import served_tail

    pool = SessionPool(served_tail("toy"), request.module.TOY_POOL)
    with ServerThread(make_app(pool)) as running:
        yield running


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


class ServeProcess:
    """`python -m duplexcadence serve ARGV` in a process of its own, read until its `serving_on` line (whose
    groups are the URL and the port): then `url`, `port`, and `pids` (index -> pid of each line `child` matches)."""

    def __init__(self, argv: list[str], serving_on: re.Pattern, child: re.Pattern, env: dict | None = None):
        command = [sys.executable, "-m", "duplexcadence", "serve", *argv]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        assert self.process.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            found = serving_on.search(line)
            if found:
                self.url, self.port = found.group(1), int(found.group(2))
                self.pids = {int(index): int(pid) for index, pid in child.findall("".join(self.lines))}
                return
        self.process.kill()
        raise AssertionError(f"the server did not serve:\n{''.join(self.lines)}")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as response:
            return response.read().decode()

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        assert self.process.stderr is not None
        rest = self.process.stderr.read()
        return self.process.wait(timeout), "".join(self.lines) + rest

    def stop(self) -> None:
        """SIGINT, and wait for it to end (killed only if it does not)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


@pytest.fixture(scope="session")
def serve_process() -> type[ServeProcess]:
    """The `ServeProcess` class: `dsl serve` in a process of its own."""
    return ServeProcess
