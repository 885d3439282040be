"""Shared helpers for the workload tests."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES
