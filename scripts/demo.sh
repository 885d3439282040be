#!/usr/bin/env bash
# The main job on the embedded default: set up, start the local server (SmolLM2-135M on
# the torch executor, `evolving` system, 2 node workers on 127.0.0.1), replay a short
# agent workload against it, print the summary, and keep serving until Ctrl-C.
# Extra flags go to `evinfra demo` (e.g. --exit-after 0 to stop after the summary).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "serve"
exec .venv/bin/evinfra demo "$@"
