"""Turning a replica target into worker restarts; the GPU budget clamp.

Dynamo scales by starting and stopping workers; evinfra's pool is fixed, so a planner target
is carried out by restarting workers in the other role (`SwitchMode.RESTART`: the worker
stops, loses its KV, and serves again after the bundle's cold start).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from evinfra.core.types import Role, RoleChange, SwitchMode
from evinfra.policy.base import NodeView


def apply_gpu_budget(
    num_prefill: int, num_decode: int, max_num_workers: int, min_endpoint: int
) -> tuple[int, int]:
    """Dynamo's global budget clamp (`planner_core.py`, `_apply_global_gpu_budget`), with one
    worker per budget unit: when the pair exceeds the budget, scale prefill by
    budget / total (floored, kept within [min_endpoint, budget - min_endpoint]) and give
    decode the rest. (0, 0) when the budget cannot hold `min_endpoint` of each."""
    total = num_prefill + num_decode
    if total <= max_num_workers:
        return num_prefill, num_decode
    if max_num_workers < 2 * min_endpoint:
        return 0, 0
    scale = max_num_workers / total
    max_prefill = max_num_workers - min_endpoint
    prefill = max(min_endpoint, min(max_prefill, math.floor(num_prefill * scale)))
    decode = max(min_endpoint, max_num_workers - prefill)
    return prefill, decode


def fill_pool(num_prefill: int, num_decode: int, num_workers: int, min_endpoint: int) -> int:
    """evinfra has no stopped role: a target below the pool size is read as a ratio and
    spread over the whole pool. Returns the number of prefill workers (the rest decode)."""
    total = num_prefill + num_decode
    if total <= 0:
        raise ValueError("empty replica target")
    share = math.floor(num_workers * num_prefill / total + 0.5)
    return max(min_endpoint, min(num_workers - min_endpoint, share))


def restarts_to(nodes: Sequence[NodeView], num_prefill: int) -> list[RoleChange]:
    """Restart the fewest workers that bring the PREFILL count to `num_prefill`, taking the
    least busy donors first (ties: the highest id), so the fewest requests lose their KV."""
    prefills = [n for n in nodes if n.role is Role.PREFILL]
    decodes = [n for n in nodes if n.role is Role.DECODE]
    delta = num_prefill - len(prefills)
    if delta > 0:
        donors = sorted(decodes, key=lambda n: (_decode_load(n), -n.node_id))[:delta]
        new_role = Role.PREFILL
    elif delta < 0:
        donors = sorted(prefills, key=lambda n: (_prefill_load(n), -n.node_id))[:-delta]
        new_role = Role.DECODE
    else:
        return []
    return [RoleChange(n.node_id, new_role, SwitchMode.RESTART) for n in donors]


def _decode_load(node: NodeView) -> tuple[int, int]:
    return node.num_running_decodes + node.num_waiting_requests, node.num_decode_blocks


def _prefill_load(node: NodeView) -> tuple[int, int]:
    return node.num_waiting_prefill_tokens, node.num_waiting_requests
