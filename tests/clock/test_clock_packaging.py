"""Packaging: the wheel carries the grammar and the stdlib as package data under the one
`duplexcadence` namespace, and an installed copy checks `.clock` files from any folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _setuptools_is_recent() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from this checkout (offline when the running setuptools can build it)."""
    out = tmp_path_factory.mktemp("wheel")
    # Build from a clean copy: an in-tree build would leave build/ behind, whose stale files a later
    # wheel could pick up.
    source = tmp_path_factory.mktemp("source") / "duplexcadence"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".pytest_cache"
        ),
    )
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)]
    if _setuptools_is_recent():
        command.insert(5, "--no-build-isolation")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=out)
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = out.glob("duplexcadence-*.whl")
    return built


def test_the_wheel_holds_the_grammar_and_the_stdlib_in_one_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "duplexcadence/grammar/clock.lark" in names
    stdlib = sorted(str(p.relative_to(REPO)) for p in (REPO / "stdlib").rglob("*.clock"))
    assert stdlib and all(f"duplexcadence/{path}" in names for path in stdlib)
    assert "duplexcadence/interpreter/cli/main.py" in names and "duplexcadence/interpreter/__init__.py" in names
    top_level = {name.split("/")[0] for name in names}
    assert not top_level & {"dsl", "interpreter", "grammar", "stdlib", "examples", "tests"}
    assert not any(name.startswith("duplexcadence/tests/") or "/.venv/" in name for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dsl = duplexcadence.interpreter.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_an_installed_wheel_checks_files_from_another_folder(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv (reusing this interpreter's packages, so torch is not reinstalled) with only the
    wheel installed: `dsl check` resolves `use std.audio` from the installed stdlib."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for requirement in ("lark", "attrs", "networkx"):  # the front end's needs, from the reused packages
        subprocess.run([str(python), "-c", f"import {requirement}"], check=True, timeout=60)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "mine.clock").write_text(
        "use std.audio (sample, mel)\ncadence 1 s\n"
        "region pcm : f32[1, time] on sample retain last 480\n"
        "stage s on mel { hook h; update pcm +480 }\n"
    )
    where = subprocess.run(
        [str(python), "-c", "import duplexcadence; print(duplexcadence.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
    )
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout  # the wheel, not this checkout
    dsl = shutil.which("dsl", path=str(python.parent))
    assert dsl is not None
    installed_stdlib = Path(where.stdout.strip()).parent / "stdlib" / "models" / "mimi_decoder.clock"
    done = subprocess.run(
        [dsl, "check", "mine.clock", str(installed_stdlib)], capture_output=True, text=True, timeout=120, cwd=elsewhere
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "All clean: 2 files checked.\n", "")
