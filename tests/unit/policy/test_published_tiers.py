"""Agent-aware eviction across a process boundary: the KV manager publishes tiers
(`ScoreBlocks`), a node's `PublishedTiers` orders by them, and the victims are the ones the
in-process strategy (reading the session table directly) picks."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import cast

import pytest

from evinfra.core.kv_pool import KVPool
from evinfra.core.types import AgentHints, Request
from evinfra.policy.base import ClusterView, KVAction, ScoreBlocks
from evinfra.policy.evolving.kv_manager import AgentKVManager, KVManagerConfig
from evinfra.policy.evolving.sessions import TIER_ACTIVE, TIER_AWAY, TIER_SHARED, SessionTable
from evinfra.policy.published import PublishedTiers, ScoreSink

TIERS = (TIER_AWAY, TIER_ACTIVE, TIER_SHARED)


def make_tiers() -> PublishedTiers:
    return PublishedTiers(TIERS, default=TIER_ACTIVE)


def req(rid: int, sid: str, prompt: tuple[int, ...], tool_s: float, **kw: object) -> Request:
    hints = AgentHints(sid, expected_tool_s=tool_s, **kw)  # type: ignore[arg-type]
    return Request(rid, prompt, len(prompt) * 16, 8, (), hints)


def fill(pool: KVPool, hashes: tuple[int, ...]) -> list[int]:
    ids = pool.try_allocate(len(hashes))
    assert ids is not None
    for i, h in zip(ids, hashes, strict=True):
        pool.commit(i, h)
    return ids


def use(pool: KVPool, hashes: tuple[int, ...]) -> list[int]:
    """A request's blocks: its cached prefix acquired, the rest allocated and committed."""
    n = pool.match_prefix(hashes).num_device_blocks
    ids = pool.try_acquire_and_allocate(hashes[:n], len(hashes) - n)
    assert ids is not None
    for i, h in zip(ids[n:], hashes[n:], strict=True):
        pool.commit(i, h)
    return ids


def deliver(actions: list[KVAction], pools: dict[int, KVPool]) -> None:
    """What the servers' runtime and worker do with the manager's tier messages."""
    for a in actions:
        if isinstance(a, ScoreBlocks):
            sink = pools[a.node_id].eviction
            assert isinstance(sink, ScoreSink)
            sink.set_scores(a.score, pickle.loads(pickle.dumps(a)).hashes)


# -- the node's side -----------------------------------------------------------------------
def test_published_tiers_order_victims_and_rerank_scored_candidates() -> None:
    tiers = make_tiers()
    pool = KVPool(6, eviction=tiers)
    ids = fill(pool, (1, 2, 3, 4, 5, 6))
    pool.free(ids)  # tail first: LRU would evict 6, 5, 4...
    tiers.set_scores(TIER_SHARED, (1, 2))
    tiers.set_scores(TIER_AWAY, (5,))
    assert tiers.order() == [ids[4], ids[5], ids[3], ids[2], ids[1], ids[0]]
    assert pool.try_allocate(1) is not None and not pool.holds(5)
    # a candidate already ranked moves when its tier is published again
    tiers.set_scores(TIER_AWAY, (2,))
    tiers.set_scores(TIER_ACTIVE, (1,))  # back to the default: the entry goes
    assert tiers.score(1) == TIER_ACTIVE and tiers.score(2) == TIER_AWAY
    assert tiers.order() == [ids[1], ids[5], ids[3], ids[2], ids[0]]
    pool.check_integrity()


def test_a_free_forgets_the_tier_and_unknown_tiers_are_refused() -> None:
    tiers = make_tiers()
    pool = KVPool(4, eviction=tiers)
    ids = fill(pool, (7, 8))
    tiers.set_scores(TIER_AWAY, (7,))
    pool.free(ids)  # a request used block 7 since: its old tier is stale
    assert tiers.score(7) == TIER_ACTIVE
    with pytest.raises(ValueError, match="not one of the tiers"):
        tiers.set_scores(5.0, (8,))
    with pytest.raises(ValueError, match="default tier"):
        PublishedTiers(TIERS, default=3.0)


def test_scores_of_content_no_longer_held_are_pruned() -> None:
    tiers = make_tiers()
    KVPool(4, eviction=tiers)  # binds the pool's index
    tiers.set_scores(TIER_AWAY, range(10_000))
    assert tiers.num_scores == 0  # nothing of it is held: forgotten past the watermark


def test_survives_pickling_with_its_scores() -> None:
    tiers = make_tiers()
    tiers.set_scores(TIER_SHARED, (3,))
    copy = pickle.loads(pickle.dumps(tiers))
    copy.set_scores(TIER_AWAY, (4,))
    assert (copy.score(3), copy.score(4), tiers.score(4)) == (TIER_SHARED, TIER_AWAY, TIER_ACTIVE)


