"""Dynamo's KV-router cost and selection, each checked against a hand-worked case."""

from __future__ import annotations

import math
import random

import pytest

from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Role, Route
from evinfra.policy.dynamo.cost import (
    KvRouterConfig,
    Phase,
    WorkerCost,
    eligible,
    select_worker,
    softmax_weights,
    worker_cost,
)
from evinfra.policy.dynamo.disagg import IslBounding
from evinfra.policy.dynamo.router import DynamoRouter
from tests.unit.policy.dynamo_fakes import FakeNode, cached, cluster, make_request

DEFAULT = KvRouterConfig()


def test_cost_formula_by_hand() -> None:
    # 160-token prompt = 10 blocks; 32 queued prefill tokens = 2 blocks;
    # 4 device hits (credit 4) and 2 host hits (credit 2 * 0.75 = 1.5): raw 12, adjusted 6.5
    node = FakeNode(
        0,
        num_waiting_prefill_tokens=32,
        num_decode_blocks=10,
        device_hashes=cached(4),
        host_hashes=cached(2, start=4),
    )
    request = make_request(num_blocks=10)
    assert worker_cost(request, node, Phase.AGGREGATED, DEFAULT).cost == pytest.approx(16.5)
    assert worker_cost(request, node, Phase.PREFILL, DEFAULT).cost == pytest.approx(6.5)
    assert worker_cost(request, node, Phase.DECODE, DEFAULT).cost == pytest.approx(10.0)
    with_credit = worker_cost(request, node, Phase.DECODE, DEFAULT, decode_overlap_credit=True)
    assert with_credit.cost == pytest.approx(4.5)
    scaled = KvRouterConfig(prefill_load_scale=2.0)
    assert worker_cost(request, node, Phase.AGGREGATED, scaled).cost == pytest.approx(23.0)


def test_adjusted_prefill_is_clamped_at_zero() -> None:
    # credit 10 (device) but a credit weight of 2 gives 20 > raw 10: adjusted stays 0
    node = FakeNode(0, num_decode_blocks=3, device_hashes=cached(10))
    config = KvRouterConfig(overlap_score_credit=2.0)
    assert worker_cost(make_request(), node, Phase.AGGREGATED, config).cost == 3.0


def test_partial_block_tokens_count_in_raw_prefill() -> None:
    # 10 full blocks + 8 tokens = 168 tokens = 10.5 blocks, no hits, no load
    node = FakeNode(0)
    cost = worker_cost(make_request(extra_tokens=8), node, Phase.PREFILL, DEFAULT)
    assert cost.cost == pytest.approx(10.5)


def test_dynamo_docs_example_picks_worker_two() -> None:
    # router-concepts.md: cached 2/5/8 of 10 blocks, decode 10/5/9 -> costs 18, 10, 11
    nodes = [
        FakeNode(1, num_decode_blocks=10, device_hashes=cached(2)),
        FakeNode(2, num_decode_blocks=5, device_hashes=cached(5)),
        FakeNode(3, num_decode_blocks=9, device_hashes=cached(8)),
    ]
    costs = [worker_cost(make_request(), n, Phase.AGGREGATED, DEFAULT) for n in nodes]
    assert [c.cost for c in costs] == [18.0, 10.0, 11.0]
    assert select_worker(costs, 0.0, random.Random(0)).node_id == 2


def test_host_hits_credit_three_quarters() -> None:
    # A: 4 device hits -> credit 4; B: 6 host hits -> credit 4.5: B is cheaper
    a = FakeNode(0, device_hashes=cached(4))
    b = FakeNode(1, host_hashes=cached(6))
    costs = [worker_cost(make_request(), n, Phase.PREFILL, DEFAULT) for n in (a, b)]
    assert [c.cost for c in costs] == [6.0, 5.5]
    assert select_worker(costs, 0.0, random.Random(0)).node_id == 1


def test_ties_at_temperature_zero_go_to_lowest_id() -> None:
    costs = [WorkerCost(5, 3.0, _m()), WorkerCost(2, 3.0, _m()), WorkerCost(9, 4.0, _m())]
    assert select_worker(costs, 0.0, random.Random(0)).node_id == 2


def test_softmax_weights_by_hand() -> None:
    # costs 0 and 1 at T=1: weights exp(0), exp(-1), normalised
    weights = softmax_weights([0.0, 1.0], 1.0)
    assert weights[0] == pytest.approx(1 / (1 + math.exp(-1)))
    assert softmax_weights([2.0, 2.0, 2.0], 0.5) == pytest.approx([1 / 3] * 3)
    # costs 0, 5, 10 at T=0.5: normalised 0, 0.5, 1 -> exp(0), exp(-1), exp(-2)
    w = softmax_weights([0.0, 5.0, 10.0], 0.5)
    total = 1 + math.exp(-1) + math.exp(-2)
    assert w == pytest.approx([1 / total, math.exp(-1) / total, math.exp(-2) / total])


def test_softmax_sampling_follows_the_weights() -> None:
    costs = [WorkerCost(0, 0.0, _m()), WorkerCost(1, 1.0, _m())]
    rng = random.Random(7)
    picks = [select_worker(costs, 1.0, rng).node_id for _ in range(4000)]
    assert picks.count(0) / 4000 == pytest.approx(1 / (1 + math.exp(-1)), abs=0.03)


