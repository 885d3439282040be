"""Eviction strategies for a KV pool: which evictable (cached, unreferenced) block goes next.

A strategy only orders blocks; the pool owns them. LRU needs no scores: blocks enter in the
order they should leave, and a sequence frees its blocks tail first, so its tail goes first.
Score-based strategies (the agent-aware KV manager's) pop the lowest score from a heap with
lazy deletion, and accept new scores when the signals behind them change.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import count, repeat
from typing import Protocol


class EvictionPolicy(Protocol):
    def add(self, block_id: int, block_hash: int) -> None:
        """Mark a block evictable; it becomes a candidate. Mutates the strategy only."""

    def remove(self, block_id: int) -> None:
        """Take a block out of the candidates (it was hit or freed outright)."""

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        """`add` each block in turn (the pool frees a sequence's blocks in one call)."""

    def remove_many(self, block_ids: Sequence[int]) -> None:
        """`remove` each block (a cached prefix acquired at once)."""

    def pop(self) -> int | None:
        """Remove and return the next victim, or None when there is none."""

    def __len__(self) -> int: ...

    def __contains__(self, block_id: object) -> bool: ...


class LRUEviction:
    """Least recently freed goes first; ties follow the order of `add` calls."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def add(self, block_id: int, block_hash: int) -> None:
        self._order[block_id] = None

    def remove(self, block_id: int) -> None:
        self._order.pop(block_id, None)

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        self._order.update(zip(block_ids, repeat(None)))

    def remove_many(self, block_ids: Sequence[int]) -> None:
        pop = self._order.pop
        for block_id in block_ids:
            pop(block_id, None)

    def pop(self) -> int | None:
        if not self._order:
            return None
        block_id, _ = self._order.popitem(last=False)
        return block_id

    def order(self) -> list[int]:
        """The current eviction order, first victim first (for tests and debugging)."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._order


BlockScorer = Callable[[int], float]
"""Maps a block hash to a keep-score: the lowest score is evicted first."""


class ScoredEviction:
    """Lowest score first; equal scores in the order they were added (LRU among equals).

    Scores are read lazily: a block added is scored when a victim is next needed (most
    freed blocks are hit again before that and never cost a score), and `rescore` re-reads
    the score of blocks whose signals changed (a session went to a tool, came back...).
    """

    def __init__(self, scorer: BlockScorer, min_score: float | None = None) -> None:
        self._scorer = scorer
        self._min_score = min_score
        """The lowest score the scorer gives, when known: a candidate already scored at it
        is the next victim whatever the unscored ones score (they were added later, so
        they lose ties), and they stay unscored."""
        self._heap: list[tuple[float, int, int]] = []
        self._live: dict[int, tuple[float, int]] = {}
        self._pending: OrderedDict[int, int] = OrderedDict()
        """block id -> sequence number, in the order added, not yet scored (ordered: a
        partial flush takes them from the front)."""
        self._hash_of: dict[int, int] = {}
        self._id_of: dict[int, int] = {}
        self._seq = 0
        self.num_scored = 0

    def add(self, block_id: int, block_hash: int) -> None:
        self._hash_of[block_id] = block_hash
        self._id_of[block_hash] = block_id
        self._seq += 1
        self._pending[block_id] = self._seq

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        # dict updates from zips run in C: a freed 100k-token context is 1,600 blocks
        self._hash_of.update(zip(block_ids, block_hashes, strict=True))
        self._id_of.update(zip(block_hashes, block_ids, strict=True))
        start = self._seq + 1
        self._pending.update(zip(block_ids, count(start)))
        self._seq = start + len(block_ids) - 1

    def remove_many(self, block_ids: Sequence[int]) -> None:
        live_pop, pending_pop = self._live.pop, self._pending.pop
        hash_pop, id_of = self._hash_of.pop, self._id_of
        for block_id in block_ids:
            live_pop(block_id, None)
            pending_pop(block_id, None)
            h = hash_pop(block_id, None)
            if h is not None and id_of.get(h) == block_id:
                del id_of[h]

    def _flush(self, until_floor: bool = False) -> None:
        """Score the unscored candidates, oldest first; with `until_floor` (and a known
        `min_score`) stop at the first one that scores at the floor: it beats every one
        left (same score or higher, added later)."""
        pending, scorer, hash_of = self._pending, self._scorer, self._hash_of
        floor = self._min_score if until_floor else None
        if floor is None:
            for block_id, seq in pending.items():
                self._push(block_id, scorer(hash_of[block_id]), seq)
            self.num_scored += len(pending)
            pending.clear()
        else:
            while pending:
                block_id, seq = pending.popitem(last=False)
                score = scorer(hash_of[block_id])
                self._push(block_id, score, seq)
                self.num_scored += 1
                if score <= floor:
                    break
        if len(self._heap) > 4 * len(self._live) + 64:
            self._heap = [(sc, sq, b) for b, (sc, sq) in self._live.items()]
            heapq.heapify(self._heap)

    def _push(self, block_id: int, score: float, seq: int) -> None:
        self._live[block_id] = (score, seq)
        heapq.heappush(self._heap, (score, seq, block_id))

    def rescore_hashes(self, hashes: Iterable[int]) -> None:
        """Re-read the score of the candidates holding these hashes (others are ignored)."""
        id_of = self._id_of
        self.rescore([id_of[h] for h in hashes if h in id_of])

    def rescore(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            entry = self._live.get(block_id)
            if entry is not None:
                # keep the LRU position among equals: reuse the old sequence number
                self._push(block_id, self._scorer(self._hash_of[block_id]), entry[1])
        self.num_scored += len(block_ids)

    def remove(self, block_id: int) -> None:
        self._live.pop(block_id, None)
        self._pending.pop(block_id, None)
        h = self._hash_of.pop(block_id, None)
        if h is not None and self._id_of.get(h) == block_id:
            del self._id_of[h]

    def pop(self) -> int | None:
        """The lowest-scored candidate. Its score is read again first: a block whose
        score rose since it was read (its session's plans changed) goes back in the heap
        with the new score, so stale scores never evict a block that became valuable."""
        if self._pending and not self._floor_on_top():
            self._flush(until_floor=True)
        heap = self._heap
        while heap:
            score, seq, block_id = heapq.heappop(heap)
            if self._live.get(block_id) != (score, seq):
                continue
            current = self._scorer(self._hash_of[block_id])
            self.num_scored += 1
            if current > score and self._pending:
                self._flush()  # it rose: compare with every candidate, unscored ones too
                heap = self._heap  # (a flush may rebuild the heap)
            if current > score and heap and current > heap[0][0]:
                self._push(block_id, current, seq)
                continue
            self.remove(block_id)
            return block_id
        if self._pending:
            self._flush()
            return self.pop()
        return None

    def _floor_on_top(self) -> bool:
        """Whether the heap's top is a live candidate at the lowest possible score."""
        if self._min_score is None or not self._heap:
            return False
        score, seq, block_id = self._heap[0]
        return score <= self._min_score and self._live.get(block_id) == (score, seq)

    def __len__(self) -> int:
        return len(self._live) + len(self._pending)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._live or block_id in self._pending
