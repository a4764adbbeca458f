#!/usr/bin/env bash
# Source this on a machine without a package registry: installs the wheels brought in .whl/ into
# /tmp/site and makes `duplexcadence` importable from this checkout without building it, with its
# metadata (the `duplexcadence.tails` entry points of pyproject.toml) so that `dsl bench TAIL` finds the tails.
# With .raybundle/ray-py312.tar.xz (built by scripts/device_ray_bundle.sh where a registry is reachable) it
# first unpacks Ray and what Ray Serve needs into /tmp/site; the wheels of .whl/ then install over it.
#   source scripts/device_setup.sh
if [ -f .raybundle/ray-py312.tar.xz ]; then
  mkdir -p /tmp/site && tar -xJf .raybundle/ray-py312.tar.xz -C /tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
mkdir -p /tmp/pkgs && ln -sfn "$PWD" /tmp/pkgs/duplexcadence
python3 - <<'PY'
import pathlib, re, tomllib
project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
project["version"] = re.search(r'^__version__ = "(.+)"', pathlib.Path("__init__.py").read_text(), re.M).group(1)
info = pathlib.Path(f"/tmp/pkgs/duplexcadence-{project['version']}.dist-info")
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
lines = []
for group, entries in project.get("entry-points", {}).items():
    lines += [f"[{group}]"] + [f"{name} = {value}" for name, value in entries.items()] + [""]
(info / "entry_points.txt").write_text("\n".join(lines))
PY
export PYTHONPATH=/tmp/pkgs:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
