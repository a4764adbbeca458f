#!/usr/bin/env bash
# Installs DuplexCadence and what its tests and examples need, without ever moving torch.
#   - torch: kept if present (the GPU machine's CUDA build), else the pinned CPU build 2.13.0
#   - graphviz's `dot` (Debian package) for `dsl render` to SVG/PNG
#   - the model packages of the examples, with --no-deps plus their real needs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q torch==2.13.0
fi
if ! command -v dot >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq graphviz >/dev/null
    else
        echo "install.sh: graphviz's 'dot' is missing and apt-get is not available; install graphviz" >&2
    fi
fi
"$PY" -m pip install -q -e ".[test]"
# Model packages: never let them choose torch.
"$PY" -m pip install -q --no-deps moshi==0.2.13
"$PY" -m pip install -q einops safetensors huggingface_hub sentencepiece numpy
