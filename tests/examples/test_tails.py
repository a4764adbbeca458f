"""The tail registry: every tail the distribution registers (entry points `duplexcadence.tails`) loads, declares a
clean `.clock`, names its upstream and has a README; a name that is not registered, or a tail whose optional
packages are missing, is a clear error; `duplexcadence.tails.NAME` is the record."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from duplexcadence.dsl.frontend import check_file
from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
NAMES = tails.available()


def test_the_distribution_registers_its_tails():
    assert sorted(NAMES) == NAMES and len(NAMES) >= 2
    assert all(tail.name == name for name, tail in zip(NAMES, tails.all_tails()))


@pytest.mark.parametrize("name", NAMES)
def test_a_tail_declares_a_clean_clock_and_documents_its_upstream(name):
    tail = tails.get(name)
    assert tail.summary and "\n" not in tail.summary
    result = check_file(str(tail.clock_path()), {})
    assert [d for d in result.diagnostics if d.severity.value == "error"] == []
    readme = ROOT / tail.readme.removeprefix("duplexcadence/")
    text = readme.read_text()
    assert tail.clock_path().name in text
    for upstream in tail.upstream:
        assert upstream.repository and upstream.path
        assert upstream.path in text, f"{readme} does not name {upstream}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folder = ROOT.joinpath(*tail.package.split(".")[1:])
    assert (folder / "__init__.py").is_file()  # a package, which setup.py finds and `pip install .` ships
    if tail.extra is not None:
        assert f"duplexcadence[{tail.extra}]" in text
        assert tail.extra in project["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", NAMES)
def test_a_tail_s_callables_resolve_once_its_packages_are_installed(name):
    tail = tails.get(name)
    if tail.missing():
        with pytest.raises(tails.TailUnavailable, match=f"install duplexcadence\\[{tail.extra}\\]"):
            tail.subject.resolve()
        return
    for reference in (tail.build_model, tail.stock_loop, tail.load_runtime, tail.subject):
        assert callable(reference.resolve()), reference
    if tail.offline is not None:  # the stock model's offline call, what a stream is compared with
        assert callable(tail.offline.resolve()) and tail.offline.tail == name


def test_every_released_tail_names_its_offline_call():
    assert [name for name in NAMES if tails.get(name).offline is None] == ["toy"]


def test_an_unknown_name_lists_the_registered_tails():
    with pytest.raises(tails.TailError) as raised:
        tails.get("nosuch")
    assert str(raised.value) == f"no tail named 'nosuch'; the registered tails are {', '.join(NAMES)}"


def test_stable_names_are_the_registered_records():
    import duplexcadence.tails as stable
    from duplexcadence.tails import toy

    assert toy == tails.get("toy")
    assert dir(stable) == NAMES
    with pytest.raises(AttributeError) as raised:
        stable.nosuch  # noqa: B018
    assert str(raised.value) == (
        "module 'duplexcadence.tails' has no tail 'nosuch': no tail named 'nosuch'; the registered tails are "
        + ", ".join(NAMES)
    )


GHOST = """
from duplexcadence.interpreter.tails import Tail

TAIL = Tail(
    name="ghost",
    summary="a tail whose model package is not installed",
    package="ghost_tail",
    clock="ghost.clock",
    upstream=(),
    build_model="ghost_tail:build",
    stock_loop="ghost_tail:Stock",
    load_runtime="ghost_tail:load_runtime",
    subject="ghost_tail:subject",
    extra="ghost",
    requires=("no_such_ghost_package",),
)

def subject(**options):
    raise AssertionError("not reached: the package check comes first")
"""


@pytest.fixture
def ghost(tmp_path, monkeypatch):
    """A registry of one more tail, `ghost`, whose optional package is missing."""
    (tmp_path / "ghost_tail.py").write_text(textwrap.dedent(GHOST))
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points

    def entry_points(**selection):
        found = list(real(**selection))
        if selection.get("group") == tails.ENTRY_POINT_GROUP:
            found.append(importlib.metadata.EntryPoint("ghost", "ghost_tail:TAIL", tails.ENTRY_POINT_GROUP))
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    yield
    sys.modules.pop("ghost_tail", None)


MISSING = (
    "the 'ghost' tail needs 'no_such_ghost_package', which is not installed: install duplexcadence[ghost] "
    "(model packages go with pip's --no-deps, so that torch stays: see the tail's README.md)"
)


def test_a_tail_without_its_packages_is_listed_and_says_which_extra_to_install(ghost, capsys):
    assert "ghost" in tails.available()
    tail = tails.get("ghost")
    assert tail.missing() == ("no_such_ghost_package",) and not tail.installed
    with pytest.raises(tails.TailUnavailable) as raised:
        tail.subject(device="cpu")
    assert str(raised.value) == MISSING
    assert isinstance(raised.value, ImportError)
    assert cli.main(["bench", "ghost", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"dsl bench: error: {MISSING}\n"


def test_a_registration_that_is_not_a_tail_record_is_refused(tmp_path, monkeypatch):
    (tmp_path / "not_a_tail.py").write_text("TAIL = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **selection: [importlib.metadata.EntryPoint("odd", "not_a_tail:TAIL", tails.ENTRY_POINT_GROUP)],
    )
    with pytest.raises(tails.TailError) as raised:
        tails.get("odd")
    assert str(raised.value) == "tail 'odd' is registered as 'not_a_tail:TAIL', which is not a Tail record"
    sys.modules.pop("not_a_tail", None)


def test_the_registry_and_the_bench_command_need_no_torch_until_it_runs():
    """`dsl --help` and `dsl bench --help` list the tails with torch unimportable."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from duplexcadence.interpreter import tails\n"
        "from duplexcadence.interpreter.cli import main\n"
        "print(','.join(tails.available()))\n"
        "main.main(['bench', '--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    names, _, help_text = done.stdout.partition("\n")
    assert names == ",".join(NAMES)
    assert f"a registered tail ({', '.join(NAMES)})" in " ".join(help_text.split())


@pytest.mark.models
@pytest.mark.parametrize("name", ["moshi", "personaplex", "qwen3omni"])
@pytest.mark.slow
def test_the_capture_probe_finds_nothing_to_block_in_a_shipped_tail(name):
    """Every stage of these tails is captured on the H200 (docs/benchmarks.md); the probe that runs before each
    capture (capture/obstacles.py) must not block one. On the CPU every `.item()` and data-sized operation
    counts (all tensors are on the watched device); host-to-device copies show on CUDA only."""
    from duplexcadence.interpreter.runtime.capture.graphs import probe_stage
    from duplexcadence.interpreter.runtime.session import call_in_session

    tail = tails.get(name)
    if tail.missing():
        pytest.skip(f"needs duplexcadence[{tail.extra}]")
    runtime = tail.load_runtime(tail.build_model())
    session = runtime.session()
    found = {}
    for graph_plan in runtime.plan.capture.captured:
        firing = runtime.first_firing[graph_plan.signature]
        for storage in session.storage.values():
            storage.fill_zero()
        stage = runtime.program.stages[firing.stage]
        found[firing.stage, graph_plan.signature] = call_in_session(session, stage.rng, probe_stage, session, firing)
    assert found and all(obstacles == [] for obstacles in found.values()), found
