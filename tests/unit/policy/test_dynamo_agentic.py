"""`dynamo-agentic`: sticky sessions with an idle TTL, expected-output load, TTL prefix
pinning and priority eviction (exact eviction orders)."""

from __future__ import annotations

import pytest

from evinfra.core.kv_pool import KVPool
from evinfra.core.types import Role, Route
from evinfra.policy.dynamo.cost import KvRouterConfig, Phase
from evinfra.policy.dynamo.disagg import IslBounding
from evinfra.policy.dynamo.kv import AgenticKVManager
from evinfra.policy.dynamo.router import DynamoRouter
from evinfra.policy.dynamo.sessions import AgentRouterState, SessionAffinity
from tests.unit.policy.dynamo_fakes import FakeCluster, FakeNode, cluster, make_request


def _router(ttl_s: float = 300.0) -> tuple[DynamoRouter, AgentRouterState, AgenticKVManager]:
    agent = AgentRouterState(SessionAffinity(ttl_s), track_output=True)
    kv = AgenticKVManager(agent, pin_ttl_s=300.0, max_pinned_blocks_per_node=100)
    return DynamoRouter(KvRouterConfig(), IslBounding(enabled=False), agent=agent), agent, kv


def _view(load_1: int, load_2: int) -> FakeCluster:
    return cluster(
        FakeNode(0, role=Role.PREFILL),
        FakeNode(1, num_decode_blocks=load_1),
        FakeNode(2, num_decode_blocks=load_2),
    )


def test_sticky_session_until_idle_ttl_expires() -> None:
    router, _, kv = _router(ttl_s=300.0)
    first = make_request(1, session_id="s")
    assert router.route(first, _view(0, 5), 0.0) == Route(0, 1)  # binds s -> node 1
    kv.on_finish(first, 1, 10.0)  # idle timer starts at 10 s
    # node 1 is now the busier one, but the session stays until 10 + 300 s
    assert router.route(make_request(2, session_id="s"), _view(50, 5), 309.0).decode_node == 1
    kv.on_finish(make_request(2, session_id="s"), 1, 309.5)  # restarts the idle timer
    assert router.route(make_request(3, session_id="s"), _view(50, 5), 609.0).decode_node == 1
    kv.on_finish(make_request(3, session_id="s"), 1, 609.0)
    # idle for exactly the TTL: expired, the cheapest worker is chosen and bound
    assert router.route(make_request(4, session_id="s"), _view(50, 5), 909.0).decode_node == 2
    # other sessions were never bound
    assert router.route(make_request(5, session_id="t"), _view(50, 5), 909.0).decode_node == 2


def test_active_request_prevents_expiry() -> None:
    router, agent, _ = _router(ttl_s=300.0)
    router.route(make_request(1, session_id="s"), _view(0, 5), 0.0)
    # request 1 never finished: the binding holds long past the TTL
    assert router.route(make_request(2, session_id="s"), _view(50, 5), 5000.0).decode_node == 1
    assert agent.affinity is not None
    assert agent.affinity.lookup("s", Phase.DECODE, 5000.0) == 1


def test_binding_to_a_stopped_worker_is_dropped() -> None:
    router, agent, _ = _router()
    router.route(make_request(1, session_id="s"), _view(0, 5), 0.0)
    stopped = cluster(
        FakeNode(0, role=Role.PREFILL),
        FakeNode(1, is_serving=False),
        FakeNode(2, num_decode_blocks=5),
    )
    assert router.route(make_request(2, session_id="s"), stopped, 1.0).decode_node == 2
    assert agent.affinity is not None
    assert agent.affinity.lookup("s", Phase.DECODE, 1.0) == 2


def test_prefill_and_decode_bindings_are_phase_local() -> None:
    router, agent, _ = _router()
    view = cluster(
        FakeNode(0, role=Role.PREFILL),
        FakeNode(3, role=Role.PREFILL, num_waiting_prefill_tokens=16),
        FakeNode(1),
    )
    assert router.route(make_request(1, session_id="s"), view, 0.0) == Route(0, 1)
    assert agent.affinity is not None
    assert agent.affinity.lookup("s", Phase.PREFILL, 0.0) == 0
    assert agent.affinity.num_bindings() == 2


def test_expected_output_blocks_count_as_decode_load_until_finish() -> None:
    router, _, kv = _router()
    long_output = make_request(1, session_id="a", expected_output_tokens=1600)  # 100 blocks
    assert router.route(long_output, _view(10, 10), 0.0).decode_node == 1
    # node 1 now carries 10 + 100 expected blocks: an equal-looking request goes to node 2
    assert router.route(make_request(2, session_id="b"), _view(10, 10), 1.0).decode_node == 2
    kv.on_finish(long_output, 1, 2.0)
    assert router.route(make_request(3, session_id="c"), _view(10, 10), 3.0).decode_node == 1


