"""Conditional disaggregation (`isl_bounding`): boundary cases worked by hand."""

from __future__ import annotations

import pytest

from evinfra.core.types import Role, Route
from evinfra.policy.dynamo.cost import KvRouterConfig
from evinfra.policy.dynamo.disagg import IslBounding, effective_isl
from evinfra.policy.dynamo.router import DynamoRouter
from tests.unit.policy.dynamo_fakes import FakeNode, cached, cluster, make_request

RULE = IslBounding()


def test_effective_isl_subtracts_device_hits_and_clamps() -> None:
    assert effective_isl(1000, 14, 64) == 104
    assert effective_isl(500, 10, 64) == 0


def test_absolute_threshold_2047_local_2048_remote() -> None:
    # 8191 tokens, 384 blocks of 16 cached = 6144: eff_isl 2047, ratio 0.25 -> local
    assert RULE.runs_locally(8191, 384, 16)
    # 8192 tokens, same hits: eff_isl 2048 is not < 2048 -> remote
    assert not RULE.runs_locally(8192, 384, 16)


def test_ratio_threshold_0_7() -> None:
    # 1000 tokens, block 10: 30 blocks cached -> eff 700, ratio 0.70 -> remote
    assert not RULE.runs_locally(1000, 30, 10)
    # 31 blocks cached -> eff 690, ratio 0.69 -> local
    assert RULE.runs_locally(1000, 31, 10)
    # a short uncached prompt is small but not mostly cached: remote
    assert not RULE.runs_locally(200, 0, 64)


def test_disabled_rule_always_remote_and_bad_config_rejected() -> None:
    assert not IslBounding(enabled=False).runs_locally(100, 10, 64)
    with pytest.raises(ValueError):
        IslBounding(eff_isl_ratio_threshold=1.5)
    with pytest.raises(ValueError):
        IslBounding(eff_isl_threshold_tokens=-1)


@pytest.mark.parametrize(
    ("num_cached_blocks", "expected"),
    [
        (384, Route(1, 1)),  # eff_isl 2047 -> local on the decode worker
        (383, Route(0, 1)),  # eff_isl 2063 -> prefill worker
    ],
)
def test_router_applies_the_rule_on_the_chosen_decode_worker(
    num_cached_blocks: int, expected: Route
) -> None:
    prefill = FakeNode(0, role=Role.PREFILL)
    decode = FakeNode(1, device_hashes=cached(num_cached_blocks))
    request = make_request(num_blocks=511, extra_tokens=15)  # 8191 tokens
    router = DynamoRouter(KvRouterConfig(), RULE)
    assert router.route(request, cluster(prefill, decode), 0.0) == expected


def test_host_hits_do_not_count_toward_local_prefill() -> None:
    # the whole prompt is on the decode worker's host tier only: eff_isl stays the prompt
    prefill = FakeNode(0, role=Role.PREFILL)
    decode = FakeNode(1, host_hashes=cached(10))
    route = DynamoRouter(KvRouterConfig(), RULE).route(make_request(), cluster(prefill, decode), 0)
    assert route == Route(0, 1)
