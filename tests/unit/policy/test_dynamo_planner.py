"""Dynamo's SLA and load planners: replica counts worked by hand."""

from __future__ import annotations

import pytest

from evinfra.core.types import AgentHints, Request, Role, SwitchMode
from evinfra.policy.base import RequestArrived, RequestFinished
from evinfra.policy.dynamo.planner_load import LoadPlanner, LoadPlannerConfig, demand
from evinfra.policy.dynamo.planner_sla import (
    IntervalMetrics,
    SlaPlanner,
    SlaPlannerConfig,
    compute_replicas,
    decode_correction,
    prefill_correction,
)
from evinfra.policy.dynamo.predictors import (
    ArimaPredictor,
    ConstantPredictor,
    KalmanPredictor,
    MovingAveragePredictor,
    make_predictor,
)
from evinfra.policy.dynamo.profile import LinearWorkerProfile
from evinfra.policy.dynamo.scaling import apply_gpu_budget, fill_pool, restarts_to
from tests.unit.policy.dynamo_fakes import FakeNode, cluster

PROFILE = LinearWorkerProfile(prefill_tok_s=10_000.0, decode_tok_s=400.0, min_itl_s=0.01)
CONFIG = SlaPlannerConfig(predictor="constant")


def test_replica_formulas_by_hand() -> None:
    # 1800 requests in 180 s (10 rps), ISL 3000, OSL 150:
    # prefill load 1800*3000/180 = 30000 tok/s * min(1, 1.2) -> ceil(30000/10000) = 3
    # decode 1800*150/180 = 1500 tok/s / 400 -> ceil(3.75) = 4
    target = compute_replicas(1800, 3000, 150, 1.2, 1.0, PROFILE, CONFIG)
    assert (target.num_prefill, target.num_decode) == (3, 4)
    # a prefill correction below 1 shrinks the prefill load: 30000 * 0.5 -> ceil(1.5) = 2
    target = compute_replicas(1800, 3000, 150, 0.5, 1.0, PROFILE, CONFIG)
    assert target.num_prefill == 2
    # no load still keeps min_endpoint = 1 of each
    target = compute_replicas(0, 3000, 150, 1.0, 1.0, PROFILE, CONFIG)
    assert (target.num_prefill, target.num_decode) == (1, 1)


def test_correction_factors_by_hand() -> None:
    # expected TTFT at ISL 3000 = 0.3 s; observed 0.6 s -> 2.0
    # concurrency = 360/180 rps * 5 s / 2 decode workers = 5 seqs; expected ITL 5/400
    # = 0.0125 s; observed 0.025 s -> 2.0
    metrics = IntervalMetrics(360, 3000, 150, ttft_s=0.6, itl_s=0.025, request_duration_s=5.0)
    assert prefill_correction(metrics, PROFILE) == pytest.approx(2.0)
    assert decode_correction(metrics, PROFILE, 180.0, 2) == pytest.approx(2.0)


def test_gpu_budget_clamp_by_hand() -> None:
    assert apply_gpu_budget(3, 4, 8, 1) == (3, 4)
    # 7 > 6: scale 6/7; prefill floor(3*6/7 = 2.57) = 2; decode 6 - 2 = 4
    assert apply_gpu_budget(3, 4, 6, 1) == (2, 4)
    # prefill capped at budget - min_endpoint
    assert apply_gpu_budget(20, 1, 4, 1) == (3, 1)
    assert apply_gpu_budget(3, 3, 1, 1) == (0, 0)


def test_fill_pool_spreads_a_small_target_over_the_pool() -> None:
    assert fill_pool(3, 4, 8, 1) == 3  # round(8 * 3/7 = 3.43)
    assert fill_pool(1, 1, 5, 1) == 3  # round(2.5) = 3
    assert fill_pool(1, 30, 4, 1) == 1  # never below min_endpoint