def _pool_with_two_sequences(kv: AgenticKVManager) -> KVPool:
    """Blocks 0-2 hold A's prompt (hashes 0, 1, 2), blocks 3-5 B's (hashes 10, 11, 12)."""
    pool = KVPool(6, eviction=kv.eviction_for(0))
    a = pool.try_allocate(3)
    b = pool.try_allocate(3)
    assert a == [0, 1, 2] and b == [3, 4, 5]
    for block_id, h in zip(a + b, (0, 1, 2, 10, 11, 12), strict=True):
        pool.commit(block_id, h)
    return pool


def _eviction_order(pool: KVPool) -> list[int]:
    victims = pool.try_allocate(6)
    assert victims is not None
    return victims


def _manager(budget: int = 100) -> AgenticKVManager:
    agent = AgentRouterState(SessionAffinity(300.0), track_output=False)
    return AgenticKVManager(agent, pin_ttl_s=300.0, max_pinned_blocks_per_node=budget)


REQ_A = make_request(1, num_blocks=3, session_id="a", first_hash=0)
REQ_B = make_request(2, num_blocks=3, session_id="b", first_hash=10)


def test_unpinned_order_is_lru_tail_first() -> None:
    kv = _manager()
    pool = _pool_with_two_sequences(kv)
    pool.free([0, 1, 2])
    pool.free([3, 4, 5])
    assert _eviction_order(pool) == [2, 1, 0, 5, 4, 3]
    pool.check_integrity()


@pytest.mark.parametrize("pin_before_free", [True, False])
def test_pinned_prefix_outlives_unpinned_blocks(pin_before_free: bool) -> None:
    kv = _manager()
    pool = _pool_with_two_sequences(kv)
    if pin_before_free:
        kv.on_finish(REQ_A, 0, 0.0)
    pool.free([0, 1, 2])
    pool.free([3, 4, 5])
    if not pin_before_free:
        kv.on_finish(REQ_A, 0, 0.0)  # rescored after the blocks became evictable
    assert kv.is_pinned(0, 0) and not kv.is_pinned(0, 10)
    assert _eviction_order(pool) == [5, 4, 3, 2, 1, 0]


def test_pin_expires_after_ttl_and_refreshes_on_repin() -> None:
    kv = _manager()
    pool = _pool_with_two_sequences(kv)
    kv.on_finish(REQ_A, 0, 0.0)  # pinned until 300 s
    pool.free([0, 1, 2])
    pool.free([3, 4, 5])
    kv.on_tick(cluster(), 299.0)
    assert kv.is_pinned(0, 2)
    kv.on_tick(cluster(), 300.0)  # TTL over: back to plain LRU, A freed first
    assert not kv.is_pinned(0, 2)
    assert _eviction_order(pool) == [2, 1, 0, 5, 4, 3]

    kv2 = _manager()
    pool2 = _pool_with_two_sequences(kv2)
    kv2.on_finish(REQ_A, 0, 0.0)
    kv2.on_finish(REQ_A, 0, 200.0)  # refresh: pinned until 500 s
    pool2.free([0, 1, 2])
    pool2.free([3, 4, 5])
    kv2.on_tick(cluster(), 300.0)
    assert _eviction_order(pool2) == [5, 4, 3, 2, 1, 0]


def test_pin_over_budget_is_rejected() -> None:
    kv = _manager(budget=2)
    pool = _pool_with_two_sequences(kv)
    kv.on_finish(REQ_A, 0, 0.0)  # 3 blocks > budget 2: rejected whole
    assert kv.num_rejected_pins == 1
    pool.free([0, 1, 2])
    pool.free([3, 4, 5])
    assert _eviction_order(pool) == [2, 1, 0, 5, 4, 3]


def test_pins_are_per_worker_and_need_hints() -> None:
    kv = _manager()
    kv.on_finish(REQ_A, 3, 0.0)
    assert kv.is_pinned(3, 0) and not kv.is_pinned(0, 0)
    kv.on_finish(make_request(7, num_blocks=3, first_hash=10), 3, 0.0)  # no hints: no pin
    assert not kv.is_pinned(3, 10)


def test_priority_orders_unpinned_eviction() -> None:
    kv = _manager()
    pool = _pool_with_two_sequences(kv)
    kv.on_arrival(make_request(1, num_blocks=3, session_id="a", priority=5), 0.0)
    pool.free([0, 1, 2])
    pool.free([3, 4, 5])
    # A's blocks carry priority 5, B's 0: B goes first despite being freed later
    assert _eviction_order(pool) == [5, 4, 3, 2, 1, 0]
    # pins rank above any priority
    kv2 = _manager()
    pool2 = _pool_with_two_sequences(kv2)
    kv2.on_arrival(make_request(1, num_blocks=3, session_id="a", priority=5), 0.0)
    pool2.free([0, 1, 2])
    pool2.free([3, 4, 5])
    kv2.on_finish(REQ_B, 0, 1.0)
    assert _eviction_order(pool2) == [2, 1, 0, 5, 4, 3]


def test_pin_ttl_bounds() -> None:
    agent = AgentRouterState(None, track_output=False)
    with pytest.raises(ValueError, match="pin_ttl_s"):
        AgenticKVManager(agent, pin_ttl_s=60.0, max_pinned_blocks_per_node=1)
    with pytest.raises(ValueError):
        SessionAffinity(0.0)
