"""Packaging: the wheel carries the grammar and the stdlib as package data under the one
`duplexcadence` namespace, its metadata (version, licence, numpy, the extras) is what the package
says, an installed copy checks `.clock` files from any folder, the model packages pip cannot
resolve beside torch are pinned in one file that install.sh uses, and install.sh is quiet when it
succeeds and shows pip's output when it fails."""

from __future__ import annotations

import email
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import duplexcadence
from duplexcadence.interpreter.cli import common

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
NO_DEPS_FILE = REPO / "scripts" / "model-pins.txt"


def _setuptools_is_recent() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77  # pyproject.toml's build requirement


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


@pytest.mark.slow
def test_the_wheel_holds_the_grammar_and_the_stdlib_in_one_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "duplexcadence/grammar/clock.lark" in names
    stdlib = sorted(str(p.relative_to(REPO)) for p in (REPO / "stdlib").rglob("*.clock"))
    assert stdlib and all(f"duplexcadence/{path}" in names for path in stdlib)
    assert "duplexcadence/interpreter/cli/main.py" in names and "duplexcadence/interpreter/__init__.py" in names
    top_level = {name.split("/")[0] for name in names}
    assert not top_level & {"dsl", "interpreter", "grammar", "stdlib", "examples", "tests"}
    assert not any(name.startswith("duplexcadence/tests/") or "/.venv/" in name for name in names)
    folders = [
        path.parent.relative_to(REPO)
        for path in REPO.rglob("__init__.py")
        if not {"tests", "scripts", "build", "dist"} & set(path.relative_to(REPO).parts[:1])
        and not any(part.startswith(".") for part in path.relative_to(REPO).parts)
    ]
    assert Path("interpreter/runtime/capture") in folders
    missing = [
        str(folder) for folder in folders if "/".join(("duplexcadence", *folder.parts, "__init__.py")) not in names
    ]
    assert missing == [], "setup.py's discovery leaves these packages out of the wheel"
    assert "duplexcadence/setup.py" not in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dsl = duplexcadence.interpreter.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_the_wheel_metadata_is_what_the_package_says(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    metadata = email.message_from_bytes(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    assert metadata["Version"] == duplexcadence.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    requires = metadata.get_all("Requires-Dist")
    assert any(r.startswith("numpy") for r in requires) and any(r.startswith("torch>=2.11") for r in requires)
    assert 'transformers==5.17.0; extra == "qwen3omni"' in requires
    ray = [r for r in requires if r.startswith("ray")]  # a one-host server does not bring Ray
    assert ray == ['ray[serve]==2.60.0; extra == "ray"'] and 'duplexcadence[serve]; extra == "ray"' in requires


def test_the_licence_file_is_the_apache_2_0_text() -> None:
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License to your work." in text
    assert len(re.findall(r"^\s+\d+\. [A-Z]", text, re.M)) == 9  # the nine sections


def no_deps_pins() -> dict[str, str]:
    """scripts/model-pins.txt: package -> version."""
    pins = {}
    for line in NO_DEPS_FILE.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{NO_DEPS_FILE.name}: {line!r} is not pinned"
            pins[name] = version
    return pins


def test_the_packages_pip_cannot_resolve_are_pinned_once_and_left_out_of_the_extras() -> None:
    pins = no_deps_pins()
    assert pins == {"moshi": "0.2.13", "stepaudio2-minicpmo": "0.1.1"}
    extras = PYPROJECT["project"]["optional-dependencies"]
    listed = {re.split(r"[<>=!~;\[ ]", requirement)[0].lower() for group in extras.values() for requirement in group}
    assert not listed & set(pins), "a package installed with --no-deps is also in an extra"
    assert set(common.NO_DEPS) <= set(extras) and sorted(common.NO_DEPS.values()) == sorted(
        f"{name}=={version}" for name, version in pins.items()
    )
    assert extras["qwen3omni"] == ["transformers==5.17.0", "huggingface_hub>=1.5,<2"]
    assert "numpy>=1.26" in PYPROJECT["project"]["dependencies"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "duplexcadence.__version__"}


def test_the_installed_model_packages_are_the_pinned_versions() -> None:
    for name, version in no_deps_pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed == version, f"{name} {installed} is installed, scripts/model-pins.txt pins {version}"


def test_install_sh_installs_the_extras_then_the_pinned_packages_without_their_requirements() -> None:
    script = (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")
    extras = script.index('pip_install -e ".[test,lsp,serve,ray,moshi,qwen3omni,minicpmo45]"')
    pinned = script.index("pip_install --no-deps -r scripts/model-pins.txt")
    assert extras < pinned, "the --no-deps packages go last: a resolver run after them would report their pins"


FAKE_PYTHON = """#!/bin/sh
# Stands in for python: `-m pip` prints what pip prints and exits with $FAKE_PIP_EXIT; the rest runs
# the real interpreter.
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    echo "Collecting things"
    echo "ERROR: pip's dependency resolver does not currently take into account all the packages" >&2
    exit "${FAKE_PIP_EXIT:-0}"
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize("pip_exit", [0, 1])
@pytest.mark.slow
def test_install_sh_is_quiet_when_it_succeeds_and_shows_the_output_when_it_fails(tmp_path, pip_exit: int) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    (tmp_path / "dot").write_text("#!/bin/sh\n")  # graphviz is there: no apt-get
    (tmp_path / "dot").chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(fake),
        "REAL_PYTHON": sys.executable,
        "FAKE_PIP_EXIT": str(pip_exit),
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    if pip_exit == 0:
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.splitlines() == [
            f"install.sh: duplexcadence {duplexcadence.__version__}, torch {torch_version()}"
        ]
    else:
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.splitlines() == [
            "install.sh: installing duplexcadence with its extras failed:",
            "Collecting things",
            "ERROR: pip's dependency resolver does not currently take into account all the packages",
        ]


def torch_version() -> str:
    import torch

    return torch.__version__


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
    outside = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}  # no checkout on the path
    where = subprocess.run(
        [str(python), "-c", "import duplexcadence; print(duplexcadence.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
        env=outside,
    )
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout  # the wheel, not this checkout
    dsl = shutil.which("dsl", path=str(python.parent))
    assert dsl is not None
    installed_stdlib = Path(where.stdout.strip()).parent / "stdlib" / "models" / "mimi_decoder.clock"
    done = subprocess.run(
        [dsl, "check", "mine.clock", str(installed_stdlib)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=elsewhere,
        env=outside,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "All clean: 2 files checked.\n", "")
