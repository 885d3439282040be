"""benchmarks/sim_memory.py: the heap walk sizes each object once, keeps to its part, and
charges a run's memory to the parts that hold it."""

from __future__ import annotations

import argparse
import sys

import pytest

from evinfra.policy.evolving.kv_manager import AgentKVManager
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation
from tests.scripts import load_script

sim_memory = load_script("benchmarks/sim_memory.py", "sim_memory")


def test_walk_sizes_each_object_once_and_stops_at_other_roots() -> None:
    hub = object()
    blob = bytearray(10_000)
    first = [blob, hub]
    second = [blob, bytearray(3_000)]
    other_root = [bytearray(50_000)]
    third = [other_root]
    walk = sim_memory.HeapWalk(hub=hub)
    boundary = {id(first), id(second), id(third), id(other_root)}
    b1, n1 = walk.size([first], boundary)
    assert n1 == 2  # the list and the blob: the hub is never entered
    assert b1 == sys.getsizeof(first) + sys.getsizeof(blob)
    b2, n2 = walk.size([second], boundary)
    assert n2 == 2 and b2 < 10_000  # the blob was the first part's
    b3, n3 = walk.size([third], boundary)
    assert n3 == 1 and b3 < 50_000  # another part's root is not entered
    b4, _ = walk.size([other_root], boundary)
    assert b4 >= 50_000


def _args() -> argparse.Namespace:
    """The script's own load defaults (coding, Kimi-K2 on GB300, 1/16 sessions/s a GPU)."""
    p = argparse.ArgumentParser()
    sim_memory.add_load_args(p)
    return p.parse_args([])


def test_a_run_is_charged_to_the_parts_that_hold_it() -> None:
    cfg = sim_memory.load_config("evolving", 16, 60.0, 0.0, _args())
    built: list[Simulation] = []
    run_sim(cfg, prepare=built.append)
    (sim,) = built
    sized = {p.label: p for p in sim_memory.walk_parts(sim)}
    records = sized["per-call records (metrics)"]
    num_calls = len(sim.metrics.records)
    assert num_calls > 50
    # every record and its dict slot, nothing else's: a record is in no other part
    one = next(iter(sim.metrics.records.values()))
    assert records.num_objects >= num_calls and records.num_bytes >= num_calls * sys.getsizeof(one)
    pools = [node.sched.pool for node in sim.nodes]
    tables = sized["KV pools: device tables (hash, refs, index)"]
    assert tables.num_bytes >= sum(sys.getsizeof(p._index) + sys.getsizeof(p._hash) for p in pools)
    # the block index's tables are its own, not the pools' listeners'
    index = sized["cluster block index"]
    assert index.num_bytes >= sys.getsizeof(vars(sim.block_index)["_device"])
    # evolving's session table is the KV manager's, not the eviction scorers' around it
    manager_obj = sim.bundle.kv_manager
    assert isinstance(manager_obj, AgentKVManager)
    table = manager_obj.table
    manager = sized["KV manager (session table)"]
    assert manager.num_bytes >= sys.getsizeof(table.owner) + sys.getsizeof(table.sessions)
    ever = sized["blocks ever computed (metrics: recomputed tokens)"]
    assert ever.num_bytes >= sys.getsizeof(sim._ever_computed)
    assert all(p.num_bytes >= 0 for p in sized.values())


def test_report_and_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_memory.main(["--gpus", "16", "--duration-s", "30"]) == 0
    out = capsys.readouterr().out
    assert "| per-call records (metrics) |" in out and "RSS after the walk" in out
    with pytest.raises(SystemExit):
        sim_memory.main(["--gpus", "0"])
    assert "--gpus must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sim_memory.main(["--system", "nope", "--duration-s", "10"])
    assert "unknown system 'nope'" in capsys.readouterr().err
