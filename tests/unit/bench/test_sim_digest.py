"""benchmarks/sim_digest.py: the same run gives the same digests, another seed others."""

from __future__ import annotations

from typing import Any

from evinfra.sim.config import load_config
from evinfra.sim.runner import run_sim
from tests.scripts import load_script

SMALL = {
    "workload": "coding", "model": "tiny", "gpu": "h200", "num_gpus": 2,
    "gpus_per_node": 1, "block_size": 16, "cost_model": "dynamo-polynomial",
    "concurrency": 2, "duration_s": 5.0, "warmup_s": 0.0, "drain_s": 5.0,
    "system": "evolving",
}  # fmt: skip


def digests(**overrides: Any) -> tuple[str, str]:
    script = load_script("benchmarks/sim_digest.py", "sim_digest")
    result = run_sim(load_config(None, {**SMALL, **overrides}))
    return script.summary_digest(result.summary), script.records_digest(result.metrics)


def test_same_run_same_digests_other_seed_others() -> None:
    first = digests()
    assert digests() == first
    other = digests(seed=1)
    assert other[0] != first[0] and other[1] != first[1]


def test_every_case_is_a_valid_config() -> None:
    script = load_script("benchmarks/sim_digest.py", "sim_digest")
    for overrides in script.CASES.values():
        script.make_config(overrides)
