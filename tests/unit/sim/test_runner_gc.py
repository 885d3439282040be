"""run_sim pauses Python's cyclic garbage collector while the events run and restores
it afterwards, whatever its state was."""

from __future__ import annotations

import gc

import pytest

from evinfra.sim.config import load_config
from evinfra.sim.runner import run_sim

SMALL = {
    "workload": "coding", "model": "tiny", "gpu": "h200", "num_gpus": 2,
    "gpus_per_node": 1, "block_size": 16, "cost_model": "dynamo-polynomial",
    "concurrency": 2, "duration_s": 5.0, "warmup_s": 0.0, "drain_s": 5.0,
    "system": "aggregated",
}  # fmt: skip


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_during_the_run_and_restored(enabled: bool) -> None:
    seen: list[bool] = []
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        run_sim(load_config(None, SMALL), progress=lambda _t, _n: seen.append(gc.isenabled()))
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
    assert seen and not any(seen)
