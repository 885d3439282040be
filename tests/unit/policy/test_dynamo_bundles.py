"""The `dynamo` and `dynamo-agentic` factories: defaults, the xP/yD split, validation."""

from __future__ import annotations

import pytest

import evinfra.policy.dynamo.bundles as bundles
from evinfra.core.types import Role, SwitchMode
from evinfra.policy.bundle import ClusterShape
from evinfra.policy.dynamo.kv import AgenticKVManager
from evinfra.policy.dynamo.planner_load import LoadPlanner
from evinfra.policy.dynamo.planner_sla import SlaPlanner
from evinfra.policy.dynamo.profile import LinearWorkerProfile
from evinfra.policy.dynamo.router import DynamoRouter
from evinfra.policy.simple import LRUKVManager

SHAPE = ClusterShape(
    num_nodes=8,
    block_size=16,
    num_device_blocks_per_node=1000,
    num_host_blocks_per_node=4000,
    kv_bytes_per_token=1024,
    max_num_batched_tokens=8192,
    max_num_seqs=256,
)


def test_dynamo_defaults() -> None:
    b = bundles.make_dynamo(SHAPE, {})
    assert b.name == "dynamo"
    assert b.switch_mode is SwitchMode.RESTART
    assert b.cold_start_s == 300.0
    assert not b.host_tier and not b.write_through_offload
    assert isinstance(b.router, DynamoRouter) and b.router.agent is None
    assert b.router.disagg.enabled
    assert isinstance(b.kv_manager, LRUKVManager)
    assert isinstance(b.planner, SlaPlanner) and b.planner.interval_s == 180.0
    # rate-matched split at ISL 3000 / OSL 150 with the documented default rates:
    # prefill 3000/62020.9 = 0.0484 s, decode 150/204.88 = 0.732 s -> 8 * 0.062 -> 0 -> 1
    assert b.initial_roles == [Role.PREFILL] + [Role.DECODE] * 7


def test_rate_matched_split_by_hand() -> None:
    profile = LinearWorkerProfile(prefill_tok_s=1000.0, decode_tok_s=100.0)
    # prefill 3000/1000 = 3 s, decode 150/100 = 1.5 s: 8 * 3/4.5 = 5.33 -> 5
    assert bundles.rate_matched_prefill_nodes(8, profile, 3000, 150, 0.5, 0.05) == 5
    b = bundles.make_dynamo(
        SHAPE, {"prefill_tok_s_per_node": 1000.0, "decode_tok_s_per_node": 100.0}
    )
    assert b.initial_roles.count(Role.PREFILL) == 5


def test_explicit_split_and_options() -> None:
    b = bundles.make_dynamo(
        SHAPE,
        {
            "num_prefill_nodes": 3,
            "cold_start_s": 20.0,
            "planner": "load",
            "host_tier": True,
            "router_temperature": 0.5,
            "eff_isl_threshold_tokens": 4096,
        },
    )
    assert b.initial_roles == [Role.PREFILL] * 3 + [Role.DECODE] * 5
    assert b.cold_start_s == 20.0
    assert isinstance(b.planner, LoadPlanner)
    assert b.host_tier and b.write_through_offload
    assert isinstance(b.router, DynamoRouter)
    assert b.router.config.temperature == 0.5
    assert b.router.disagg.eff_isl_threshold_tokens == 4096
    assert bundles.make_dynamo(SHAPE, {"planner": "none"}).planner is None


def test_profile_object_is_used() -> None:
    profile = LinearWorkerProfile(prefill_tok_s=500.0, decode_tok_s=500.0)
    b = bundles.make_dynamo(SHAPE, {"profile": profile})
    assert isinstance(b.planner, SlaPlanner) and b.planner.profile is profile
    with pytest.raises(ValueError, match="profile"):
        bundles.make_dynamo(SHAPE, {"profile": object()})


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"num_prefil_nodes": 2}, "num_prefil_nodes"),
        ({"num_prefill_nodes": 8}, "num_prefill_nodes"),
        ({"num_prefill_nodes": 0}, "num_prefill_nodes"),
        ({"cold_start_s": -1.0}, "cold_start_s"),
        ({"planner": "magic"}, "planner"),
        ({"host_cache_hit_weight": 1.5}, "host_cache_hit_weight"),
        ({"router_temperature": "hot"}, "router_temperature"),
        ({"load_predictor": "prophet"}, "load_predictor"),
        ({"conditional_disagg": 1}, "conditional_disagg"),
        ({"decode_tok_s_per_node": 0.0}, "decode_tok_s_per_node"),
        ({"pin_ttl_s": 100.0}, "pin_ttl_s"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, object], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        bundles.make_dynamo_agentic(SHAPE, options)
    if names != "pin_ttl_s":
        with pytest.raises(ValueError, match=names):
            bundles.make_dynamo(SHAPE, options)


def test_needs_two_nodes() -> None:
    one = ClusterShape(1, 16, 100, 0, 1024, 8192, 256)
    with pytest.raises(ValueError, match="2 nodes"):
        bundles.make_dynamo(one, {})


def test_agentic_defaults() -> None:
    b = bundles.make_dynamo_agentic(SHAPE, {})
    assert b.name == "dynamo-agentic"
    assert b.host_tier and b.write_through_offload
    assert isinstance(b.kv_manager, AgenticKVManager)
    assert b.kv_manager.pin_ttl_s == 300.0
    assert b.kv_manager.max_pinned_blocks_per_node == 400  # 0.1 * 4000 host blocks
    assert isinstance(b.router, DynamoRouter) and b.router.agent is b.kv_manager.agent
    assert b.router.agent.affinity is not None and b.router.agent.affinity.ttl_s == 300.0
    assert b.router.agent.output is not None
    # without the host tier there is no HiCache, so no pin budget
    no_host = bundles.make_dynamo_agentic(SHAPE, {"host_tier": False})
    assert isinstance(no_host.kv_manager, AgenticKVManager)
    assert no_host.kv_manager.max_pinned_blocks_per_node == 0
    assert bundles.make_dynamo_agentic(SHAPE, {"pin_ttl_s": None}).kv_manager.pin_ttl_s is None  # type: ignore[attr-defined]


def test_plain_dynamo_rejects_agent_options() -> None:
    with pytest.raises(ValueError, match="session_affinity_ttl_s"):
        bundles.make_dynamo(SHAPE, {"session_affinity_ttl_s": 60.0})
