#!/usr/bin/env bash
# Install NVIDIA Dynamo 1.6.1 (CPU `mocker` engine) and NVIDIA aiperf into their own virtual
# environment, benchmarks/dynamo/.venv, next to (not inside) evinfra's .venv.
#
# ai-dynamo goes in with --no-deps and its other dependencies by name: its `aisimulate`
# dependency (Python >= 3.11) downloads from outside the package index when installed, and
# the mocker's default polynomial timing model does not need it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
venv="$here/.venv"
DYNAMO_VERSION="1.6.1"

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade pip

# ai-dynamo-runtime's own requirements (pydantic, uvloop) come with it.
"${pip[@]}" install --quiet "ai-dynamo-runtime==$DYNAMO_VERSION"
"${pip[@]}" install --quiet --no-deps "ai-dynamo==$DYNAMO_VERSION"
# ai-dynamo 1.6.1's Requires-Dist, less aisimulate and the engine extras.
"${pip[@]}" install --quiet \
    "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" \
    "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" \
    "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0" "transformers>=4.56.0" \
    "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0"
# `tokenizers` (with transformers) builds the local tokenizer; aiperf cross-checks.
"${pip[@]}" install --quiet aiperf

"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("ai-dynamo", "ai-dynamo-runtime", "aiperf", "tokenizers", "transformers"):
    print(f"{name} {md.version(name)}")
PY
