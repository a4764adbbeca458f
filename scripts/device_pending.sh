#!/usr/bin/env bash
# Runs the GPU measurements and GPU tests the docs do not yet carry, one group per call (each under 10 minutes):
#   bash scripts/device_pending.sh GROUP OUTDIR     GROUP: tests | conversations | baseline | served | memory | decoder
# On a machine without a package registry, `source scripts/device_setup.sh` first.
set -uo pipefail
cd "$(dirname "$0")/.."
group=${1:?"give a group: tests, conversations, baseline, served, memory or decoder"}
out=${2:?"give a folder for the JSON and logs"}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
case "$group" in
  tests)
    timeout 560 python3 -m pytest -q -m gpu --maxfail=5 tests/engine tests/serve/realtime/test_gpu.py \
      tests/examples/test_hf_decoder.py tests/runtime 2>&1 | tail -40 | tee "$out/gpu_tests.txt" ;;
  conversations)
    timeout 570 python3 scripts/conversations_bench.py --device cuda --sizes released --counts 8,12,16 \
      --units 64 --lanes 8 --verify 2 --out "$out/conversations.json" 2>&1 | tail -60 ;;
  baseline)
    timeout 570 python3 scripts/conversations_bench.py --device cuda --sizes released --counts 1 \
      --baseline 1 --units 64 --lanes 1 --verify 1 --out "$out/conversations_baseline.json" 2>&1 | tail -60 ;;
  served)
    timeout 570 python3 scripts/serve_conversations_bench.py --engine minicpmo45 --device cuda --counts 1,4,8 \
      --units 20 --json "$out/conversations_served.json" 2>&1 | tail -60 ;;
  memory)
    NO_TORCH_COMPILE=1 timeout 570 python3 scripts/memory_vs_stock.py --device cuda --json "$out/memory.json" \
      2>&1 | tail -60 ;;
  decoder)
    timeout 570 python3 scripts/hf_decoder_gpu.py --device cuda --out "$out/hf_decoder.json" 2>&1 | tail -40 ;;
  *)
    echo "device_pending.sh: unknown group '$group' (tests, conversations, baseline, served, memory, decoder)" >&2
    exit 2 ;;
esac
