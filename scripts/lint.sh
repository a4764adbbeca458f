#!/usr/bin/env bash
# Lint gate: `ruff check` and `ruff format --check` over the repository (configuration: pyproject.toml,
# [tool.ruff]). Installs ruff with pip when it is missing. Exits non-zero on any finding.
#   bash scripts/lint.sh
# To fix what can be fixed: ruff check --fix . && ruff format .
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RUFF_VERSION=0.17.6  # installed when ruff is missing (its formatting can change between releases)

if command -v ruff >/dev/null 2>&1; then
    ruff=(ruff)
elif "$PY" -m ruff --version >/dev/null 2>&1; then
    ruff=("$PY" -m ruff)
else
    "$PY" -m pip install --quiet --disable-pip-version-check "ruff==$RUFF_VERSION"
    ruff=("$PY" -m ruff)
fi
echo "lint.sh: $("${ruff[@]}" --version)"
"${ruff[@]}" check .
"${ruff[@]}" format --check .
