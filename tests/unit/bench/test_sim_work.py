"""benchmarks/sim_work.py: the per-call KV work it reports is the simulation's own."""

from __future__ import annotations

import argparse

import pytest

from evinfra.sim.config import SimConfig
from evinfra.sim.runner import run_sim
from tests.scripts import load_script

sim_work = load_script("benchmarks/sim_work.py", "sim_work")


def _args(kv_capacity_scale: float) -> argparse.Namespace:
    return argparse.Namespace(
        workload="coding",
        model="kimi-k2",
        gpu="gb300",
        rate_per_gpu=1 / 16,
        duration_s=90.0,
        seed=0,
        block_size=64,
        kv_capacity_scale=kv_capacity_scale,
    )


def test_moved_bytes_and_evictions_are_the_runs() -> None:
    args = _args(0.005)
    m = sim_work.measure("evolving", 16, args)
    cfg = SimConfig(
        system="evolving",
        workload="coding",
        model="kimi-k2",
        gpu="gb300",
        num_gpus=16,
        session_rate=1.0,
        duration_s=90.0,
        warmup_s=22.5,
        drain_s=0.0,
        seed=0,
        kv_capacity_scale=0.005,
    )
    summary = run_sim(cfg).summary
    calls = m["calls"]
    assert calls > 100
    assert m["link_mb_per_call"] * calls * 1e6 == pytest.approx(summary["kv_link_bytes"])
    # a two-hundredth of the device KV: the pools evict, and a node's blocks go to its host tier
    assert m["evicted_per_call"] > 1.0
    assert m["offloaded_per_call"] > 0.0
    assert 0.0 <= m["local_prefills_per_call"] <= 1.0
    unpressed = sim_work.measure("evolving", 16, _args(1.0))
    assert unpressed["evicted_per_call"] == 0.0


def test_dynamo_has_no_local_prefill_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_work.main(["--systems", "dynamo", "--gpus", "16", "--duration-s", "30"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split("|")
    assert row[1].strip() == "dynamo" and row[-2].strip() == "-"


def test_bad_duration_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sim_work.main(["--duration-s", "0"])
    assert "--duration-s must be positive" in capsys.readouterr().err
