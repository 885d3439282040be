"""Agent-aware eviction in the servers' node workers: the frontend's KV manager publishes
tiers (`SetBlockScores`), the worker's pool evicts by them."""

from __future__ import annotations

import pickle
import queue
from typing import Any

from evinfra.core.blocks import hash_token_blocks
from evinfra.core.eviction import LRUEviction
from evinfra.core.types import Request, Role
from evinfra.costmodel.base import BatchShape
from evinfra.policy.base import DropBlocks, ScoreBlocks
from evinfra.policy.evolving.sessions import TIER_ACTIVE, TIER_AWAY, TIER_SHARED
from evinfra.policy.published import PublishedTiers
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.protocol import (
    ApplyKV,
    Generation,
    KVActionKind,
    Sampling,
    SetBlockScores,
    Submit,
    kv_messages,
)
from evinfra.serve.runtime import ClusterConfig, LocalCluster, _picklable_eviction
from evinfra.serve.timed_executor import TimedExecutor
from evinfra.serve.worker import NodeWorker, WorkerSpec

BLOCK = 4
TIERS = (TIER_AWAY, TIER_ACTIVE, TIER_SHARED)


class NoCost:
    kv_capacity_tokens = 1 << 20
    kv_bytes_per_token = 8

    def step_time_s(self, batch: BatchShape) -> float:
        return 0.0


def make_worker(eviction: Any, num_blocks: int = 8) -> NodeWorker:
    spec = WorkerSpec(
        0, Role.MIXED, ExecutorSpec(), num_blocks, BLOCK, eviction=eviction, check_integrity=True
    )
    executor = TimedExecutor(NoCost(), num_blocks, BLOCK, 300)  # type: ignore[arg-type]
    inbox: queue.Queue[Any] = queue.Queue()
    return NodeWorker(spec, executor, inbox, queue.Queue(), [inbox])


def run_request(worker: NodeWorker, rid: int, prompt: list[int]) -> tuple[int, ...]:
    """Prefill and decode one token; returns the prompt's block hashes."""
    hashes = tuple(hash_token_blocks(prompt, BLOCK))
    request = Request(rid, hashes, len(prompt), 1)
    worker.handle(Submit(request, Generation(tuple(prompt), frozenset(), Sampling()), 0, rid))
    while worker.step():
        pass
    assert worker.sched.is_idle
    return hashes


def held(worker: NodeWorker, hashes: tuple[int, ...]) -> list[bool]:
    return [worker.sched.pool.holds(h) for h in hashes]


def pressure(eviction: Any, publish: bool) -> tuple[list[bool], list[bool]]:
    """Session `soon` runs, then `away` (freed last); the frontend marks `away`'s blocks
    away; a third request needs two of the four cached blocks."""
    worker = make_worker(eviction)
    soon = run_request(worker, 1, list(range(10, 18)))
    away = run_request(worker, 2, list(range(30, 38)))
    if publish:
        worker.handle(pickle.loads(pickle.dumps(SetBlockScores(TIER_AWAY, away))))
    run_request(worker, 3, list(range(50, 74)))  # 6 blocks on 4 empty: evicts 2
    worker.sched.check_integrity()
    return held(worker, soon), held(worker, away)


def test_worker_under_pressure_keeps_the_session_expected_back_and_evicts_the_away_one() -> None:
    soon, away = pressure(PublishedTiers(TIERS, TIER_ACTIVE), publish=True)
    assert soon == [True, True] and away == [False, False]


def test_without_the_tiers_the_worker_evicts_least_recently_freed() -> None:
    for eviction, publish in ((LRUEviction(), True), (PublishedTiers(TIERS, TIER_ACTIVE), False)):
        soon, away = pressure(eviction, publish)  # an LRU worker ignores the message
        assert soon == [False, False] and away == [True, True]


def test_kv_actions_become_worker_messages() -> None:
    assert kv_messages(ScoreBlocks(1, TIER_AWAY, (5, 6)), 3) == [
        (1, SetBlockScores(TIER_AWAY, (5, 6)))
    ]
    assert kv_messages(DropBlocks(None, (7,)), 2) == [
        (0, ApplyKV(KVActionKind.DROP, (7,))),
        (1, ApplyKV(KVActionKind.DROP, (7,))),
    ]


def test_the_servers_evolving_bundle_ships_published_tiers_to_its_workers() -> None:
    spec = ExecutorSpec(kind="timed", model="tiny")
    cost = node_cost_model(spec, 16)
    evolving = LocalCluster(ClusterConfig(spec, 2, "evolving", cost_model=cost))
    lru = LocalCluster(ClusterConfig(spec, 2, "evolving-lru", cost_model=cost))
    # (not started: no process is spawned)
    shipped = _picklable_eviction(evolving.bundle, 1)
    assert isinstance(pickle.loads(pickle.dumps(shipped)), PublishedTiers)
    assert isinstance(_picklable_eviction(lru.bundle, 1), LRUEviction)
