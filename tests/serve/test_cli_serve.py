"""`dsl serve` and `dsl loadgen`: help without torch, the extra named when a package is missing, usage errors
in words, and a real server (started in this process on a free port) driven by `dsl loadgen --verify`, for a
registered tail and for a `.clock` file with a model builder of the user's own."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
import threading

import pytest

from duplexcadence.interpreter.cli import main as cli
from duplexcadence.interpreter.cli.loadgen import session_url
from duplexcadence.interpreter.cli.serve import pool_config, serve
from duplexcadence.interpreter.serve.admission import TickModel
from duplexcadence.interpreter.serve.numerics import Numerics


def at_server() -> str:
    """What `--verify` says of the server's settings: the server runs in this process, its tail on a thread of
    its own (whose torch thread count is that thread's)."""
    with concurrent.futures.ThreadPoolExecutor(1) as device_thread:
        numerics = device_thread.submit(Numerics.current, "cpu").result()
    return f" at the server's settings ({numerics.describe()})"


def test_the_help_of_serve_and_loadgen_needs_no_torch():
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from duplexcadence.interpreter.cli import main\n"
        "for command in ('serve', 'loadgen'):\n"
        "    try:\n"
        "        main.main([command, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: dsl serve" in done.stdout and "--lockstep ROWS" in done.stdout and "--headroom" in done.stdout
    assert "usage: dsl loadgen" in done.stdout and "--verify" in done.stdout and "--sessions" in done.stdout


def test_a_missing_serving_package_names_the_extra(monkeypatch, dsl):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert dsl("serve", "toy", "--device", "cpu") == (
        2,
        "",
        "dsl serve: error: dsl serve needs the package 'uvicorn', which is not installed\n"
        '  help: pip install "duplexcadence[serve]"\n',
    )


def test_what_cannot_be_served_is_a_usage_error(tmp_path, monkeypatch, dsl):
    code, _, err = dsl("serve", "nosuch", "--device", "cpu")
    assert code == 2 and err.startswith("dsl serve: error: 'nosuch' is not a registered tail (")
    assert dsl("serve", "toy", "--lanes", "3", "--slots", "2") == (
        2,
        "",
        "dsl serve: error: --lanes 3 is more than --slots 2: a lane needs a slot\n",
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = dsl(
        "serve", "nosuch.clock", "--model", "duplexcadence.examples.toy.model:build_toy", "--device", "cpu"
    )
    assert (code, err) == (
        2,
        "dsl serve: error: 'nosuch.clock' is not a .clock file (with --model, the first argument is the .clock file)\n",
    )
    from duplexcadence.examples.toy.cadence import CLOCK

    code, _, err = dsl("serve", str(CLOCK), "--model", "duplexcadence.examples.toy.model:build_toy", "--device", "cpu")
    assert (code, err) == (
        2,
        "dsl serve: error: the .clock declares region(s) cache `start given`: a session needs initial values, which "
        "a bare model builder does not give; make MODULE:FUNCTION return a ServedTail (docs/serving.md)\n",
    )
    code, _, err = dsl("serve", "toy", "--model", "nowhere:build", "--device", "cpu")
    assert code == 2 and "cannot import 'nowhere'" in err


def test_a_session_url_is_the_session_websocket():
    assert session_url("127.0.0.1:8000") == "ws://127.0.0.1:8000/v1/session"
    assert session_url("http://h:1/") == "ws://h:1/v1/session"
    assert session_url("wss://h/v1/session?x=1") == "wss://h/v1/session?x=1"


def serve_args(target: str, *extra: str) -> argparse.Namespace:
    parser = cli.build_parser(only="serve")
    return parser.parse_args(
        ["serve", target, "--port", "0", "--device", "cpu", "-q", "--log-level", "warning", *extra]
    )


class Serving:
    """`dsl serve` in a thread of this process; `url` once it listens."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.server = None
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        def started(server) -> None:
            self.server = server
            self.ready.set()

        try:
            asyncio.run(serve(self.args, started))
        except BaseException as error:
            self.failure = error
            self.ready.set()

    def __enter__(self) -> str:
        self.thread.start()
        assert self.ready.wait(300), "the server did not start"
        if self.failure is not None:
            raise self.failure
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    def __exit__(self, *exc_info: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "the server did not stop within 60 s"


def test_dsl_serve_a_registered_tail_and_dsl_loadgen_verify_against_it(dsl):
    with Serving(serve_args("toy", "--slots", "2", "--lanes", "2", "--tick-model", "1+1")) as url:
        code, out, err = dsl("loadgen", url, "--sessions", "2", "--ticks", "5", "--no-pace", "--verify")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "serving 'toy' on cpu: a tick every 80 ms of codes i64[1, 1]"
    assert lines[1] == "sessions: 2 of 2 opened; refused: none"
    assert lines[2].startswith("ticks: 10 answered (5 per session, unpaced) in ")
    assert lines[-1] == f"verify: 10 ticks of 2 sessions compared with stock alone{at_server()}, 0 not torch.equal"


def test_dsl_loadgen_drives_bundles_and_verifies_every_member(dsl):
    with Serving(serve_args("toy", "--slots", "3", "--lanes", "2", "--tick-model", "1+1")) as url:
        code, out, err = dsl(
            "loadgen", url, "--sessions", "3", "--ticks", "4", "--no-pace", "--verify", "--bundle", "2"
        )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == "sessions: 3 of 3 opened; refused: none"
    assert lines[2].startswith("ticks: 12 answered (4 per session, unpaced) in ")
    assert lines[-1] == f"verify: 12 ticks of 3 sessions compared with stock alone{at_server()}, 0 not torch.equal"


MODEL = """
import torch


class Scale(torch.nn.Module):
    def forward(self, x):
        return 2 * x


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = Scale()


def build():
    return Model()
"""

CLOCK = """
cadence 1 s
clock frame = 12.5 Hz
region x : f32[1, time] on frame input
region y : f32[1, time] on frame output
stage scale on frame {
    module "scale"
    read x
    write y +1
}
"""


def test_dsl_serve_a_clock_with_a_model_builder(tmp_path, monkeypatch, dsl):
    (tmp_path / "scaled.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "scaled.clock").write_text(textwrap.dedent(CLOCK))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with Serving(serve_args("scaled.clock", "--model", "scaled:build", "--slots", "2")) as url:
        code, out, _ = dsl("loadgen", url, "--sessions", "2", "--ticks", "3", "--no-pace", "--json", "load.json")
        verify_code, _, verify_err = dsl("loadgen", url, "--sessions", "1", "--ticks", "1", "--verify")
    sys.modules.pop("scaled", None)
    assert code == 0, out
    assert out.splitlines()[0] == "serving 'scaled' on cpu: a tick every 80 ms of x f32[1, 1]"
    assert (tmp_path / "load.json").exists()
    assert (verify_code, verify_err) == (
        2,
        "dsl loadgen: error: --verify: the server serves 'scaled', which is not a registered tail with a stock loop "
        "here\n",
    )


def test_lockstep_that_the_plan_does_not_allow_is_a_usage_error(capsys):
    args = serve_args("toy", "--lockstep", "2")
    with pytest.raises(Exception) as raised:
        asyncio.run(serve(args))
    assert str(raised.value).startswith("--lockstep 2: this plan cannot take a session into a running group: ")


@pytest.mark.parametrize("given", ["3", "1+x", "1+-2", "nan+1", "2+inf"])
def test_a_tick_model_that_is_not_two_numbers_is_refused(given, dsl):
    code, _, err = dsl("serve", "toy", "--device", "cpu", "--tick-model", given)
    assert code == 2
    assert err.splitlines()[-1] == (
        "dsl serve: error: argument --tick-model: must be FIXED_MS+PER_UNIT_MS, two numbers >= 0 (a calibrated "
        f"tick line's, e.g. 5.9+8.4), not {given!r}"
    )


def test_a_given_tick_model_replaces_the_calibration():
    args = serve_args("toy", "--tick-model", "5.9+8.4")
    model = pool_config(args).tick_model
    assert isinstance(model, TickModel) and (model.fixed_s, model.per_unit_s) == pytest.approx((0.0059, 0.0084))


def test_the_latency_guard_is_on_unless_turned_off():
    assert pool_config(serve_args("toy")).latency_guard is True
    assert pool_config(serve_args("toy", "--no-latency-guard")).latency_guard is False


@pytest.mark.parametrize(
    ("param", "says"),
    [
        ("istft=fft", "istft must be one of captured, torch, not 'fft'"),
        ("dtype=bf32", "the token2wav tail runs in fp32 or fp16, not bf32"),
    ],
)
def test_a_tail_option_value_the_adapter_refuses_is_a_usage_error(param, says, dsl):
    from duplexcadence.interpreter import tails

    if tails.get("minicpmo45").missing():
        pytest.skip("needs the minicpmo45 tail's packages")
    assert dsl("serve", "minicpmo45", "--param", param, "--device", "cpu") == (
        2,
        "",
        f"dsl serve: error: tail 'minicpmo45': {says}\n",
    )


def test_the_pool_freezes_the_collector_unless_told_not_to():
    assert pool_config(serve_args("toy")).freeze_gc is True
    assert pool_config(serve_args("toy", "--no-freeze-gc")).freeze_gc is False