def test_busy_thresholds_filter_workers() -> None:
    hot = FakeNode(0, num_decode_blocks=900, num_device_blocks=1000, device_hashes=cached(10))
    calm = FakeNode(1, num_decode_blocks=100, num_device_blocks=1000)
    queued = FakeNode(2, num_waiting_prefill_tokens=5000)
    config = KvRouterConfig(
        active_decode_blocks_threshold=0.85, active_prefill_tokens_threshold=4096
    )
    assert [n.node_id for n in eligible([hot, calm, queued], config)] == [1]
    frac = KvRouterConfig(active_prefill_tokens_threshold_frac=0.5, max_num_batched_tokens=8192)
    assert [n.node_id for n in eligible([calm, queued], frac)] == [1]  # 5000 > 4096
    # every worker busy: Dynamo would reject; evinfra keeps them all
    assert len(eligible([hot], config)) == 1
    # the cheapest worker (all 10 blocks cached) loses once filtered out
    router = DynamoRouter(config, IslBounding(enabled=False))
    view = cluster(FakeNode(9, role=Role.PREFILL), hot, calm)
    assert router.route(make_request(), view, 0.0).decode_node == 1


def test_recorded_disaggregated_scenario_matches_hand_costs() -> None:
    """2 prefill + 2 decode workers, block 16, conditional disagg on (2048 / 0.7).

    r1: 10 blocks, hits: P0 none, P1 6 device; D2 decode 20 blocks + 3 cached,
        D3 decode 12 blocks. Decode costs (credit on): D2 max(20-3,0)=17, D3 12 -> D3;
        eff_isl on D3 = 160, ratio 1.0 >= 0.7 -> remote prefill.
        Prefill costs: P0 (0+160)/16 = 10 + queue 64/16 = 14; P1 (32+160)/16 - 6 = 6 -> P1.
    r2: 40 blocks (640 tokens), D2 caches 38 -> D2 cost max(20-38,0)=0 beats D3 12;
        eff_isl = 640 - 608 = 32 < 2048, ratio 0.05 < 0.7 -> local prefill on D2.
    r3: same as r2 with only 10 blocks cached on D2: D2 cost 10 < 12 -> D2; eff_isl 480,
        ratio 0.75 -> remote; P0 = 64/16 + 40 = 44, P1 = 32/16 + 40 = 42 -> P1.
    """
    p0 = FakeNode(0, role=Role.PREFILL, num_waiting_prefill_tokens=64)
    p1 = FakeNode(1, role=Role.PREFILL, num_waiting_prefill_tokens=32, device_hashes=cached(6))
    d3 = FakeNode(3, num_decode_blocks=12)
    router = DynamoRouter(KvRouterConfig(), IslBounding())
    d2 = FakeNode(2, num_decode_blocks=20, device_hashes=cached(3))
    r1 = router.route(make_request(1, num_blocks=10), cluster(p0, p1, d2, d3), 0.0)
    assert r1 == Route(1, 3)
    d2 = FakeNode(2, num_decode_blocks=20, device_hashes=cached(38))
    r2 = router.route(make_request(2, num_blocks=40), cluster(p0, p1, d2, d3), 1.0)
    assert r2 == Route(2, 2)
    d2 = FakeNode(2, num_decode_blocks=20, device_hashes=cached(10))
    r3 = router.route(make_request(3, num_blocks=40), cluster(p0, p1, d2, d3), 2.0)
    assert r3 == Route(1, 2)


def test_decode_routing_without_conditional_disagg_ignores_overlap() -> None:
    # D0 has the whole prompt cached but more decode load: without conditional disagg the
    # decode stage scores decode blocks only, so D1 wins
    d0 = FakeNode(0, num_decode_blocks=8, device_hashes=cached(10))
    d1 = FakeNode(1, num_decode_blocks=5)
    p = FakeNode(2, role=Role.PREFILL)
    plain = DynamoRouter(KvRouterConfig(), IslBounding(enabled=False))
    assert plain.route(make_request(), cluster(d0, d1, p), 0.0) == Route(2, 1)
    conditional = DynamoRouter(KvRouterConfig(), IslBounding())
    assert conditional.route(make_request(), cluster(d0, d1, p), 0.0).decode_node == 0


def test_no_prefill_worker_serving_falls_back_to_local_prefill() -> None:
    p = FakeNode(0, role=Role.PREFILL, is_serving=False)
    d = FakeNode(1)
    router = DynamoRouter(KvRouterConfig(), IslBounding())
    assert router.route(make_request(num_blocks=500), cluster(p, d), 0.0) == Route(1, 1)


def test_stopped_workers_get_nothing_and_no_worker_raises() -> None:
    router = DynamoRouter(KvRouterConfig(), IslBounding(enabled=False))
    view = cluster(
        FakeNode(0, role=Role.PREFILL),
        FakeNode(1, is_serving=False),
        FakeNode(2, num_decode_blocks=50),
    )
    assert router.route(make_request(), view, 0.0) == Route(0, 2)
    with pytest.raises(RuntimeError):
        router.route(make_request(), cluster(FakeNode(0, is_serving=False)), 0.0)


def _m() -> PrefixMatch:
    return PrefixMatch(0, 0)
