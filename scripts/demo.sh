#!/usr/bin/env bash
# The main job on a fresh machine: install, then run Moshi's Mimi decoder tail end to end (the plan
# summary, the timeline diagram in out/, stock vs DuplexCadence with torch.equal on every frame, the
# speed and memory table). CPU by default; the GPU when one is present. Extra args go to the demo
# (python -m duplexcadence.examples.demo --help). PYTHON selects the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
"${PYTHON:-python3}" -m duplexcadence.examples.demo "$@"