def test_restarts_take_the_least_busy_donors() -> None:
    nodes = [
        FakeNode(0, role=Role.PREFILL),
        FakeNode(1, num_running_decodes=5),
        FakeNode(2, num_running_decodes=1),
        FakeNode(3, num_running_decodes=1),
    ]
    changes = restarts_to(nodes, 3)
    assert [(c.node_id, c.new_role, c.mode) for c in changes] == [
        (3, Role.PREFILL, SwitchMode.RESTART),
        (2, Role.PREFILL, SwitchMode.RESTART),
    ]
    assert [c.node_id for c in restarts_to(nodes, 0)] == [0]
    assert restarts_to(nodes, 1) == []


def _request(i: int, num_prompt_tokens: int) -> Request:
    return Request(i, (), num_prompt_tokens, 150, hints=AgentHints(session_id="s"))


def _feed(planner: SlaPlanner, num: int, ttft_s: float, itl_s: float, osl: int) -> None:
    for i in range(num):
        req = _request(i, 3000)
        planner.observe(RequestArrived(req, float(i)))
        e2e = ttft_s + itl_s * (osl - 1)
        planner.observe(RequestFinished(req, float(i) + e2e, 0, ttft_s, e2e, itl_s))


def test_sla_planner_end_to_end_by_hand() -> None:
    """8 workers, 1P7D. One interval: 1800 arrivals of ISL 3000, outputs of 150 tokens at
    TTFT 0.3 s (= profile: p_corr 1) and ITL 0.01 s. Concurrency per decode worker =
    10 rps * e2e 1.79 s / 7 = 2.557 -> expected ITL max(0.01, 2.557/400) = 0.01 -> d_corr 1.
    Target (3, 4) fits 8 -> spread: round(8*3/7) = 3 prefill: two decode workers restart."""
    planner = SlaPlanner(PROFILE, CONFIG)
    assert planner.interval_s == 180.0
    nodes = [FakeNode(0, role=Role.PREFILL)] + [
        FakeNode(i, num_running_decodes=i) for i in range(1, 8)
    ]
    _feed(planner, 1800, ttft_s=0.3, itl_s=0.01, osl=150)
    changes = planner.plan(cluster(*nodes), 180.0)
    assert planner.last_target is not None
    assert (planner.last_target.num_prefill, planner.last_target.num_decode) == (3, 5)
    assert [(c.node_id, c.new_role) for c in changes] == [(1, Role.PREFILL), (2, Role.PREFILL)]
    assert all(c.mode is SwitchMode.RESTART for c in changes)


def test_sla_planner_holds_during_cold_start_and_without_traffic() -> None:
    planner = SlaPlanner(PROFILE, CONFIG)
    nodes = [FakeNode(0, role=Role.PREFILL), FakeNode(1), FakeNode(2, is_serving=False)]
    _feed(planner, 1800, ttft_s=0.3, itl_s=0.01, osl=150)
    assert planner.plan(cluster(*nodes), 180.0) == []
    # next interval: nothing finished, nothing to correct from: hold
    assert planner.plan(cluster(FakeNode(0, role=Role.PREFILL), FakeNode(1)), 360.0) == []


def test_sla_planner_output_length_is_read_from_timings() -> None:
    planner = SlaPlanner(PROFILE, CONFIG)
    req = _request(0, 3000)
    planner.observe(RequestArrived(req, 0.0))
    # e2e 0.3 + 0.01 * 99 -> 100 output tokens
    planner.observe(RequestFinished(req, 1.29, 0, 0.3, 1.29, 0.01))
    planner.plan(cluster(FakeNode(0, role=Role.PREFILL), FakeNode(1)), 180.0)
    assert planner._osl.predict_next() == pytest.approx(100.0)


