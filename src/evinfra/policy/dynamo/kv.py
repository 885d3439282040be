"""KV management of `dynamo-agentic`: TTL prefix pinning (`nvext.cache_control`) and
priority-ordered eviction, on top of the engine's LRU.

Pinning source: Dynamo `docs/backends/sglang/agents.md` ("Cache Pinning"): after a
request's stream completes, the router pins its prompt prefix on the worker that served
it for a TTL (clamped to [300, 3600] s, default 300); pinned blocks resist eviction until
the TTL runs out (with HiCache they are demoted to host rather than deleted); a pin
arriving while pinned refreshes the TTL; the pinned amount per worker is capped by
`SGLANG_HICACHE_MAX_PINNED_RATIO` (a fraction of the host pool; requests over budget are
rejected) and pinning needs the host tier. Pinned blocks fall back to LRU among themselves.

Priority eviction source: the same page ("Priority-Based KV Cache Eviction",
`--radix-eviction-policy priority`): lowest priority first, LRU among equals. A block takes
the highest `priority` hint of the requests whose prompt held it.
"""

from __future__ import annotations

import heapq

from evinfra.core.eviction import EvictionPolicy, ScoredEviction
from evinfra.core.types import Request
from evinfra.policy.base import ClusterView, KVAction
from evinfra.policy.dynamo.sessions import AgentRouterState

PIN_TTL_MIN_S = 300.0
PIN_TTL_MAX_S = 3600.0
_PIN_SCORE = 1e12
_MAX_PRIORITY = 1e9


class AgenticKVManager:
    """Pins a finished request's prompt on its worker for `pin_ttl_s`; orders eviction by
    (pinned, priority, LRU). The clock is the latest `now_s` seen by any hook."""

    def __init__(
        self,
        agent: AgentRouterState,
        pin_ttl_s: float | None,
        max_pinned_blocks_per_node: int,
        priority_eviction: bool = True,
    ) -> None:
        if pin_ttl_s is not None and not PIN_TTL_MIN_S <= pin_ttl_s <= PIN_TTL_MAX_S:
            raise ValueError(
                f"pin_ttl_s must be in [{PIN_TTL_MIN_S}, {PIN_TTL_MAX_S}], got {pin_ttl_s}"
            )
        self.agent = agent
        self.pin_ttl_s = pin_ttl_s
        self.max_pinned_blocks_per_node = max_pinned_blocks_per_node
        self.priority_eviction = priority_eviction
        self.now_s = 0.0
        self._pins: dict[int, dict[int, float]] = {}
        self._expiries: list[tuple[float, int, int]] = []
        self._priority: dict[int, float] = {}
        self._evictions: dict[int, ScoredEviction] = {}
        self.num_rejected_pins = 0

    def eviction_for(self, node_id: int) -> EvictionPolicy:
        strategy = ScoredEviction(lambda h: self.score(node_id, h))
        self._evictions[node_id] = strategy
        return strategy

    def score(self, node_id: int, block_hash: int) -> float:
        """Keep-score: pinned blocks above every unpinned one, then by priority."""
        expiry = self._pins.get(node_id, {}).get(block_hash)
        pinned = _PIN_SCORE if expiry is not None and expiry > self.now_s else 0.0
        return pinned + self._priority.get(block_hash, 0.0)

    def is_pinned(self, node_id: int, block_hash: int) -> bool:
        expiry = self._pins.get(node_id, {}).get(block_hash)
        return expiry is not None and expiry > self.now_s

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        self._advance(now_s)
        hints = request.hints
        if self.priority_eviction and hints is not None and hints.priority:
            priority = max(-_MAX_PRIORITY, min(_MAX_PRIORITY, float(hints.priority)))
            raised = [h for h in request.prompt_hashes if priority > self._priority.get(h, 0.0)]
            for h in raised:
                self._priority[h] = priority
            for strategy in self._evictions.values():
                strategy.rescore_hashes(raised)
        return []

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        self._advance(now_s)
        self.agent.finished(request, now_s)
        if self.pin_ttl_s is not None and request.hints is not None:
            self._pin(node_id, request.prompt_hashes, now_s + self.pin_ttl_s)
        return []

    def on_tick(self, view: ClusterView, now_s: float) -> list[KVAction]:
        self._advance(now_s)
        return []

    def _pin(self, node_id: int, hashes: tuple[int, ...], expiry_s: float) -> None:
        pins = self._pins.setdefault(node_id, {})
        num_new = sum(1 for h in set(hashes) if h not in pins)
        if len(pins) + num_new > self.max_pinned_blocks_per_node:
            self.num_rejected_pins += 1
            return
        for h in hashes:
            if pins.get(h, 0.0) < expiry_s:
                pins[h] = expiry_s
                heapq.heappush(self._expiries, (expiry_s, node_id, h))
        strategy = self._evictions.get(node_id)
        if strategy is not None:
            strategy.rescore_hashes(hashes)

    def _advance(self, now_s: float) -> None:
        """Move the clock; unpin and rescore what expired."""
        self.now_s = max(self.now_s, now_s)
        expired: dict[int, list[int]] = {}
        while self._expiries and self._expiries[0][0] <= self.now_s:
            expiry_s, node_id, block_hash = heapq.heappop(self._expiries)
            pins = self._pins.get(node_id, {})
            if pins.get(block_hash) == expiry_s:  # not refreshed since
                del pins[block_hash]
                expired.setdefault(node_id, []).append(block_hash)
        for node_id, hashes in expired.items():
            strategy = self._evictions.get(node_id)
            if strategy is not None:
                strategy.rescore_hashes(hashes)
