"""Eviction strategies for a KV pool: which evictable (cached, unreferenced) block goes next.

A strategy only orders blocks; the pool owns them. LRU needs no scores: blocks enter in the
order they should leave, and a sequence frees its blocks tail first, so its tail goes first.
Score-based strategies (the agent-aware KV manager's) pop the lowest score from a heap with
lazy deletion, and accept new scores when the signals behind them change.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from itertools import count
from typing import Protocol

from evinfra.core.run_queue import RunQueue


class EvictionPolicy(Protocol):
    def add(self, block_id: int, block_hash: int) -> None:
        """Mark a block evictable; it becomes a candidate. Mutates the strategy only."""

    def remove(self, block_id: int) -> None:
        """Take a block out of the candidates (it was hit or freed outright)."""

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        """`add` each block in turn (the pool frees a sequence's blocks in one call)."""

    def remove_many(self, block_ids: Sequence[int]) -> None:
        """`remove` each block (a cached prefix acquired at once)."""

    def run_at(self, block_id: int) -> int:
        """How many blocks the `add_many` call whose first block is `block_id` added,
        when all of them are still candidates from that call and none was taken, moved
        or scored since (its order untouched); 0 otherwise. Mutates nothing."""

    def remove_run(self, block_id: int) -> None:
        """`remove_many` of the blocks of the untouched run `run_at(block_id)` counts."""

    def pop(self) -> int | None:
        """Remove and return the next victim, or None when there is none."""

    def pop_many(self, num_blocks: int) -> list[int]:
        """`pop` `num_blocks` times in one call, nothing else changing between the pops
        (the pool's eviction for one allocation); fewer when the candidates run out."""

    def bind_index(self, block_of: Callable[[int], int | None]) -> None:
        """The pool tells where each hash is held (for strategies that look hashes up)."""

    def bind_blocks(self, refs: list[int]) -> bool:
        """The pool lends its per-block reference counts, before any block is added.
        Returns True when the strategy marks its candidates there itself (negative
        words, `RunQueue.bind`'s contract): the pool then treats a word <= 0 as
        unused and leaves a candidate's word to the strategy."""

    def __len__(self) -> int: ...

    def __contains__(self, block_id: object) -> bool: ...


class LRUEviction:
    """Least recently freed goes first; ties follow the order of `add` calls."""

    def __init__(self) -> None:
        self._order = RunQueue()

    def add(self, block_id: int, block_hash: int) -> None:
        self._order.add(block_id, block_hash)

    def remove(self, block_id: int) -> None:
        self._order.remove(block_id)

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        self._order.add_many(block_ids, block_hashes)

    def remove_many(self, block_ids: Sequence[int]) -> None:
        self._order.remove_many(block_ids)

    def bind_index(self, block_of: Callable[[int], int | None]) -> None:
        """LRU never looks hashes up."""

    def bind_blocks(self, refs: list[int]) -> bool:
        self._order.bind(refs)
        return True

    def run_at(self, block_id: int) -> int:
        return self._order.run_at(block_id)

    def remove_run(self, block_id: int) -> None:
        self._order.remove_run(block_id)

    def pop(self) -> int | None:
        oldest = self._order.pop_front()
        return None if oldest is None else oldest[0]

    def pop_many(self, num_blocks: int) -> list[int]:
        return _pop_each(self, num_blocks)

    def order(self) -> list[int]:
        """The current eviction order, first victim first (for tests and debugging)."""
        return [block_id for block_id, _ in self._order.items()]

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
    A candidate's content hash travels with its entry; hash -> block lookups for
    `rescore_hashes` go to the pool's own index (`bind_index`), not to a copy of it.
    """

    def __init__(self, scorer: BlockScorer) -> None:
        self._scorer = scorer
        self._heap: list[tuple[float, int, int]] = []
        self._live: dict[int, tuple[float, int, int]] = {}
        """block id -> (score, sequence number, hash) of scored candidates."""
        self._pending: dict[int, tuple[int, int]] = {}
        """block id -> (sequence number, hash), in the order added, not yet scored."""
        self._block_of: Callable[[int], int | None] | None = None
        self._seq = 0
        self.num_scored = 0

    def bind_index(self, block_of: Callable[[int], int | None]) -> None:
        """Where `rescore_hashes` finds the block holding a hash (the pool's index)."""
        self._block_of = block_of

    def bind_blocks(self, refs: list[int]) -> bool:
        """Candidates are kept in dicts here: the pool's counts stay as they are."""
        return False

    def run_at(self, block_id: int) -> int:
        """Runs are not kept: a freed run is removed block by block."""
        return 0

    def remove_run(self, block_id: int) -> None:
        raise ValueError(f"no run at block {block_id}: ScoredEviction keeps no runs")

    def add(self, block_id: int, block_hash: int) -> None:
        self._seq += 1
        self._pending[block_id] = (self._seq, block_hash)

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        # one dict update from zips, in C: a freed 100k-token context is 1,600 blocks
        start = self._seq + 1
        self._pending.update(
            zip(block_ids, zip(count(start), block_hashes, strict=False), strict=True)
        )
        self._seq = start + len(block_ids) - 1

    def remove(self, block_id: int) -> None:
        self._live.pop(block_id, None)
        self._pending.pop(block_id, None)

    def remove_many(self, block_ids: Sequence[int]) -> None:
        live_pop, pending_pop = self._live.pop, self._pending.pop
        for block_id in block_ids:
            live_pop(block_id, None)
            pending_pop(block_id, None)

    def _flush(self) -> None:
        pending, scorer, push = self._pending, self._scorer, self._push
        for block_id, (seq, h) in pending.items():
            push(block_id, scorer(h), seq, h)
        self.num_scored += len(pending)
        pending.clear()
        if len(self._heap) > 4 * len(self._live) + 64:
            self._heap = [(sc, sq, b) for b, (sc, sq, _) in self._live.items()]
            heapq.heapify(self._heap)

    def _push(self, block_id: int, score: float, seq: int, block_hash: int) -> None:
        self._live[block_id] = (score, seq, block_hash)
        heapq.heappush(self._heap, (score, seq, block_id))

    def rescore_hashes(self, hashes: Iterable[int]) -> None:
        """Re-read the score of the candidates holding these hashes (others are ignored)."""
        block_of = self._block_of
        if block_of is None:  # not attached to a pool: look the candidates up here
            block_of = {h: b for b, (_, _, h) in self._live.items()}.get
        self.rescore([b for b in map(block_of, hashes) if b is not None])

    def rescore(self, block_ids: list[int]) -> None:
        live, scorer = self._live, self._scorer
        for block_id in block_ids:
            entry = live.get(block_id)
            if entry is not None:
                # keep the LRU position among equals: reuse the old sequence number
                self._push(block_id, scorer(entry[2]), entry[1], entry[2])
        self.num_scored += len(block_ids)

    def pop(self) -> int | None:
        """The lowest-scored candidate. Its score is read again first: a block whose
        score rose since it was read (its session's plans changed) goes back in the heap
        with the new score, so stale scores never evict a block that became valuable."""
        if self._pending:
            self._flush()
        heap, live = self._heap, self._live
        while heap:
            score, seq, block_id = heapq.heappop(heap)
            entry = live.get(block_id)
            if entry is None or entry[1] != seq or entry[0] != score:
                continue
            current = self._scorer(entry[2])
            self.num_scored += 1
            if current > score and heap and current > heap[0][0]:
                self._push(block_id, current, seq, entry[2])
                continue
            del live[block_id]
            return block_id
        return None

    def pop_many(self, num_blocks: int) -> list[int]:
        return _pop_each(self, num_blocks)

    def __len__(self) -> int:
        return len(self._live) + len(self._pending)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._live or block_id in self._pending


def _pop_each(policy: EvictionPolicy, num_blocks: int) -> list[int]:
    """`pop_many` as `num_blocks` calls of `pop`."""
    out: list[int] = []
    pop = policy.pop
    for _ in range(num_blocks):
        victim = pop()
        if victim is None:
            break
        out.append(victim)
    return out
