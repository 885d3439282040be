"""benchmarks/ttft_wait.py: a call's own prefill, chunk by chunk, and the per-kind table."""

from __future__ import annotations

from pathlib import Path

import pytest

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.registry import make_cost_model
from evinfra.sim.metrics import RequestRecord
from tests.scripts import load_script

SCENARIO = """
name: tiny-ttft
description: two systems on two tiny nodes
base:
  workload: coding
  model: tiny
  gpu: h200
  num_gpus: 2
  gpus_per_node: 1
  block_size: 16
  cost_model: dynamo-polynomial
  duration_s: 6
  warmup_s: 1
  drain_s: 5
systems: [evolving, dynamo]
seeds: [0]
sweep:
  field: concurrency
  values: [1, 2]
"""


def test_own_prefill_is_the_uncached_tokens_chunk_by_chunk() -> None:
    script = load_script("benchmarks/ttft_wait.py", "ttft_wait")
    cost = make_cost_model("roofline", NodeSpec.from_names("tiny", "h100", 1, block_size=16))
    record = RequestRecord(1, "s", "coding", 0.0, 1000, 10, num_cached_tokens=200)
    chunks = [(300, 200), (300, 500), (200, 800)]
    expected = sum(cost.step_time_s(BatchShape((PrefillChunk(n, c),))) for n, c in chunks)
    assert script.own_prefill_s(cost, record, 300) == pytest.approx(expected)
    whole = cost.step_time_s(BatchShape((PrefillChunk(800, 200),)))
    assert script.own_prefill_s(cost, record, 8192) == pytest.approx(whole)
    cached = RequestRecord(2, "s", "coding", 0.0, 1000, 10, num_cached_tokens=1000)
    one = cost.step_time_s(BatchShape((PrefillChunk(1, 1000),)))
    assert script.own_prefill_s(cost, cached, 300) == pytest.approx(one)


def test_table_per_system_and_kind_at_one_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("benchmarks/ttft_wait.py", "ttft_wait")
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    assert script.main([str(path), "--at", "2"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| ")]
    rows = [[c.strip() for c in x.strip("|").split("|")] for x in lines[2:]]
    assert {(r[0], r[1]) for r in rows} == {
        (s, k) for s in ("evolving", "dynamo") for k in ("coding", "all")
    }
    for r in rows:
        p50, p95, own = float(r[3]), float(r[4]), float(r[5])
        assert own > 0 and 0 < p50 <= p95
    assert script.main([str(path)]) == 2  # a sweep needs its point
    assert "--at" in capsys.readouterr().err
    assert script.main([str(path), "--at", "5"]) == 2
    assert script.main([str(tmp_path / "missing.yaml")]) == 2