# -- the manager's side --------------------------------------------------------------------
def scores(actions: list[KVAction]) -> list[KVAction]:
    return [a for a in actions if isinstance(a, ScoreBlocks)]


def publishing() -> AgentKVManager:
    return AgentKVManager(SessionTable(), KVManagerConfig(publish_scores=True))


def test_manager_publishes_a_tier_change_once_per_session_event() -> None:
    kv = publishing()
    r1 = req(1, "s", (1, 2, 3), tool_s=300.0)
    assert kv.on_arrival(r1, 0.0) == []  # nothing marked yet: nothing to say
    kv.table.note_route(1, (0, 1))
    # away for five minutes: its blocks are away on both nodes it used
    assert kv.on_finish(r1, 0, 1.0) == [
        ScoreBlocks(0, TIER_AWAY, (1, 2, 3)),
        ScoreBlocks(1, TIER_AWAY, (1, 2, 3)),
    ]
    assert kv.on_tick(object(), 2.0) == []  # type: ignore[arg-type]  # unchanged: silent
    # 30 s before its expected return (301 s) it is active again
    assert kv.on_tick(object(), 271.5) == [  # type: ignore[arg-type]
        ScoreBlocks(0, TIER_ACTIVE, (1, 2, 3)),
        ScoreBlocks(1, TIER_ACTIVE, (1, 2, 3)),
    ]
    # long overdue: away again; then its last turn ends it (orphans: away)
    overdue = scores(kv.on_tick(object(), 332.0))  # type: ignore[arg-type]
    assert [a.score for a in overdue if isinstance(a, ScoreBlocks)] == [TIER_AWAY] * 2
    r2 = req(2, "s", (1, 2, 3, 4), tool_s=1.0, is_last_turn=True)
    back = kv.on_arrival(r2, 400.0)
    assert back == [ScoreBlocks(0, TIER_ACTIVE, (1, 2, 3)), ScoreBlocks(1, TIER_ACTIVE, (1, 2, 3))]
    kv.table.note_route(2, (0,))
    assert kv.on_finish(r2, 0, 401.0) == [
        ScoreBlocks(0, TIER_AWAY, (1, 2, 3, 4)),
        ScoreBlocks(1, TIER_AWAY, (1, 2, 3, 4)),
    ]
    assert kv.publisher is not None and kv.publisher.num_actions == 10


def test_a_shared_prefix_is_published_shared() -> None:
    kv = publishing()
    a, b = req(1, "a", (1, 2, 10), tool_s=1.0), req(2, "b", (1, 2, 20), tool_s=1.0)
    for r in (a, b):
        kv.on_arrival(r, 0.0)
        kv.table.note_route(r.request_id, (0,))
    assert kv.on_finish(a, 0, 1.0) == []  # active: the default, nothing to send
    assert kv.on_finish(b, 0, 1.0) == [ScoreBlocks(0, TIER_SHARED, (1, 2))]


# -- both paths pick the same victims ------------------------------------------------------
Script = Callable[[AgentKVManager, dict[int, KVPool], Callable[[list[KVAction]], None]], None]


def agent_day(kv: AgentKVManager, pools: dict[int, KVPool], apply: Callable[..., None]) -> None:
    """Sessions of every kind on two nodes of 12 blocks; two come back after the others
    went overdue; then allocations take every block (evicting all cached content)."""
    sessions = [
        ("soon", 0, (1, 2, 3), 2.0, {}),  # comes back below
        ("human", 1, (1, 2, 4, 5), 120.0, {}),  # a human turn: away until 30 s before
        ("done", 0, (1, 6, 7), 1.0, {"is_last_turn": True}),  # ended: orphans
        ("late", 1, (8, 9), 5.0, {}),  # will go long overdue
        ("other", 1, (1, 2, 3, 11), 3.0, {}),  # shares soon's prefix; comes back below
    ]
    returns = [
        ("soon", 0, (1, 2, 3, 12), 2.0, {}),
        ("other", 1, (1, 2, 3, 11, 13), 3.0, {}),
        ("bye", 0, (14, 15), 1.0, {"is_last_turn": True}),  # freed last, away at once
        ("lunch", 1, (16, 17), 600.0, {}),
    ]
    t = 0.0
    for rid, (sid, node, prompt, tool_s, kw) in enumerate(sessions + returns):
        if rid == len(sessions):
            t = 40.0  # everyone is past 30 s overdue now
            apply(kv.on_tick(cast(ClusterView, object()), t))  # its tick reads no view
        r = req(rid, sid, prompt, tool_s, **kw)
        apply(kv.on_arrival(r, t))
        kv.table.note_route(rid, (node,))
        ids = use(pools[node], prompt)
        t += 0.5
        pools[node].free(ids)
        apply(kv.on_finish(r, node, t))
    for pool in pools.values():
        while pool.num_free_blocks:  # take every block: the victims in eviction order
            assert pool.try_allocate(1) is not None
        pool.check_integrity()


