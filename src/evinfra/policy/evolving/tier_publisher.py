"""What the agent-aware KV manager tells nodes whose eviction runs in another process.

A node's `PublishedTiers` knows only the tiers it was sent. On each session event the
publisher reads `SessionTable.keep_score` for every block of the session's context and
sends the blocks whose tier is not the default (active) to every node the session used,
plus a reset to active for blocks it marked before and no longer does (a session back
from an away wait). One batch per session event, at most one action per node and tier.

A node forgets a block's tier when the block is freed (a request used it); the session
whose call just finished republishes its marks in full, so a block it shares keeps its
tier on the node where the call ran. Between events nothing is sent: an unchanged
session costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evinfra.policy.base import KVAction, ScoreBlocks
from evinfra.policy.evolving.sessions import TIER_ACTIVE, SessionEntry, SessionTable


@dataclass(slots=True)
class TierPublisher:
    table: SessionTable
    _sent: dict[str, tuple[tuple[int, ...], dict[int, float]]] = field(default_factory=dict)
    """Session id -> (nodes, hash -> tier of the blocks marked) at its last publish."""
    num_actions: int = 0
    num_hashes: int = 0

    def publish(self, entry: SessionEntry, now_s: float, full: bool = False) -> list[KVAction]:
        """`ScoreBlocks` for the session's blocks on the nodes it used: its marks (tiers
        other than active) and resets of marks it no longer holds. Without `full`,
        nothing when neither the marks nor the nodes changed since the last publish."""
        nodes = tuple(sorted(entry.nodes))
        if not nodes:
            return []
        score = self.table.keep_score
        marks: dict[int, float] = {}
        for h in entry.context_hashes:
            tier = score(h, nodes[0], now_s)  # the tiers are the same on every node
            if tier != TIER_ACTIVE:
                marks[h] = tier
        last_nodes, last_marks = self._sent.get(entry.session_id, ((), {}))
        if not full and nodes == last_nodes and marks == last_marks:
            return []
        self._sent[entry.session_id] = (nodes, marks)
        by_tier: dict[float, list[int]] = {}
        for h, tier in marks.items():
            by_tier.setdefault(tier, []).append(h)
        resets = [h for h in last_marks if h not in marks]
        if resets:
            by_tier[TIER_ACTIVE] = resets
        actions: list[KVAction] = [
            ScoreBlocks(n, tier, tuple(hashes))
            for n in nodes
            for tier, hashes in sorted(by_tier.items())
        ]
        self.num_actions += len(actions)
        self.num_hashes += sum(len(a.hashes) for a in actions if isinstance(a, ScoreBlocks))
        return actions

    def forget(self, session_id: str) -> None:
        """The session ended and its final tiers went out: keep nothing for it."""
        self._sent.pop(session_id, None)
