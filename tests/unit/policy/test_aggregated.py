"""`aggregated`: all MIXED, KV-aware routing with the full cost, LRU, no planner."""

from __future__ import annotations

import pytest

from evinfra.core.types import Role, Route
from evinfra.policy.aggregated import AggregatedKVRouter, make_aggregated
from evinfra.policy.bundle import ClusterShape, available_systems, make_system
from evinfra.policy.dynamo.cost import KvRouterConfig
from evinfra.policy.simple import LRUKVManager
from tests.unit.policy.dynamo_fakes import FakeNode, cached, cluster, make_request

SHAPE = ClusterShape(4, 16, 1000, 0, 1024, 8192, 256)


def test_bundle_shape() -> None:
    b = make_aggregated(SHAPE, {})
    assert b.initial_roles == [Role.MIXED] * 4
    assert b.planner is None
    assert isinstance(b.kv_manager, LRUKVManager)
    assert isinstance(b.router, AggregatedKVRouter)
    assert not b.host_tier
    with pytest.raises(ValueError, match="planner"):
        make_aggregated(SHAPE, {"planner": "sla"})


def test_routes_by_full_cost_on_one_worker() -> None:
    # 10-block request. A: 8 cached, decode 9, queue 0 -> 2 + 9 = 11
    # B: 5 cached, decode 5, queue 32 tokens -> (2 + 10 - 5) + 5 = 12
    # C: 0 cached, decode 0 -> 10
    a = FakeNode(0, role=Role.MIXED, num_decode_blocks=9, device_hashes=cached(8))
    b = FakeNode(
        1,
        role=Role.MIXED,
        num_decode_blocks=5,
        num_waiting_prefill_tokens=32,
        device_hashes=cached(5),
    )
    c = FakeNode(2, role=Role.MIXED)
    router = AggregatedKVRouter(KvRouterConfig())
    assert router.route(make_request(), cluster(a, b, c), 0.0) == Route(2, 2)
    busier_c = FakeNode(2, role=Role.MIXED, num_decode_blocks=2)  # 12 > A's 11
    assert router.route(make_request(), cluster(a, b, busier_c), 0.0) == Route(0, 0)


def test_stopped_nodes_are_skipped() -> None:
    router = AggregatedKVRouter(KvRouterConfig())
    view = cluster(
        FakeNode(0, role=Role.MIXED, is_serving=False),
        FakeNode(1, role=Role.MIXED, num_decode_blocks=99),
    )
    assert router.route(make_request(), view, 0.0) == Route(1, 1)


def test_registered_through_the_lead_registry() -> None:
    import evinfra.policy.aggregated
    import evinfra.policy.dynamo.bundles  # noqa: F401

    names = available_systems()
    assert {"aggregated", "dynamo", "dynamo-agentic"} <= set(names)
    assert make_system("aggregated", SHAPE).name == "aggregated"
