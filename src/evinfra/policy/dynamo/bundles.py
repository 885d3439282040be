"""The `dynamo` and `dynamo-agentic` system bundles. See docs/dynamo-baseline.md for every
behaviour, its Dynamo source and its option."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

from evinfra.core.types import Role, SwitchMode
from evinfra.policy.base import KVManager, Planner
from evinfra.policy.bundle import ClusterShape, SystemBundle, register
from evinfra.policy.dynamo.cost import KvRouterConfig
from evinfra.policy.dynamo.disagg import IslBounding
from evinfra.policy.dynamo.kv import PIN_TTL_MAX_S, PIN_TTL_MIN_S, AgenticKVManager
from evinfra.policy.dynamo.options import (
    check_known,
    get_bool,
    get_choice,
    get_float,
    get_int,
    get_optional_float,
)
from evinfra.policy.dynamo.planner_load import LoadPlanner, LoadPlannerConfig
from evinfra.policy.dynamo.planner_sla import SlaPlanner, SlaPlannerConfig
from evinfra.policy.dynamo.predictors import PREDICTORS
from evinfra.policy.dynamo.profile import CostModelProfile, LinearWorkerProfile, WorkerProfile
from evinfra.policy.dynamo.router import DynamoRouter
from evinfra.policy.dynamo.sessions import AgentRouterState, SessionAffinity
from evinfra.policy.simple import LRUKVManager

# Dynamo's planner profiling example (`docs/architecture/load_planner.md`): prefill TP4 at
# 15,505 tok/s/GPU, decode TP4 at 51.22 tok/s/GPU. Placeholders until a cost model's
# profile is passed in as `profile`.
DEFAULT_PREFILL_TOK_S_PER_NODE = 4 * 15505.23
DEFAULT_DECODE_TOK_S_PER_NODE = 4 * 51.22

ROUTER_KEYS = (
    "prefill_load_scale",
    "overlap_score_credit",
    "host_cache_hit_weight",
    "router_temperature",
    "active_decode_blocks_threshold",
    "active_prefill_tokens_threshold",
    "active_prefill_tokens_threshold_frac",
    "seed",
)
DYNAMO_KEYS = (
    *ROUTER_KEYS,
    "num_prefill_nodes",
    "nominal_isl_tokens",
    "nominal_osl_tokens",
    "profile",
    "prefill_tok_s_per_node",
    "decode_tok_s_per_node",
    "min_itl_s",
    "planner",
    "planner_interval_s",
    "ttft_target_s",
    "itl_target_s",
    "load_predictor",
    "correction",
    "cold_start_s",
    "host_tier",
    "conditional_disagg",
    "eff_isl_threshold_tokens",
    "eff_isl_ratio_threshold",
)
AGENTIC_KEYS = (
    *DYNAMO_KEYS,
    "session_affinity_ttl_s",
    "pin_ttl_s",
    "max_pinned_ratio",
    "priority_eviction",
    "track_output_blocks",
)


def router_config(options: Mapping[str, object], shape: ClusterShape) -> KvRouterConfig:
    return KvRouterConfig(
        prefill_load_scale=get_float(options, "prefill_load_scale", 1.0, min_value=0.0),
        overlap_score_credit=get_float(options, "overlap_score_credit", 1.0, min_value=0.0),
        host_cache_hit_weight=get_float(
            options, "host_cache_hit_weight", 0.75, min_value=0.0, max_value=1.0
        ),
        temperature=get_float(options, "router_temperature", 0.0, min_value=0.0),
        active_decode_blocks_threshold=get_optional_float(
            options, "active_decode_blocks_threshold"
        ),
        active_prefill_tokens_threshold=get_optional_float(
            options, "active_prefill_tokens_threshold"
        ),
        active_prefill_tokens_threshold_frac=get_optional_float(
            options, "active_prefill_tokens_threshold_frac"
        ),
        max_num_batched_tokens=shape.max_num_batched_tokens,
    )


def worker_profile(
    options: Mapping[str, object], shape: ClusterShape | None = None
) -> WorkerProfile:
    """The profile the planner sizes from: an explicit `profile` object, explicit rates,
    or (the default when the cluster's cost model is known) a sweep of that model."""
    profile = options.get("profile")
    explicit = "prefill_tok_s_per_node" in options or "decode_tok_s_per_node" in options
    if profile is None and not explicit and shape is not None and shape.cost_model is not None:
        return CostModelProfile(shape.cost_model, shape.max_num_seqs)
    if profile is not None:
        needed = (
            "prefill_tokens_per_s_at_ttft",
            "decode_tokens_per_s_at_itl",
            "expected_ttft_s",
            "expected_itl_s",
        )
        missing = [m for m in needed if not callable(getattr(profile, m, None))]
        if missing:
            raise ValueError(f"option 'profile' lacks {', '.join(missing)}")
        return cast(WorkerProfile, profile)
    return LinearWorkerProfile(
        prefill_tok_s=get_float(
            options,
            "prefill_tok_s_per_node",
            DEFAULT_PREFILL_TOK_S_PER_NODE,
            min_value=0.0,
            min_exclusive=True,
        ),
        decode_tok_s=get_float(
            options,
            "decode_tok_s_per_node",
            DEFAULT_DECODE_TOK_S_PER_NODE,
            min_value=0.0,
            min_exclusive=True,
        ),
        min_itl_s=get_float(options, "min_itl_s", 0.0, min_value=0.0),
    )


def rate_matched_prefill_nodes(
    num_nodes: int,
    profile: WorkerProfile,
    isl_tokens: float,
    osl_tokens: float,
    ttft_target_s: float,
    itl_target_s: float,
) -> int:
    """xP/yD split whose pools finish one request's prefill and decode work in proportion:
    prefill share isl / prefill rate, decode share osl / decode rate, at the SLA targets."""
    prefill_s = isl_tokens / profile.prefill_tokens_per_s_at_ttft(ttft_target_s)
    decode_s = osl_tokens / profile.decode_tokens_per_s_at_itl(
        itl_target_s, isl_tokens + osl_tokens / 2
    )
    share = math.floor(num_nodes * prefill_s / (prefill_s + decode_s) + 0.5)
    return max(1, min(num_nodes - 1, share))


def _planner(
    options: Mapping[str, object], profile: WorkerProfile, ttft_s: float, itl_s: float
) -> Planner | None:
    kind = get_choice(options, "planner", "sla", ("sla", "load", "none"))
    if kind == "none":
        return None
    if kind == "load":
        interval = get_float(options, "planner_interval_s", 30.0, min_value=0.0, min_exclusive=True)
        return LoadPlanner(LoadPlannerConfig(interval_s=interval))
    config = SlaPlannerConfig(
        interval_s=get_float(
            options, "planner_interval_s", 180.0, min_value=0.0, min_exclusive=True
        ),
        ttft_target_s=ttft_s,
        itl_target_s=itl_s,
        predictor=get_choice(options, "load_predictor", "arima", PREDICTORS),
        correction=get_bool(options, "correction", True),
    )
    return SlaPlanner(profile, config)


def _build(
    name: str,
    shape: ClusterShape,
    options: dict[str, object],
    agent: AgentRouterState | None,
    kv_manager: KVManager,
    host_tier: bool,
) -> SystemBundle:
    if shape.num_nodes < 2:
        raise ValueError(f"{name} needs at least 2 nodes (one prefill, one decode)")
    profile = worker_profile(options, shape)
    ttft_s = get_float(options, "ttft_target_s", 0.5, min_value=0.0, min_exclusive=True)
    itl_s = get_float(options, "itl_target_s", 0.05, min_value=0.0, min_exclusive=True)
    if "num_prefill_nodes" in options:
        num_prefill = get_int(options, "num_prefill_nodes", 1, min_value=1)
        if num_prefill >= shape.num_nodes:
            raise ValueError(
                f"option 'num_prefill_nodes' must be < num_nodes ({shape.num_nodes}), "
                f"got {num_prefill}"
            )
    else:
        num_prefill = rate_matched_prefill_nodes(
            shape.num_nodes,
            profile,
            get_float(options, "nominal_isl_tokens", 3000.0, min_value=1.0),
            get_float(options, "nominal_osl_tokens", 150.0, min_value=1.0),
            ttft_s,
            itl_s,
        )
    disagg = IslBounding(
        enabled=get_bool(options, "conditional_disagg", True),
        eff_isl_threshold_tokens=get_int(options, "eff_isl_threshold_tokens", 2048, min_value=0),
        eff_isl_ratio_threshold=get_float(
            options, "eff_isl_ratio_threshold", 0.7, min_value=0.0, max_value=1.0
        ),
    )
    router = DynamoRouter(
        router_config(options, shape), disagg, seed=get_int(options, "seed", 0), agent=agent
    )
    roles = [Role.PREFILL] * num_prefill + [Role.DECODE] * (shape.num_nodes - num_prefill)
    return SystemBundle(
        name=name,
        router=router,
        kv_manager=kv_manager,
        initial_roles=roles,
        planner=_planner(options, profile, ttft_s, itl_s),
        switch_mode=SwitchMode.RESTART,
        cold_start_s=get_float(options, "cold_start_s", 300.0, min_value=0.0),
        host_tier=host_tier,
        write_through_offload=host_tier,
        options=dict(options),
    )


@register("dynamo")
def make_dynamo(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    """Dynamo 1.x as its docs recommend, with no agent hints."""
    check_known(options, DYNAMO_KEYS, "dynamo")
    host_tier = get_bool(options, "host_tier", False)
    return _build("dynamo", shape, options, None, LRUKVManager(), host_tier)


@register("dynamo-agentic")
def make_dynamo_agentic(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    """The strongest Dynamo a user can configure today: KVBM host tier, session affinity,
    priority, expected output length and `cache_control` prefix pinning."""
    check_known(options, AGENTIC_KEYS, "dynamo-agentic")
    host_tier = get_bool(options, "host_tier", True)
    ttl = get_float(options, "session_affinity_ttl_s", 300.0, min_value=1.0)
    agent = AgentRouterState(
        SessionAffinity(ttl), track_output=get_bool(options, "track_output_blocks", True)
    )
    pin_ttl = None
    if options.get("pin_ttl_s", PIN_TTL_MIN_S) is not None:
        pin_ttl = get_float(
            options, "pin_ttl_s", PIN_TTL_MIN_S, min_value=PIN_TTL_MIN_S, max_value=PIN_TTL_MAX_S
        )
    ratio = get_float(options, "max_pinned_ratio", 0.1, min_value=0.0, max_value=0.999)
    # pinning needs HiCache (the host tier); the budget is a fraction of the host pool
    budget = math.floor(ratio * shape.num_host_blocks_per_node) if host_tier else 0
    kv = AgenticKVManager(
        agent,
        pin_ttl_s=pin_ttl,
        max_pinned_blocks_per_node=budget,
        priority_eviction=get_bool(options, "priority_eviction", True),
    )
    return _build("dynamo-agentic", shape, options, agent, kv, host_tier)
