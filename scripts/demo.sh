#!/usr/bin/env bash
# The main job on a fresh machine: install, then run Moshi's Mimi decoder tail end to end
# (plan summary, timeline diagram in out/, stock vs DuplexCadence with torch.equal on every frame,
# speed and memory table). CPU by default; the GPU when one is present. Extra args go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m duplexcadence.examples.demo "$@"
