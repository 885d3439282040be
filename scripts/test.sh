#!/usr/bin/env bash
# Set up (if needed) and run the default test suite, lint and type checks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "dev,serve,ray"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy src tests benchmarks
.venv/bin/python -m pytest -q "$@"
