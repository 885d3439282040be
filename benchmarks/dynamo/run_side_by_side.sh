#!/usr/bin/env bash
# evinfra and NVIDIA Dynamo 1.6.1 side by side, in one command:
#   sudo benchmarks/dynamo/run_side_by_side.sh [--quick] [--duration-s 20] [--out DIR]
# Needs root (a private network namespace: `unshare -n`), evinfra's .venv at the repository
# root, and benchmarks/dynamo/.venv from setup.sh. Every server binds 127.0.0.1 inside the
# namespace; the script stops every process it starts. Writes
# runs/dynamo-side-by-side/report.md and results.json.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
evinfra_python="${EVINFRA_PYTHON:-$repo/.venv/bin/python}"

if [[ ! -x "$here/.venv/bin/python" ]]; then
    echo "no Dynamo venv: run $here/setup.sh first" >&2
    exit 2
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "needs root for a private network namespace (unshare -n)" >&2
    exit 2
fi
if [[ ! -f "$here/model/tokenizer.json" ]]; then
    "$here/.venv/bin/python" "$here/make_model.py" "$here/model"
fi
# A new network namespace holds only a down loopback: bring it up, then run everything.
exec unshare -n -- bash -c 'ip link set lo up && exec "$0" "$@"' \
    "$evinfra_python" "$here/side_by_side.py" "$@"
