"""Drafting a small loop whose state the caller owns and hands back each call, and `dsl draft` itself."""

from __future__ import annotations

import sys

import torch

from duplexcadence.interpreter.cli.main import main
from duplexcadence.interpreter.draft.draft import draft
from duplexcadence.interpreter.draft.loop import StockLoop

LOOP_MODULE = """
import torch
from duplexcadence.interpreter.draft.loop import StockLoop

def handback_loop(frames="12"):
    model = torch.nn.Conv1d(4, 4, 3)
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1))

    def step(state, x):
        carry, history = state["carry"], state["history"]
        padded = torch.cat([carry if carry is not None else torch.zeros(1, 4, 2), x], dim=-1)
        history = torch.cat([history, model(padded)], dim=-1)[..., -5:]
        return model(padded), {"carry": padded[..., -2:], "history": history, "layers": [x * 2, x * 3]}

    state = {"carry": None, "history": torch.zeros(1, 4, 0), "layers": [torch.zeros(1, 4, 1), torch.zeros(1, 4, 1)]}
    return StockLoop(model, step, lambda t: {"x": x[..., t : t + 1]}, rate=frames, state=state, handback=True)
"""


def test_caller_owned_state_handed_back(tmp_path):
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "handback_loop.py").write_text(LOOP_MODULE)
        from handback_loop import handback_loop
    finally:
        sys.path.remove(str(tmp_path))
    result = draft(handback_loop())
    assert result.check.ok, result.text
    assert "region carry : f32[1, 4, time] on frame retain last 2 start zeros" in result.text
    assert "region history : f32[1, 4, time] on frame retain last 5 start empty" in result.text
    assert "region layers[layer < 2] : f32[1, 4, 1] start zeros" in result.text
    assert "# caller-owned: found at state.carry" in result.text
    assert (
        "    read x new\n    update carry +1\n    update history +1\n    update layers\n    write out +1\n"
        in result.text
    )


def test_dsl_draft_prints_the_draft_and_a_summary(tmp_path, monkeypatch, capsys):
    (tmp_path / "handback_loop.py").write_text(LOOP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["draft", "handback_loop:handback_loop", "--calls", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# Drafted by `dsl draft handback_loop:handback_loop` from ")
    assert err.startswith("dsl draft: drafted 1 input(s), 1 output(s) and 4 state tensor(s)")
    assert err.rstrip().endswith("the draft passes dsl check")
    assert main(["draft", "handback_loop"]) == 2
    assert capsys.readouterr().err == (
        "dsl draft: error: 'handback_loop' is not MODULE:FUNCTION (a function returning a StockLoop, e.g. "
        "mymodel_draft:stock_loop)\n"
    )
    assert main(["draft", "handback_loop:no_such_loop"]) == 2
    assert capsys.readouterr().err == "dsl draft: error: 'handback_loop' has no function 'no_such_loop'\n"
    assert main(["draft", "no_such_module_here:loop"]) == 2
    assert capsys.readouterr().err == (
        "dsl draft: error: cannot import 'no_such_module_here' from the current folder or the installed packages: "
        "No module named 'no_such_module_here'\n"
    )


def test_a_step_that_raises_is_reported_with_its_call():
    loop = StockLoop(torch.nn.Identity(), lambda x: 1 / 0, lambda t: {"x": torch.zeros(1, 1)}, rate=1)
    try:
        draft(loop)
    except Exception as error:
        assert str(error) == "call 0 of the stock step (with x) raised ZeroDivisionError: division by zero"
    else:
        raise AssertionError("no error")
