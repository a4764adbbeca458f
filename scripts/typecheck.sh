#!/usr/bin/env bash
# Type gate: mypy over the package (configuration: pyproject.toml, [tool.mypy]). The repository root IS the
# package `duplexcadence`, so mypy runs in a folder where `duplexcadence` links to this checkout (kept under
# the temp dir, one per checkout, with its mypy cache). Installs mypy and types-networkx with pip when they
# are missing. Run it after scripts/install.sh: mypy reads the types of the installed packages (torch, moshi,
# transformers, ray, ...). Exits non-zero on any finding; extra arguments go to mypy.
#   bash scripts/typecheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PYTHON:-python3}
MYPY_VERSION=2.4.1                      # installed when mypy is missing (its findings can change between releases)
TYPES_NETWORKX_VERSION=3.6.1.20261114   # networkx ships no types of its own

if ! "$PY" -m mypy --version >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check "mypy==$MYPY_VERSION"
fi
if ! "$PY" -m pip show --quiet types-networkx >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --disable-pip-version-check "types-networkx==$TYPES_NETWORKX_VERSION"
fi

checkout_key=$(printf '%s' "$root" | cksum | cut -d' ' -f1)
work="${TMPDIR:-/tmp}/duplexcadence-typecheck-$(id -u)-$checkout_key"
mkdir -p "$work"
ln -sfn "$root" "$work/duplexcadence"
cd "$work"
echo "typecheck.sh: $("$PY" -m mypy --version) in $work"
"$PY" -m mypy --config-file "$root/pyproject.toml" --cache-dir "$work/.mypy_cache" "$@"
