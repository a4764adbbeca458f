"""`dsl serve ENGINE --conversations N` in a process of its own (the echo engine by MODULE:FUNCTION), driven by
`dsl loadgen --conversations`; and what the command refuses."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from duplexcadence.interpreter.cli import main as cli

HERE = Path(__file__).parent
SERVING_ON = re.compile(r"serving on (http://127\.0\.0\.1:(\d+))/ \(the page\)")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["echo_engine:build", "--conversations", "2", "--workers", "2", "--lockstep", "4"],
            "dsl serve: error: --workers does not apply to --conversations; --lockstep does not apply to "
            "--conversations\n",
        ),
        (
            ["no_such_module:build", "--conversations", "1", "--device", "cpu"],
            "dsl serve: error: cannot import 'no_such_module' from the current folder or the installed packages: "
            "No module named 'no_such_module'\n",
        ),
    ],
)
def test_what_serving_conversations_refuses(argv, says, capsys):
    assert cli.main(["serve", *argv]) == 2
    assert capsys.readouterr().err == says


def test_serve_conversations_and_drive_them_with_loadgen(serve_process, tmp_path, capsys):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    server = serve_process(["echo_engine:build", "--conversations", "2", "--port", "0", "--device", "cpu"], SERVING_ON,
                           re.compile("(?!)"), env)  # fmt: skip
    try:
        assert "<title>DuplexCadence: talk to the model</title>" in server.get("/")
        out = tmp_path / "load.json"
        argv = ["loadgen", f"ws://127.0.0.1:{server.port}", "--conversations", "3", "--units", "3", "--no-pace"]
        assert cli.main([*argv, "--json", str(out)]) == 1  # one refused
    finally:
        server.stop()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "conversations: 2 of 3 opened; refused: at-capacity: at capacity: 2 of 2 conversations"
    assert printed[1].startswith("units: 6 answered (3 per conversation, unpaced) in ")
    report = json.loads(out.read_text())
    assert (report["opened"], report["units_answered"], report["units_spoken"], report["errors"]) == (2, 6, 4, [])
    assert "serving conversations of 'build': 2 at most (memory limit 2, time limit 2)" in "".join(server.lines)
