#!/usr/bin/env bash
# Set up a fresh machine and run the whole test suite (GPU tests are skipped without a GPU; where there is
# one, `pytest -m gpu` runs them). Extra arguments go to pytest: `-m "not slow"` is the fast subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" -m pytest -q "$@"
