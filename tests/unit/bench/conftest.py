"""Small scenarios for the bench tests: the tiny model on two one-GPU nodes, seconds of
simulated time, so a whole benchmark runs in about a second."""

from __future__ import annotations

from typing import Any

import pytest


def make_scenario_data(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "tiny",
        "description": "tiny test scenario",
        "base": {
            "workload": "coding",
            "model": "tiny",
            "gpu": "h100",
            "num_gpus": 2,
            "gpus_per_node": 1,
            "session_rate": 1.0,
            "duration_s": 20,
            "warmup_s": 2,
            "drain_s": 30,
        },
        "systems": ["evolving", "dynamo", "oracle"],
        "seeds": [0],
    }
    data.update(overrides)
    return data


@pytest.fixture
def scenario_data() -> dict[str, Any]:
    return make_scenario_data()