def test_predictors() -> None:
    constant = ConstantPredictor()
    for v in (0.0, 0.0, 5.0, 7.0):
        constant.add_data_point(v)
    assert constant.values == [5.0, 7.0]  # leading idle zeros skipped
    assert constant.predict_next() == 7.0
    ma = MovingAveragePredictor(window=2)
    for v in (1.0, 2.0, 6.0):
        ma.add_data_point(v)
    assert ma.predict_next() == 4.0
    arima = ArimaPredictor()
    for v in (10.0, 12.0, 16.0, 24.0):
        arima.add_data_point(v)
    # diffs 2, 4, 8: phi = (4*2 + 8*4) / (2^2 + 4^2) = 40/20 = 2 -> clipped 0.99
    assert arima.predict_next() == pytest.approx(24.0 + 0.99 * 8)
    kalman = KalmanPredictor()
    for v in range(1, 41):
        kalman.add_data_point(10.0 * v)
    assert kalman.predict_next() == pytest.approx(410.0, rel=0.02)  # follows the trend
    short = KalmanPredictor()
    short.add_data_point(3.0)
    assert short.predict_next() == 3.0  # fewer than min_points: last value
    with pytest.raises(ValueError):
        make_predictor("prophet")


def test_load_planner_moves_one_worker_toward_demand() -> None:
    planner = LoadPlanner(LoadPlannerConfig())
    assert planner.interval_s == 30.0
    assert demand(0.6, 0.5, 0.2) == 1 and demand(0.1, 0.5, 0.2) == -1
    assert demand(0.3, 0.5, 0.2) == 0
    # prefill queue 4 requests / 2 workers = 2 > 0.5; decode KV 0.6 (neutral): +1 prefill
    prefills = [
        FakeNode(0, role=Role.PREFILL, num_waiting_requests=4),
        FakeNode(1, role=Role.PREFILL),
    ]
    decodes = [FakeNode(i, num_used_blocks=600) for i in (2, 3, 4)]
    changes = planner.plan(cluster(*prefills, *decodes), 30.0)
    assert [(c.node_id, c.new_role, c.mode) for c in changes] == [
        (4, Role.PREFILL, SwitchMode.RESTART)
    ]
    # decode KV 0.95 > 0.9 and queue 0: one prefill worker becomes decode
    hot = [FakeNode(i, num_used_blocks=950) for i in (2, 3, 4)]
    changes = planner.plan(cluster(*prefills[1:], FakeNode(0, role=Role.PREFILL), *hot), 60.0)
    assert [(c.node_id, c.new_role) for c in changes] == [(1, Role.DECODE)]


def test_load_planner_grace_after_adding_decode() -> None:
    planner = LoadPlanner(LoadPlannerConfig())
    p = [FakeNode(0, role=Role.PREFILL), FakeNode(1, role=Role.PREFILL)]
    hot = [FakeNode(2, num_used_blocks=950), FakeNode(3, num_used_blocks=950)]
    assert [c.new_role for c in planner.plan(cluster(*p, *hot), 0.0)] == [Role.DECODE]
    # decode is now cold (KV 0.1 < 0.5, wants -1), prefill neutral (queue 0.25): a cold
    # decode pool gives a worker to prefill, but not in the 3 intervals after a decode
    # worker was added
    calm_p = [
        FakeNode(0, role=Role.PREFILL, num_waiting_requests=0),
        FakeNode(4, role=Role.PREFILL, num_waiting_requests=1),
    ]
    cold = [FakeNode(i, num_used_blocks=100) for i in (1, 2, 3)]
    for k in range(3):
        assert planner.plan(cluster(*calm_p, *cold), 30.0 * (k + 1)) == []
    changes = planner.plan(cluster(*calm_p, *cold), 120.0)
    assert [(c.node_id, c.new_role) for c in changes] == [(3, Role.PREFILL)]


def test_load_planner_holds_while_a_worker_cold_starts() -> None:
    planner = LoadPlanner()
    nodes = [
        FakeNode(0, role=Role.PREFILL, num_waiting_requests=9),
        FakeNode(1),
        FakeNode(2, is_serving=False),
    ]
    assert planner.plan(cluster(*nodes), 30.0) == []
