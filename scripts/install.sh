#!/usr/bin/env bash
# Installs DuplexCadence and what its tests and examples need, without ever moving torch:
#   - torch: kept if present (e.g. a CUDA build), else the pinned CPU build 2.13.0
#   - graphviz's `dot` (Debian package) for `dsl render` to SVG/PNG
#   - the examples' model packages with --no-deps, plus exactly what their modules import
# PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
    pip_install torch==2.13.0
fi
if ! command -v dot >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq >/dev/null && $SUDO apt-get install -y -qq graphviz >/dev/null
    else
        echo "install.sh: graphviz's 'dot' is missing and apt-get is not available: install graphviz" >&2
    fi
fi
pip_install -e ".[test]"

# moshi 0.2.13 (Moshi, PersonaPlex): its pins (torch<2.10) are ignored on purpose.
pip_install --no-deps moshi==0.2.13
# transformers 5.17.0 (Qwen3-Omni Code2Wav); it refuses huggingface_hub 2.x.
pip_install --no-deps transformers==5.17.0
# stepaudio2-minicpmo 0.1.1 (MiniCPM-o 4.5 token2wav): only its model submodules are imported.
pip_install --no-deps stepaudio2-minicpmo==0.1.1
pip_install einops safetensors "huggingface_hub>=1.5,<2" sentencepiece numpy scipy \
    "tokenizers>=0.23.1,<0.24" httpx httpcore h11 idna certifi "regex>=2025.10.22" pyyaml packaging tqdm \
    onnxruntime==1.32.0 flatbuffers protobuf
"$PY" -c "import torch; print('install.sh: torch', torch.__version__)"
