"""Eviction by scores a KV manager publishes to a node, for nodes in another process.

In the simulator a node's eviction strategy reads the KV manager's session table
directly (a closure). A server's node worker is another process: it gets a copy of this
strategy at start and is told the scores through `ScoreBlocks` actions (the runtime turns
them into messages), and orders its candidates exactly as `TieredEviction` does, reading
the scores it was told.

What the node keeps: hash -> tier, only for tiers other than `default` (an unknown
block is worth keeping: unknown is not dead). An entry lasts until its block is freed
again: a free means a request just used the block, and the request's session publishes
the tiers of its context when it finishes, so an entry set by another session (an ended
session's prefix marked away, since taken up by a live one) never outlives the next use.
Entries for content the node no longer holds are pruned when the map grows (amortised).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from evinfra.core.tiered_eviction import TieredEviction

MIN_PRUNE_ENTRIES = 4096


@runtime_checkable
class ScoreSink(Protocol):
    """An eviction strategy that takes published scores (`ScoreBlocks`)."""

    def set_scores(self, score: float, hashes: Iterable[int]) -> None:
        """These hashes' keep-score is now `score`; candidates holding them are re-ranked.
        Mutates the strategy only."""


class PublishedTiers(TieredEviction):
    """`TieredEviction` over the tiers a KV manager published; `default` for the rest."""

    def __init__(self, tiers: Sequence[float], default: float) -> None:
        if default not in tiers:
            raise ValueError(f"default tier {default} is not one of {list(tiers)}")
        self._scores: dict[int, float] = {}
        self._default = default
        self._known = frozenset(tiers)
        self._prune_at = MIN_PRUNE_ENTRIES
        self.num_published = 0
        super().__init__(self.score, tiers)

    def score(self, block_hash: int) -> float:
        return self._scores.get(block_hash, self._default)

    def set_scores(self, score: float, hashes: Iterable[int]) -> None:
        if score not in self._known:
            raise ValueError(f"score {score} is not one of the tiers {sorted(self._known)}")
        hashes = tuple(hashes)
        scores = self._scores
        if score == self._default:
            for h in hashes:
                scores.pop(h, None)
        else:
            scores.update(dict.fromkeys(hashes, score))
        self.num_published += len(hashes)
        self.rescore_hashes(hashes)
        if len(scores) > self._prune_at:
            self._prune()

    def add(self, block_id: int, block_hash: int) -> None:
        if self._scores:
            self._scores.pop(block_hash, None)
        super().add(block_id, block_hash)

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        scores = self._scores
        if scores:
            for h in block_hashes:
                scores.pop(h, None)
        super().add_many(block_ids, block_hashes)

    def _prune(self) -> None:
        """Forget scores of content this node no longer holds."""
        block_of = self._block_of
        if block_of is not None:
            self._scores = {h: s for h, s in self._scores.items() if block_of(h) is not None}
        self._prune_at = max(MIN_PRUNE_ENTRIES, 2 * len(self._scores))

    @property
    def num_scores(self) -> int:
        """Entries held (hashes with a tier other than the default)."""
        return len(self._scores)
