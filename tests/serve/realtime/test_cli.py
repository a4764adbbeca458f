"""`dsl serve minicpmo45 --conversations 2` (the reduced sizes on the CPU) in a process of its own, driven by
`dsl loadgen --conversations`; and what the command refuses."""

from __future__ import annotations

import json
import re

import pytest

from duplexcadence.interpreter.cli import main as cli

SERVING_ON = re.compile(r"serving on (http://127\.0\.0\.1:(\d+))/ \(the page\)")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["minicpmo45", "--conversations", "2", "--slots", "2", "--lockstep", "4"],
            "dsl serve: error: --slots does not apply to --conversations; --lockstep does not apply to "
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


@pytest.mark.slow
def test_serve_conversations_and_drive_them_with_loadgen(engine_installed, serve_process, tmp_path, capsys):
    options = ["--param", "sizes=reduced", "--param", "n_timesteps=2"]
    argv = ["minicpmo45", "--conversations", "2", *options, "--port", "0", "--device", "cpu"]
    server = serve_process(argv, SERVING_ON, re.compile("(?!)"))
    try:
        assert "<title>DuplexCadence: talk to the model</title>" in server.get("/")
        out = tmp_path / "load.json"
        argv = ["loadgen", f"ws://127.0.0.1:{server.port}", "--conversations", "3", "--units", "2", "--no-pace"]
        assert cli.main([*argv, "--speak-units", "0", "--json", str(out)]) == 1  # one refused
        capacity = json.loads(server.get("/v1/capacity"))
    finally:
        server.stop()
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == (
        "conversations: 2 of 3 opened; refused: at-capacity: at capacity: 2 of 2 conversations, predicted tick "
        "0.0 ms of 1000 ms (headroom 15%); all 2 conversation slots are taken"
    )
    assert printed[1].startswith("units: 4 answered (2 per conversation, unpaced) in ")
    report = json.loads(out.read_text())
    assert (report["opened"], report["units_answered"], report["units_spoken"], report["errors"]) == (2, 4, 0, [])
    assert (capacity["slots"], capacity["engine"]["memory_limit"]) == (2, 2)
    lines = "".join(server.lines)
    assert "serving conversations of 'minicpmo45': 2 at most (memory limit 2, time limit 2)" in lines
