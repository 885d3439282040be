"""`aggregated`: vLLM or SGLang engines behind a KV-aware router. Every node is MIXED (no
disaggregation), the router uses Dynamo's cost with prefill and decode on the same worker,
each engine's prefix cache is LRU (a sequence's tail evicted first), and there is no
planner. Options: the router knobs of `dynamo` (see docs/dynamo-baseline.md)."""

from __future__ import annotations

import random

from evinfra.core.types import Request, Role, Route
from evinfra.policy.base import ClusterView, match_all
from evinfra.policy.bundle import ClusterShape, SystemBundle, register
from evinfra.policy.dynamo.bundles import ROUTER_KEYS, router_config
from evinfra.policy.dynamo.cost import KvRouterConfig, Phase, eligible, select_worker, worker_cost
from evinfra.policy.dynamo.options import check_known, get_bool, get_int
from evinfra.policy.simple import LRUKVManager


class AggregatedKVRouter:
    """Lowest `prefill_load_scale * max(active prefill + request - overlap, 0) + decode`
    among serving MIXED nodes; `route` mutates only the sampling RNG."""

    def __init__(self, config: KvRouterConfig, seed: int = 0) -> None:
        self.config = config
        self._rng = random.Random(seed)

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        serving = [n for n in view.nodes if n.is_serving]
        if not serving:
            raise RuntimeError("no node is serving")
        nodes = [n for n in serving if n.role is Role.MIXED] or serving
        matches = match_all(view, request.prompt_hashes)
        costs = [
            worker_cost(request, n, Phase.AGGREGATED, self.config, match=matches.get(n.node_id))
            for n in eligible(nodes, self.config)
        ]
        chosen = select_worker(costs, self.config.temperature, self._rng)
        return Route(chosen.node_id, chosen.node_id)


@register("aggregated")
def make_aggregated(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    check_known(options, (*ROUTER_KEYS, "host_tier"), "aggregated")
    host_tier = get_bool(options, "host_tier", False)
    return SystemBundle(
        name="aggregated",
        router=AggregatedKVRouter(router_config(options, shape), seed=get_int(options, "seed", 0)),
        kv_manager=LRUKVManager(),
        initial_roles=[Role.MIXED] * shape.num_nodes,
        host_tier=host_tier,
        write_through_offload=host_tier,
        options=dict(options),
    )
