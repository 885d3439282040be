#!/usr/bin/env bash
# The main job on the embedded default: set up, then a short side-by-side simulated run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh ""
.venv/bin/evinfra sim --system least-loaded --workload coding --model kimi-k2 --gpu gb300 \
  --num-gpus 32 --duration-s 120 --warmup-s 20 --out runs/demo "$@"