def victims(script: Script, publish: bool, deliver_scores: bool = True) -> list[list[int]]:
    """The hashes each node evicts, in order, with the tiers read in process or published
    (and delivered as the servers do, or dropped: what a worker running LRU gets)."""
    kv = AgentKVManager(SessionTable(), KVManagerConfig(publish_scores=publish))
    pools = {n: KVPool(12, eviction=kv.eviction_for(n)) for n in (0, 1)}
    order: dict[int, list[int]] = {0: [], 1: []}
    for n, pool in pools.items():
        original = pool.eviction.pop_many

        def pop_many(
            num_blocks: int, original: Callable[[int], list[int]] = original, n: int = n
        ) -> list[int]:
            blocks = original(num_blocks)
            order[n] += [pools[n].hash_of(block) or -1 for block in blocks]
            return blocks

        pool.eviction.pop_many = pop_many  # type: ignore[method-assign]
    delivered = publish and deliver_scores
    script(kv, pools, lambda actions: deliver(actions, pools) if delivered else None)
    return [order[0], order[1]]


def test_published_and_in_process_tiers_evict_the_same_blocks_in_the_same_order() -> None:
    direct = victims(agent_day, publish=False)
    assert victims(agent_day, publish=True) == direct
    # the agent-aware order: ended and overdue sessions first (away), then the
    # sessions back from their tools (active), the prefix many share last
    assert direct == [[7, 6, 15, 14, 12, 3, 2, 1], [5, 4, 9, 8, 17, 16, 13, 11, 3, 2, 1]]
    # undelivered, the node orders least recently freed first: the session that just
    # ended and the one gone to lunch outlive the ones that came back
    undelivered = victims(agent_day, publish=True, deliver_scores=False)
    assert undelivered == [[7, 6, 12, 3, 2, 1, 15, 14], [5, 4, 9, 8, 13, 11, 3, 2, 1, 17, 16]]


# -- the simulator through the servers' path -----------------------------------------------
def side_by_side_sim(tier_messages: bool) -> tuple[dict[str, float | int], int]:
    """The side-by-side run's simulated evinfra (2 nodes of 2,048 blocks, 24 coding
    sessions, 60 s), eviction read in process or through published tiers; its summary
    and the number of tier batches published."""
    from evinfra.sim.config import load_config
    from evinfra.sim.metrics import summarize
    from evinfra.sim.runner import build_node_spec, build_simulation

    options = {"host_tier": False, "pull_prefix": False, "tier_messages": tier_messages}
    node = {"model": "tiny", "gpu": "h200", "num_gpus": 2, "gpus_per_node": 1, "block_size": 16,
            "duration_s": 60.0, "warmup_s": 0.0}  # fmt: skip
    total = build_node_spec(load_config(None, node)).num_device_blocks
    cfg = load_config(None, {
        **node, "system": "evolving", "system_options": options,
        "kv_capacity_scale": 2048.5 / total, "max_num_batched_tokens": 2048,
        "cost_model": "dynamo-polynomial", "drain_s": 20.0,
        "cost_options": {"kv_capacity_tokens": 32768, "utilisation_source": "decode_context"},
        "workload": "coding", "concurrency": 24, "seed": 0,
    })  # fmt: skip
    sim, _ = build_simulation(cfg)
    summary = summarize(sim.run(), warmup_s=0.0, end_s=60.0, num_gpus=2)
    kv = sim.bundle.kv_manager
    assert isinstance(kv, AgentKVManager)
    return summary, 0 if kv.publisher is None else kv.publisher.num_actions


def test_the_simulator_through_published_tiers_matches_reading_them_in_process() -> None:
    """The same run both ways: the same requests, latencies and hits (the servers' path
    can differ only where a tier changes by time alone between ticks, not here)."""
    (direct, none), (published, num_batches) = side_by_side_sim(False), side_by_side_sim(True)
    assert none == 0 and num_batches > 20
    for key in ("num_requests", "mean_e2e_s", "p95_ttft_s", "kv_hit_rate", "recomputed_tokens"):
        assert published[key] == direct[key], key
    assert direct["recomputed_tokens"] > 0  # KV under pressure: eviction mattered
