"""The agent-aware KV manager: eviction by expected next use, dead blocks freed at once,
prefetch from host before a session is expected back.

Scores are tiers read from the session table (`SessionTable.keep_score`: away < active <
shared), least recently freed first inside a tier (`TieredEviction`). A block's tier is
read when a victim is next needed and re-read when its session changes state (goes
overdue).

Two ways to reach a node's strategy, one scoring function (`SessionTable.keep_score`):
in process (the simulator), the strategy reads the table when it needs a tier; across
processes (`publish_scores`: the servers' workers), the manager computes the tiers of a
session's blocks whenever they may change and sends them as `ScoreBlocks` actions, one
batch per session event (a call arrives or finishes, the session nears its expected
return, goes long overdue, ends), and the node's `PublishedTiers` orders by them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from evinfra.core.eviction import EvictionPolicy, LRUEviction
from evinfra.core.tiered_eviction import TieredEviction
from evinfra.core.types import Request
from evinfra.policy.base import ClusterView, DropBlocks, KVAction, PrefetchBlocks, ScoreBlocks
from evinfra.policy.evolving.sessions import (
    TIER_ACTIVE,
    TIER_AWAY,
    TIER_SHARED,
    SessionEntry,
    SessionTable,
)
from evinfra.policy.evolving.tier_publisher import TierPublisher
from evinfra.policy.published import PublishedTiers

TIERS = (TIER_AWAY, TIER_ACTIVE, TIER_SHARED)


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
    publish_scores: bool = False
    """True: node eviction runs in other processes and is told tiers by `ScoreBlocks`
    (`ClusterShape.eviction_in_process` False); False: it reads the table in process."""
    deliver_in_process: bool = False
    """With `publish_scores`: the nodes are in this process (the simulator run through
    the servers' path, `tier_messages`): the manager hands each `ScoreBlocks` to the
    node's strategy itself instead of returning it."""


def drop_where_session_ran(hashes: tuple[int, ...], nodes: set[int]) -> list[KVAction]:
    """Free a session's dead blocks on the nodes it used (`SessionEntry.nodes`: its blocks
    are nowhere else), in node order."""
    return [DropBlocks(n, hashes) for n in sorted(nodes)]


def run_keep_scores(
    table: SessionTable, hashes: list[int], node_id: int, now_s: float
) -> list[float]:
    """`table.keep_score` of each hash, read once for hashes that one live session holds
    alone (the usual freed run): `keep_score` reads a hash's owner, whether an ownerless
    hash is an orphan and whether it is shared; past those, only the owner's entry and
    the time, so such hashes score alike (`test_run_keep_scores_are_keep_scores`)."""
    first = table.owner.get(hashes[0])
    if (
        len(hashes) > 1
        and first is not None
        and first in table.sessions
        and list(map(table.owner.get, hashes)).count(first) == len(hashes)
        and table.shared.keys().isdisjoint(hashes)
    ):
        return [table.keep_score(hashes[0], node_id, now_s)] * len(hashes)
    return [table.keep_score(h, node_id, now_s) for h in hashes]


@dataclass(slots=True)
class AgentKVManager:
    table: SessionTable
    config: KVManagerConfig = field(default_factory=KVManagerConfig)
    now_s: float = 0.0
    policies: dict[int, TieredEviction] = field(default_factory=dict)
    publisher: TierPublisher | None = None
    """Set when `publish_scores` (and agent eviction) is on."""
    published: dict[int, PublishedTiers] = field(default_factory=dict)
    """`deliver_in_process`: each node's strategy, to hand the tiers to."""
    _prefetch_due: list[tuple[float, tuple[str, float]]] = field(default_factory=list)
    _overdue_due: list[tuple[float, tuple[str, float]]] = field(default_factory=list)
    _return_due: list[tuple[float, tuple[str, float]]] = field(default_factory=list)
    """Publishing only: sessions away on a long wait, when they come within
    `long_wait_s` of their expected return (their tier rises to active then)."""
    num_dropped_blocks: int = 0
    num_prefetches: int = 0

    def __post_init__(self) -> None:
        if self.config.agent_eviction and self.config.publish_scores:
            self.publisher = TierPublisher(self.table)

    def eviction_for(self, node_id: int) -> EvictionPolicy:
        if not self.config.agent_eviction:
            return LRUEviction()
        if self.publisher is not None:
            tiers = PublishedTiers(TIERS, default=TIER_ACTIVE)
            if self.config.deliver_in_process:
                self.published[node_id] = tiers
            return tiers
        table = self.table
        keep_score = table.keep_score  # bound once: a victim may score many blocks

        def score(block_hash: int) -> float:
            return keep_score(block_hash, node_id, self.now_s)

        def score_run(hashes: list[int]) -> list[float]:
            return run_keep_scores(table, hashes, node_id, self.now_s)

        policy = TieredEviction(score, TIERS, score_run)
        self.policies[node_id] = policy
        return policy

    def _tiers_changed(self, entry: SessionEntry | None, full: bool = False) -> list[KVAction]:
        """Publishing: the session's tiers for the nodes it used. In process: nothing (a
        node reads a tier when it needs one)."""
        if self.publisher is None or entry is None:
            return []
        return self._sent(self.publisher.publish(entry, self.now_s, full))

    def _sent(self, actions: list[KVAction]) -> list[KVAction]:
        """The publisher's `ScoreBlocks`: returned for the runtime to send, or handed to
        the nodes' strategies here when they live in this process."""
        if not self.config.deliver_in_process:
            return actions
        for action in actions:
            if isinstance(action, ScoreBlocks):
                self.published[action.node_id].set_scores(action.score, action.hashes)
        return []

    def _rescore(self, entry: SessionEntry) -> list[KVAction]:
        """The session's tiers changed while its blocks sat as candidates."""
        if self.publisher is not None:
            return self._sent(self.publisher.publish(entry, self.now_s))
        for node_id in entry.nodes:
            policy = self.policies.get(node_id)
            if policy is not None:
                policy.rescore_hashes(entry.context_hashes)
        return []

    def _end(self, entry: SessionEntry) -> list[KVAction]:
        """The session is over: its blocks become orphans (away); its parent may be idle."""
        self.table.end(entry.session_id)
        if self.publisher is None:
            return []
        actions = self._sent(self.publisher.publish(entry, self.now_s))
        self.publisher.forget(entry.session_id)
        return actions + self._tiers_changed(self._parent(entry))

    def _parent(self, entry: SessionEntry) -> SessionEntry | None:
        return None if entry.parent_id is None else self.table.sessions.get(entry.parent_id)

    def on_route(self, request_id: int, node_ids: tuple[int, ...]) -> None:
        """The request was placed on these nodes (what the router notes in the table it
        shares with this manager; a replica of the manager elsewhere is told here)."""
        self.table.note_route(request_id, node_ids)

    def _drop(self, hashes: tuple[int, ...], nodes: set[int]) -> list[KVAction]:
        if not hashes or not self.config.free_dead_blocks:
            return []
        self.num_dropped_blocks += len(hashes)
        return drop_where_session_ran(hashes, nodes)

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        self.now_s = now_s
        arrival = self.table.on_arrival(request, now_s)
        entry = self.table.sessions[arrival.session_id]
        actions = self._drop(arrival.dead_hashes, entry.nodes)
        if self.publisher is not None:
            # generating now: its blocks elsewhere (and a new child's parent's) are active
            actions += self._tiers_changed(entry)
            if entry.num_turns == 1:
                actions += self._tiers_changed(self._parent(entry))
        return actions

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        self.now_s = now_s
        entry = self.table.on_finish(request, node_id, now_s)
        if entry is None:
            return []
        if entry.is_last_turn and not entry.num_inflight and not entry.num_children_running:
            # not dropped: other sessions may share its prefix; its blocks rank low now
            return self._end(entry)
        # in process, the blocks just freed are scored when a victim is next needed, with
        # the tier of the session's state then; a tier changes later only when a session
        # stays away past `long_wait_s` after its expected return (the overdue check)
        ret = entry.expected_return_s()
        key = (entry.session_id, entry.last_finish_s)
        heapq.heappush(self._prefetch_due, (ret - self.config.prefetch_lead_s, key))
        heapq.heappush(self._overdue_due, (ret + self.table.long_wait_s, key))
        if self.publisher is None:
            return []
        if ret - now_s > self.table.long_wait_s:
            heapq.heappush(self._return_due, (ret - self.table.long_wait_s, key))
        # the node that ran the call forgot the tiers of the blocks it freed: send all
        return self._tiers_changed(entry, full=True)

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
        while self._return_due and self._return_due[0][0] <= now_s:
            _, key = heapq.heappop(self._return_due)
            if self._waiting_since(key):
                actions += self._tiers_changed(self.table.sessions[key[0]])
        while self._overdue_due and self._overdue_due[0][0] <= now_s:
            _, key = heapq.heappop(self._overdue_due)
            if not self._waiting_since(key):
                continue
            # long overdue: its blocks drop to the away tier
            entry = self.table.sessions[key[0]]
            actions += self._rescore(entry)
            if now_s - entry.last_finish_s >= self.config.max_idle_s:
                actions += self._end(entry)
            else:
                heapq.heappush(
                    self._overdue_due, (entry.last_finish_s + self.config.max_idle_s, key)
                )
        return actions
