"""`dsl serve` as a user starts it: a process of its own on a free port (`--port 0`) that says where it serves
(`serving through ws://HOST:PORT/v1/session`), which `dsl loadgen` then drives, its report as JSON on stdout with
`--output-format json`; SIGTERM stops the server without a traceback."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from duplexcadence.interpreter.cli import main as cli

pytest.importorskip("uvicorn")

URL = re.compile(r"^serving through (ws://127\.0\.0\.1:\d+/v1/session)$")


def served_url(server: subprocess.Popen, timeout_s: float = 300.0) -> tuple[str, list[str]]:
    """The address the server's stderr names, and the lines it said before it."""
    assert server.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + timeout_s
    for line in server.stderr:
        said.append(line.rstrip("\n"))
        if match := URL.match(said[-1]):
            return match.group(1), said
        assert time.monotonic() < deadline, f"no address within {timeout_s:g} s: {said}"
    raise AssertionError(f"the server exited ({server.wait()}) without saying where it serves: {said}")


@pytest.mark.slow
def test_the_server_says_where_it_serves_and_loadgen_reports_as_json(capsys) -> None:
    # A given tick model: admission does not depend on how busy the machine is while it calibrates.
    command = [sys.executable, "-m", "duplexcadence", "serve", "toy", "--device", "cpu", "--port", "0"]
    command += ["--tick-model", "1+1", "--log-level", "warning"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url, said = served_url(server)
        assert said[0].startswith("serving 'toy' on cpu: "), said  # the pool's description, then the address
        code = cli.main(["loadgen", url, "--sessions", "1", "--ticks", "3", "--no-pace", "--output-format", "json"])
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        report = json.loads(out)  # the report, and nothing else, on stdout
        assert (report["url"], report["opened"], report["ticks"], report["errors"]) == (url, 1, 3, {})
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) in (0, -signal.SIGTERM)  # uvicorn shuts down, then ends as the signal asked
        assert server.stderr is not None and "Traceback" not in server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
