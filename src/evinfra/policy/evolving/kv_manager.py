"""The agent-aware KV manager: eviction by expected next use, dead blocks freed at once,
prefetch from host before a session is expected back.

Scores are the negated expected time of a block's next read (from the session table), so
the strategy pops the block needed furthest in the future (Belady with predictions).
A block's score is read when it becomes evictable and re-read when its session changes
state (finishes a call, goes overdue).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from evinfra.core.eviction import EvictionPolicy, LRUEviction
from evinfra.core.tiered_eviction import TieredEviction
from evinfra.core.types import Request
from evinfra.policy.base import ClusterView, DropBlocks, KVAction, PrefetchBlocks
from evinfra.policy.evolving.sessions import (
    TIER_ACTIVE,
    TIER_AWAY,
    TIER_SHARED,
    SessionEntry,
    SessionTable,
)


@dataclass(frozen=True, slots=True)
class KVManagerConfig:
    agent_eviction: bool = True
    """False: plain LRU per node (the ablation)."""
    free_dead_blocks: bool = True
    prefetch: bool = True
    prefetch_lead_s: float = 2.0
    """Bring a waiting session's KV back from host this long before its expected return."""
    max_idle_s: float = 1800.0
    """A session silent for this long is taken as ended (clients that send no hints)."""


@dataclass(slots=True)
class AgentKVManager:
    table: SessionTable
    config: KVManagerConfig = field(default_factory=KVManagerConfig)
    now_s: float = 0.0
    policies: dict[int, TieredEviction] = field(default_factory=dict)
    _prefetch_due: list[tuple[float, tuple[str, float]]] = field(default_factory=list)
    _overdue_due: list[tuple[float, tuple[str, float]]] = field(default_factory=list)
    num_dropped_blocks: int = 0
    num_prefetches: int = 0

    def eviction_for(self, node_id: int) -> EvictionPolicy:
        if not self.config.agent_eviction:
            return LRUEviction()
        table = self.table

        def score(block_hash: int) -> float:
            return table.keep_score(block_hash, node_id, self.now_s)

        policy = TieredEviction(score, (TIER_AWAY, TIER_ACTIVE, TIER_SHARED))
        self.policies[node_id] = policy
        return policy

    def _rescore(self, entry: SessionEntry) -> None:
        for node_id in entry.nodes:
            policy = self.policies.get(node_id)
            if policy is not None:
                policy.rescore_hashes(entry.context_hashes)

    def _drop(self, hashes: tuple[int, ...], nodes: set[int]) -> list[KVAction]:
        """Free dead blocks on the nodes the session used (its blocks are nowhere else)."""
        if not hashes or not self.config.free_dead_blocks:
            return []
        self.num_dropped_blocks += len(hashes)
        return [DropBlocks(n, hashes) for n in sorted(nodes)]

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        self.now_s = now_s
        arrival = self.table.on_arrival(request, now_s)
        entry = self.table.sessions[arrival.session_id]
        return self._drop(arrival.dead_hashes, entry.nodes)

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        self.now_s = now_s
        entry = self.table.on_finish(request, node_id, now_s)
        if entry is None:
            return []
        if entry.is_last_turn and not entry.num_inflight and not entry.num_children_running:
            # not dropped: other sessions may share its prefix; its blocks rank low now
            self.table.end(entry.session_id)
            return []
        # the blocks just freed are scored when a victim is next needed, with the tier
        # of the session's state then; a tier changes later only when a session stays
        # away past `long_wait_s` after its expected return (the overdue check below)
        ret = entry.expected_return_s()
        key = (entry.session_id, entry.last_finish_s)
        heapq.heappush(self._prefetch_due, (ret - self.config.prefetch_lead_s, key))
        heapq.heappush(self._overdue_due, (ret + self.table.long_wait_s, key))
        return []

    def _waiting_since(self, key: tuple[str, float]) -> bool:
        """The session of `key` still waits since that same finish."""
        entry = self.table.sessions.get(key[0])
        return entry is not None and not entry.num_inflight and entry.last_finish_s == key[1]

    def on_tick(self, view: ClusterView, now_s: float) -> list[KVAction]:
        self.now_s = now_s
        actions: list[KVAction] = []
        while self._prefetch_due and self._prefetch_due[0][0] <= now_s:
            _, key = heapq.heappop(self._prefetch_due)
            entry = self.table.sessions.get(key[0])
            ok = self.config.prefetch and self._waiting_since(key)
            if ok and entry is not None and entry.node_id is not None:
                self.num_prefetches += 1
                actions.append(PrefetchBlocks(entry.node_id, entry.context_hashes))
        while self._overdue_due and self._overdue_due[0][0] <= now_s:
            _, key = heapq.heappop(self._overdue_due)
            if not self._waiting_since(key):
                continue
            # long overdue: its blocks drop to the away tier
            entry = self.table.sessions[key[0]]
            self._rescore(entry)
            if now_s - entry.last_finish_s >= self.config.max_idle_s:
                self.table.end(key[0])
            else:
                heapq.heappush(
                    self._overdue_due, (entry.last_finish_s + self.config.max_idle_s, key)
                )
        return actions
