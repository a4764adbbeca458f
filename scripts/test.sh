#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (GPU tests are skipped without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m pytest -q "$@"
