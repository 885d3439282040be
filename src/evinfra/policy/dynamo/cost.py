"""Dynamo's KV-router worker cost and worker selection, as pure functions.

Source: Dynamo `docs/components/router/router-concepts.md` ("Cost Calculation") and
`lib/kv-router/src/scheduling/selector.rs` (`worker_logit`, `softmax_sample`). Per worker:

    raw_prefill_blocks      = (active prefill tokens + request prompt tokens) / block_size
    overlap_credit_blocks   = overlap_score_credit * device hits + host_cache_hit_weight * host hits
    adjusted_prefill_blocks = max(raw_prefill_blocks - overlap_credit_blocks, 0)
    cost                    = prefill_load_scale * adjusted_prefill_blocks + decode_blocks

The worker's active prefill tokens are read from its view (uncached prompt tokens queued or
in progress) and its decode blocks from `num_decode_blocks`: evinfra models Dynamo's
router-side "active blocks" prediction by the node's own counters (see docs/dynamo-baseline.md).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Request
from evinfra.policy.base import NodeView


class Phase(enum.Enum):
    """Which of Dynamo's routing stages scores the workers."""

    AGGREGATED = "aggregated"  # prefill and decode on the chosen worker: full formula
    PREFILL = "prefill"  # prefill router: active-block tracking off, so no decode term
    DECODE = "decode"  # decode stage of disaggregated serving


@dataclass(frozen=True, slots=True)
class KvRouterConfig:
    """Dynamo's router knobs with their documented defaults (`router-configuration.md`)."""

    prefill_load_scale: float = 1.0
    overlap_score_credit: float = 1.0
    host_cache_hit_weight: float = 0.75
    temperature: float = 0.0
    # busy thresholds (`router-filtering.md`); None disables each, as in Dynamo
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: float | None = None
    active_prefill_tokens_threshold_frac: float | None = None
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class WorkerCost:
    node_id: int
    cost: float
    match: PrefixMatch


def overlap_credit_blocks(match: PrefixMatch, config: KvRouterConfig) -> float:
    return (
        config.overlap_score_credit * match.num_device_blocks
        + config.host_cache_hit_weight * match.num_host_blocks
    )


def worker_cost(
    request: Request,
    node: NodeView,
    phase: Phase,
    config: KvRouterConfig,
    decode_overlap_credit: bool = False,
    extra_decode_blocks: float = 0.0,
    match: PrefixMatch | None = None,
) -> WorkerCost:
    """Dynamo's logit for `node` (lower is better).

    PREFILL drops the decode term (Dynamo's prefill router runs with active-block tracking
    off). DECODE is the decode stage of disaggregated serving: prompt-side tracking is off,
    so the cost is the decode blocks, less the overlap credit (clamped at 0) only when
    `decode_overlap_credit` is set (conditional disaggregation keeps a positive credit so
    the decode worker it picks is cache-hot). `extra_decode_blocks` adds router-tracked
    expected output blocks (the `osl` hint).
    """
    if match is None:  # the caller may pass it from the cluster-wide block index
        match = node.match_prefix(request.prompt_hashes)
    credit = overlap_credit_blocks(match, config)
    decode_blocks = node.num_decode_blocks + extra_decode_blocks
    if phase is Phase.DECODE:
        cost = max(decode_blocks - credit, 0.0) if decode_overlap_credit else decode_blocks
        return WorkerCost(node.node_id, cost, match)
    raw_prefill_blocks = (
        node.num_waiting_prefill_tokens + request.num_prompt_tokens
    ) / node.block_size
    adjusted = max(raw_prefill_blocks - credit, 0.0)
    cost = config.prefill_load_scale * adjusted
    if phase is Phase.AGGREGATED:
        cost += decode_blocks
    return WorkerCost(node.node_id, cost, match)


def is_busy(node: NodeView, config: KvRouterConfig) -> bool:
    """Dynamo's busy-threshold filter: an overloaded worker is not a candidate."""
    if config.active_decode_blocks_threshold is not None and node.num_device_blocks > 0:
        usage = node.num_decode_blocks / node.num_device_blocks
        if usage > config.active_decode_blocks_threshold:
            return True
    prefill_tokens = node.num_waiting_prefill_tokens
    if (
        config.active_prefill_tokens_threshold is not None
        and prefill_tokens > config.active_prefill_tokens_threshold
    ):
        return True
    frac = config.active_prefill_tokens_threshold_frac
    return frac is not None and prefill_tokens > frac * config.max_num_batched_tokens


def eligible(nodes: Sequence[NodeView], config: KvRouterConfig) -> list[NodeView]:
    """Candidates after the busy filter. Dynamo rejects the request (HTTP 503) when every
    worker is busy; evinfra has no rejection path, so it then keeps the unfiltered set."""
    calm = [n for n in nodes if not is_busy(n, config)]
    return calm if calm else list(nodes)


def select_worker(
    costs: Sequence[WorkerCost], temperature: float, rng: random.Random
) -> WorkerCost:
    """Lowest cost at temperature 0 (ties: lowest node id, for determinism); above 0,
    sample from a softmax of the costs min-max normalised and divided by `temperature`."""
    if not costs:
        raise ValueError("no candidate worker")
    if temperature <= 0.0:
        return min(costs, key=lambda c: (c.cost, c.node_id))
    ordered = sorted(costs, key=lambda c: c.node_id)
    weights = softmax_weights([c.cost for c in ordered], temperature)
    sample = rng.random()
    cumulative = 0.0
    for cost, weight in zip(ordered, weights, strict=True):
        cumulative += weight
        if sample <= cumulative:
            return cost
    return ordered[-1]


def softmax_weights(costs: Sequence[float], temperature: float) -> list[float]:
    """Probabilities of picking each worker: exp(-(c - min) / ((max - min) * T)), normalised.
    Equal costs give a uniform choice."""
    low, high = min(costs), max(costs)
    if high == low:
        return [1.0 / len(costs)] * len(costs)
    span = (high - low) * temperature
    raw = [math.exp(-(c - low) / span) for c in costs]
    total = sum(raw)
    return [r / total for r in raw]
