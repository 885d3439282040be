"""Dynamo's load-based planner: at most one worker moves per interval, from the prefill
queue and the decode KV utilisation.

Source: `docs/architecture/load_planner.md`: prefill demand is the prefill queue size per
prefill worker, decode demand the mean KV cache utilisation of decode workers; defaults
adjustment-interval 30 s, prefill-queue scale-up/down 0.5/0.2, decode-kv scale-up/down
0.9/0.5; no decode scale-down for 3 intervals after a decode worker is added; no
adjustment while a scaling is in progress. Dynamo adds or removes a worker; on evinfra's
fixed pool one worker is restarted into the role with the higher demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from evinfra.core.types import Role, RoleChange
from evinfra.policy.base import ClusterView, PlannerObservation
from evinfra.policy.dynamo.scaling import restarts_to


@dataclass(frozen=True, slots=True)
class LoadPlannerConfig:
    interval_s: float = 30.0
    prefill_queue_scale_up: float = 0.5
    prefill_queue_scale_down: float = 0.2
    decode_kv_scale_up: float = 0.9
    decode_kv_scale_down: float = 0.5
    new_decode_grace_intervals: int = 3
    min_endpoint: int = 1


def demand(value: float, scale_up: float, scale_down: float) -> int:
    """+1 above the scale-up threshold, -1 below the scale-down one, 0 between."""
    if value > scale_up:
        return 1
    if value < scale_down:
        return -1
    return 0


class LoadPlanner:
    def __init__(self, config: LoadPlannerConfig | None = None) -> None:
        self.config = config if config is not None else LoadPlannerConfig()
        self._intervals_since_decode_added = self.config.new_decode_grace_intervals

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def observe(self, observation: PlannerObservation) -> None:
        """The load planner reads worker metrics only; frontend observations are ignored."""

    def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        cfg = self.config
        nodes = list(view.nodes)
        self._intervals_since_decode_added += 1
        if any(not n.is_serving for n in nodes):
            return []
        prefills = [n for n in nodes if n.role is Role.PREFILL]
        decodes = [n for n in nodes if n.role is Role.DECODE]
        if not prefills or not decodes:
            return []
        queue = sum(n.num_waiting_requests for n in prefills) / len(prefills)
        kv = sum(n.num_used_blocks / n.num_device_blocks for n in decodes) / len(decodes)
        d_prefill = demand(queue, cfg.prefill_queue_scale_up, cfg.prefill_queue_scale_down)
        d_decode = demand(kv, cfg.decode_kv_scale_up, cfg.decode_kv_scale_down)
        if d_decode < 0 and self._intervals_since_decode_added <= cfg.new_decode_grace_intervals:
            d_decode = 0
        if d_prefill > d_decode and len(decodes) > cfg.min_endpoint:
            return restarts_to(nodes, len(prefills) + 1)
        if d_decode > d_prefill and len(prefills) > cfg.min_endpoint:
            self._intervals_since_decode_added = 0
            return restarts_to(nodes, len(prefills) - 1)
        return []
