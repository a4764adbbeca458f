#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (GPU tests are skipped without a GPU; on the
# GPU machine run `pytest -m gpu`). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" -m pytest -q "$@"
