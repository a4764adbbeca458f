#!/usr/bin/env bash
# Installs DuplexCadence and what its tests and examples need, without ever moving torch:
#   - torch: kept if present (e.g. a CUDA build), else torch 2.13.0 from PyPI
#   - graphviz's `dot` (Debian package) for `dsl render` to SVG/PNG
#   - Chromium (Debian packages chromium, chromium-driver) for the browser test of the conversation page
#   - the package (editable) with the test, serve, ray and model extras, which pip resolves beside that torch
#   - then the model packages whose own pins would move torch, without their requirements
#     (scripts/model-pins.txt says why)
# Quiet when it succeeds (one line at the end); a step that fails prints its whole output.
# PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

step() {  # step WHAT COMMAND...: run COMMAND with its output kept aside; on failure show it and stop
    local what=$1
    shift
    if ! "$@" >"$LOG" 2>&1; then
        echo "install.sh: $what failed:" >&2
        cat "$LOG" >&2
        exit 1
    fi
}
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }
apt_install() {
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@"
}

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    step "installing torch 2.13.0" pip_install torch==2.13.0
fi
if ! command -v dot >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        step "installing graphviz (apt-get)" apt_install graphviz
    else
        echo "install.sh: graphviz's 'dot' is missing and apt-get is not available: install graphviz" >&2
    fi
fi
if ! command -v chromium >/dev/null 2>&1; then  # the page's browser test (tests/serve/realtime/test_page.py)
    if command -v apt-get >/dev/null 2>&1; then
        step "installing chromium and chromium-driver (apt-get)" apt_install chromium chromium-driver
    else
        echo "install.sh: chromium is missing and apt-get is not available: the page's browser test skips" >&2
    fi
fi
step "installing duplexcadence with its extras" pip_install -e ".[test,lsp,serve,ray,moshi,qwen3omni,minicpmo45]"
step "installing the model packages (--no-deps)" pip_install --no-deps -r scripts/model-pins.txt
"$PY" -c "import duplexcadence, torch; print(f'install.sh: duplexcadence {duplexcadence.__version__}, torch {torch.__version__}')"
