"""The `evolving` bundle and its ablations, each with one mechanism switched off."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from evinfra.core.types import Role, SwitchMode
from evinfra.policy.bundle import ClusterShape, SystemBundle, register
from evinfra.policy.dynamo.options import check_known, get_bool, get_float, get_int
from evinfra.policy.evolving.kv_manager import AgentKVManager, KVManagerConfig
from evinfra.policy.evolving.planner import EvolvingPlanner, PlannerConfig, mixed_layout
from evinfra.policy.evolving.rates import NodeRates, node_rates
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable

OPTIONS = (
    "planner",
    "in_place_switch",
    "agent_kv",
    "agent_eviction",
    "free_dead_blocks",
    "use_hints",
    "pull_prefix",
    "prefetch",
    "host_tier",
    "initial_prefill_fraction",
    "planner_interval_s",
    "itl_target_s",
    "min_dwell_s",
    "cold_start_s",
    "max_local_prefill_tokens",
    "remote_decode_stall",
    "inflight_step_wait",
    "step_phase_wait",
    "mixed_prefill_fraction",
    "migrate_on_switch",
    "mixed_below_utilisation",
    "split_hysteresis",
    "mixed_by_latency",
    "mixed_in_overload",
    "mixed_past_split_overload",
    "mixed_past_split_capacity",
    "split_capacity_margin",
    "capacity_window_s",
    "mixed_past_split_itl",
    "mixed_past_split_ttft",
    "ttft_target_s",
    "split_by_latency",
    "tier_messages",
    "max_candidates",
)


def initial_roles(
    num_nodes: int, prefill_fraction: float | None, mixed_prefill_fraction: float = 0.0
) -> list[Role]:
    """The planner's mixed layout (no prefill fraction: the planner splits when load
    demands it; every node mixed, or `mixed_prefill_fraction` of them prefill-only), or a
    split with that share of prefill nodes."""
    if prefill_fraction is None:
        p, _, m = mixed_layout(num_nodes, mixed_prefill_fraction)
        return [Role.PREFILL] * p + [Role.MIXED] * m
    if num_nodes == 1:
        return [Role.MIXED]
    num_prefill = min(max(round(num_nodes * prefill_fraction), 1), num_nodes - 1)
    return [Role.PREFILL] * num_prefill + [Role.DECODE] * (num_nodes - num_prefill)


def monotone_decode(rates: NodeRates) -> NodeRates:
    """The rates with decode step times non-decreasing in batch size: a step with more
    sequences never takes less time. A cost model fitted on a range can bend back past
    it (Dynamo's mocker polynomial in KV utilisation peaks near u = 1 and falls to its
    1 ms floor by u = 2.3, which the rates' probe at 8,192 tokens a sequence reaches on a
    small pool); read literally, the router would pile sessions onto the busiest node
    and the planner would think one node decodes any load."""
    points, worst = [], 0.0
    for b, t in rates.decode_step_s_at:
        worst = max(worst, t)
        points.append((b, worst))
    fixed = replace(rates, decode_step_s_at=tuple(points))
    # a step carrying a chunk as well never takes less than the decode step alone
    mixed, worst = [], 0.0
    for b, t in rates.mixed_step_s_at:
        worst = max(worst, t, fixed.decode_step_s(b))
        mixed.append((b, worst))
    return replace(fixed, mixed_step_s_at=tuple(mixed))


def make_evolving(shape: ClusterShape, options: Mapping[str, object], name: str) -> SystemBundle:
    check_known(options, OPTIONS, name)
    rates = monotone_decode(node_rates(shape))
    table = SessionTable(use_hints=get_bool(options, "use_hints", True))
    in_place = get_bool(options, "in_place_switch", True)
    mode = SwitchMode.IN_PLACE if in_place else SwitchMode.RESTART
    mixed_prefill = get_float(options, "mixed_prefill_fraction", 0.0, min_value=0.0, max_value=1.0)
    planner = None
    if get_bool(options, "planner", True):
        planner = EvolvingPlanner(
            table,
            rates,
            shape.block_size,
            PlannerConfig(
                interval_s=get_float(options, "planner_interval_s", 5.0, min_value=0.1),
                itl_target_s=get_float(options, "itl_target_s", 0.05, min_value=0.001),
                min_dwell_s=get_float(options, "min_dwell_s", 15.0, min_value=0.0),
                mixed_below_utilisation=get_float(
                    options, "mixed_below_utilisation", 0.5, min_value=0.0
                ),
                split_hysteresis=get_float(options, "split_hysteresis", 0.05, min_value=0.0),
                mixed_by_latency=get_bool(options, "mixed_by_latency", True),
                mixed_in_overload=get_bool(options, "mixed_in_overload", False),
                mixed_past_split_overload=get_bool(options, "mixed_past_split_overload", False),
                mixed_past_split_capacity=get_bool(options, "mixed_past_split_capacity", True),
                split_capacity_margin=get_float(
                    options, "split_capacity_margin", 0.1, min_value=0.0
                ),
                capacity_window_s=get_float(options, "capacity_window_s", 120.0, min_value=0.0),
                mixed_past_split_itl=get_bool(options, "mixed_past_split_itl", True),
                mixed_past_split_ttft=get_bool(options, "mixed_past_split_ttft", True),
                ttft_target_s=get_float(options, "ttft_target_s", 2.0, min_value=0.001),
                split_by_latency=get_bool(options, "split_by_latency", False),
                mixed_prefill_fraction=mixed_prefill,
                switch_mode=mode,
            ),
        )
    agent_kv = get_bool(options, "agent_kv", True)
    # in process (the simulator), run eviction through the servers' path: tiers published
    # per session event to the nodes' `PublishedTiers` instead of read from the table
    tier_messages = get_bool(options, "tier_messages", False)
    kv = AgentKVManager(
        table,
        KVManagerConfig(
            agent_eviction=agent_kv and get_bool(options, "agent_eviction", True),
            free_dead_blocks=agent_kv and get_bool(options, "free_dead_blocks", True),
            prefetch=agent_kv and get_bool(options, "prefetch", True),
            publish_scores=not shape.eviction_in_process or tier_messages,
            deliver_in_process=shape.eviction_in_process and tier_messages,
        ),
    )
    router = EvolvingRouter(
        table,
        rates,
        RouterConfig(
            pull_prefix=get_bool(options, "pull_prefix", True) and shape.can_pull_prefix,
            max_local_prefill_tokens=get_int(
                options, "max_local_prefill_tokens", 4096, min_value=0
            ),
            remote_decode_stall=get_bool(options, "remote_decode_stall", False),
            inflight_step_wait=get_bool(options, "inflight_step_wait", False),
            step_phase_wait=get_bool(options, "step_phase_wait", False),
            max_candidates=get_int(options, "max_candidates", 8, min_value=1),
        ),
    )
    fraction = None
    if options.get("initial_prefill_fraction") is not None:
        fraction = get_float(options, "initial_prefill_fraction", 0.5, min_value=0.0, max_value=1.0)
    return SystemBundle(
        name=name,
        router=router,
        kv_manager=kv,
        initial_roles=initial_roles(shape.num_nodes, fraction, mixed_prefill),
        planner=planner,
        switch_mode=mode,
        cold_start_s=get_float(options, "cold_start_s", 300.0, min_value=0.0),
        host_tier=get_bool(options, "host_tier", True),
        write_through_offload=False,
        migrate_on_switch=get_bool(options, "migrate_on_switch", False),
    )


ABLATIONS: dict[str, dict[str, object]] = {
    "evolving": {},
    # without the planner the split Dynamo would deploy stays: half prefill, half decode
    "evolving-no-planner": {"planner": False, "initial_prefill_fraction": 0.5},
    "evolving-restart": {"in_place_switch": False},
    "evolving-lru": {"agent_kv": False},
    "evolving-no-hints": {"use_hints": False},
    "evolving-no-pull": {"pull_prefix": False},
    # the planner's rule on the observed TTFT: on by default since 2026-12-05 (every
    # search it could change rerun with it, docs/evolving.md); `evolving-no-ttft` is
    # evolving as every figure before then was made, `evolving-ttft` the rule named
    "evolving-no-ttft": {"mixed_past_split_ttft": False},
    "evolving-ttft": {"mixed_past_split_ttft": True},
    # a quarter of the nodes prefill-only where the planner would mix them all: P95 TTFT
    # at light load against a little mean e2e (benchmarks/README.md)
    "evolving-hybrid": {"mixed_prefill_fraction": 0.25, "inflight_step_wait": True},
    # every node mixed, and a prefill sent where the step in flight ends soonest: the
    # light-load P95 TTFT without the hybrid layout's cost in mean e2e
    "evolving-phase": {"inflight_step_wait": True, "step_phase_wait": True},
    # in an overload, every node mixed where mixed nodes carry more of it than the split
    # (docs/evolving.md): goodput past where the default splits or keeps a split
    "evolving-overload": {"mixed_in_overload": True, "mixed_past_split_overload": True},
}


def _register(name: str, preset: dict[str, object]) -> None:
    @register(name)
    def factory(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
        return make_evolving(shape, {**preset, **options}, name)


for _name, _preset in ABLATIONS.items():
    _register(_name, _preset)
