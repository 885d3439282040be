"""Eviction by a few discrete tiers, least recently freed first inside a tier.

When a scorer gives only a handful of values (the agent-aware KV manager's tiers: away,
active, shared), a heap of per-block scores is more machinery than the order needs: one
ordered list per tier gives the victim in O(1) and never holds stale entries. Blocks are
scored lazily, oldest first, and only as far as a victim needs: a block scored at the
lowest tier beats every block freed after it.

Order: the lowest tier first; inside a tier, the order in which blocks entered it (a
block scored when freed enters in free order; a block whose tier changes on `rescore`
enters its new tier last, and keeps its place when its tier stays the same).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import NoReturn

from evinfra.core.eviction import BlockScorer
from evinfra.core.run_queue import RunQueue

_MISSING = object()
_SCORE_BATCH = 16
"""Unscored blocks read from the queue at a time (the first one in the lowest tier ends
the reading: the rest stay queued, unscored)."""


RunScorer = Callable[[list[int]], list[float]]
"""The scorer's answer for several hashes at once, each as the scorer would score it."""


class TieredEviction:
    def __init__(
        self, scorer: BlockScorer, tiers: Sequence[float], run_scorer: RunScorer | None = None
    ) -> None:
        """`run_scorer`, when given, scores unscored blocks a few at a time (a freed run's
        blocks often share one answer); it may read hashes past the first block that
        lands in the lowest tier, so a scorer that must not be read ahead has none."""
        if not tiers or sorted(set(tiers)) != list(tiers):
            raise ValueError(f"tiers must be distinct and ascending, got {list(tiers)}")
        self._scorer = scorer
        self._run_scorer = run_scorer
        self._tier_index = {score: i for i, score in enumerate(tiers)}
        self._tiers: list[OrderedDict[int, int]] = [OrderedDict() for _ in tiers]
        """Per tier, block id -> hash, in the order they entered the tier."""
        self._pending = RunQueue()
        """Blocks freed and not scored yet, with their hashes, oldest first."""
        self._num_scored = 0
        """Blocks in the tiers (`__len__` is asked before every allocation)."""
        self._block_of: Callable[[int], int | None] | None = None
        self.num_scored = 0

    def bind_index(self, block_of: Callable[[int], int | None]) -> None:
        self._block_of = block_of

    def bind_blocks(self, refs: list[int]) -> bool:
        """Unscored candidates are marked in the pool's counts (`RunQueue.bind`)."""
        self._pending.bind(refs)
        return True

    def run_at(self, block_id: int) -> int:
        return self._pending.run_at(block_id)

    def remove_run(self, block_id: int) -> None:
        self._pending.remove_run(block_id)

    def _tier(self, block_hash: int) -> int:
        score = self._scorer(block_hash)
        self.num_scored += 1
        index = self._tier_index.get(score)
        if index is None:
            self._unknown_tier(score)
        return index

    def add(self, block_id: int, block_hash: int) -> None:
        self._pending.add(block_id, block_hash)

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        self._pending.add_many(block_ids, block_hashes)

    def remove(self, block_id: int) -> None:
        if not self._pending.remove(block_id):
            for tier in self._tiers:
                if tier.pop(block_id, _MISSING) is not _MISSING:
                    self._num_scored -= 1
                    return

    def remove_many(self, block_ids: Sequence[int]) -> None:
        tiers = self._tiers
        for block_id in self._pending.remove_many(block_ids):  # those scored already
            for tier in tiers:
                if tier.pop(block_id, _MISSING) is not _MISSING:
                    self._num_scored -= 1
                    break

    def pop(self) -> int | None:
        """The oldest block of the lowest tier, its tier read again first (a block whose
        tier changed since it was read moves to its new tier and the search goes on)."""
        return self._pop(None)

    def _pop(self, just_scored: int | None) -> int | None:
        """`pop`, `just_scored` the block this pop last put in a tier (not read again)."""
        tiers = self._tiers
        floor = tiers[0]
        # score the unscored, oldest first, until one lands in the lowest tier: it beats
        # every block freed after it (they would enter a tier after it), and when that
        # tier was empty it is the victim at once (it would enter and leave it)
        while True:
            if not floor:
                victim, just_scored = self._score_pending(just_scored)
                if victim is not None:
                    return victim
            lowest = next(filter(None, tiers), None)
            if lowest is None:
                return None
            block_id, block_hash = next(iter(lowest.items()))
            if block_id != just_scored:
                index = self._tier(block_hash)
                if tiers[index] is not lowest:  # its tier changed: it enters the new one
                    del lowest[block_id]
                    self._num_scored -= 1
                    self._enter(tiers[index], block_id, block_hash)
                    continue
            del lowest[block_id]
            self._num_scored -= 1
            return block_id

    def pop_many(self, num_blocks: int) -> list[int]:
        """`pop` `num_blocks` times (fewer when the candidates run out), the scorer's
        answers taken as unchanged between the pops (nothing runs between them). While
        the lowest tier is empty, victims come from the unscored blocks as `pop` finds
        them, read a run at a time (`_take_pending`), or from the head of the lowest
        scored tier, read a few at a time (`_take_scored`); anything else is one `pop`."""
        out: list[int] = []
        floor, pending = self._tiers[0], self._pending
        while len(out) < num_blocks:
            if floor:
                victim = self._pop(None)
            elif pending:
                just_scored = self._take_pending(out, num_blocks)
                if len(out) == num_blocks:
                    break
                # the unscored ran out before this pop's victim: it goes on as `pop` would
                victim = self._pop(just_scored)
            elif self._num_scored:
                self._take_scored(out, num_blocks)
                continue
            else:
                break
            if victim is None:
                break
            out.append(victim)
        return out

    def _take_pending(self, out: list[int], num_blocks: int) -> int | None:
        """With the lowest tier empty: score unscored blocks oldest first, each one that
        lands in the lowest tier a victim (appended to `out`), the others entering their
        tiers, until `out` holds `num_blocks` (returns None) or none is left (returns the
        last block that entered a tier since the last victim, as `pop` would hold it)."""
        tiers, pending, score_of = self._tiers, self._pending, self._scorer
        tier_index, run_scorer = self._tier_index, self._run_scorer
        just_scored = None
        num_read = min(num_blocks - len(out), _SCORE_BATCH)
        while True:
            ids, hashes = pending.front(num_read)
            if not ids:
                return just_scored
            scores = run_scorer(hashes) if run_scorer is not None else None
            if scores is not None and scores.count(scores[0]) == len(ids):
                index = tier_index.get(scores[0])
                if index is not None:  # one answer for all: they enter or leave together
                    num_taken = len(ids) if index else min(len(ids), num_blocks - len(out))
                    self.num_scored += num_taken
                    pending.take_front(num_taken)
                    if index:
                        self._enter_many(tiers[index], ids, hashes)
                        just_scored = ids[-1]
                    else:
                        out += ids[:num_taken]
                        just_scored = None
                        if len(out) == num_blocks:
                            return None
                    num_read = min(2 * num_read, _SCORE_BATCH)
                    continue
            for i, block_hash in enumerate(hashes):
                self.num_scored += 1
                score = score_of(block_hash) if scores is None else scores[i]
                index = tier_index.get(score)
                if not index:
                    if index is None:
                        pending.take_front(i + 1)
                        self._unknown_tier(score)
                    out.append(ids[i])
                    just_scored = None
                    if len(out) == num_blocks:
                        pending.take_front(i + 1)
                        return None
                    continue
                tier = tiers[index]
                num_before = len(tier)
                tier[ids[i]] = block_hash
                self._num_scored += len(tier) - num_before
                just_scored = ids[i]
            pending.take_front(len(ids))
            num_read = min(2 * num_read, _SCORE_BATCH)

    def _take_scored(self, out: list[int], num_blocks: int) -> None:
        """With the lowest tier and the unscored blocks empty: the head blocks of the
        lowest non-empty tier, each read again as `pop` reads it; one still in that tier
        is a victim, one that moved up enters its new tier last (as in `pop`). One that
        moved down is a victim too: every tier below this one is empty (the call only
        takes blocks out of them), so it is alone in the lowest non-empty tier, where
        `pop` would take it next after reading it once more (counted as read twice).
        Old heads of the active tier are often of sessions that have gone away since."""
        tiers, tier_index, score_of = self._tiers, self._tier_index, self._scorer
        lowest_index = next(i for i, tier in enumerate(tiers) if tier)
        lowest = tiers[lowest_index]
        heads = list(islice(lowest.items(), min(num_blocks - len(out), _SCORE_BATCH)))
        scores = None
        if self._run_scorer is not None:
            scores = self._run_scorer([block_hash for _, block_hash in heads])
            index = tier_index.get(scores[0])
            if (
                scores.count(scores[0]) == len(heads)
                and index is not None
                and index <= lowest_index
            ):  # all still in their tier, or all moved down: all victims
                self.num_scored += len(heads) if index == lowest_index else 2 * len(heads)
                self._num_scored -= len(heads)
                for block_id, _ in heads:
                    del lowest[block_id]
                out += [block_id for block_id, _ in heads]
                return
        for i, (block_id, block_hash) in enumerate(heads):
            self.num_scored += 1
            score = score_of(block_hash) if scores is None else scores[i]
            index = tier_index.get(score)
            if index is None:
                self._unknown_tier(score)
            del lowest[block_id]
            self._num_scored -= 1
            if index > lowest_index:
                self._enter(tiers[index], block_id, block_hash)
                continue
            if index < lowest_index:  # `pop` reads it again where it moved
                self.num_scored += 1
                if scores is None:  # the same answer: nothing changes between the reads
                    score_of(block_hash)
            out.append(block_id)

    def _score_pending(self, just_scored: int | None) -> tuple[int | None, int | None]:
        """Score unscored blocks, oldest first, into their tiers until one lands in the
        lowest tier (returned as the victim, taken out) or none is left; also returns the
        last block that entered a tier (else `just_scored`). Blocks are read from the
        queue's front run a few at a time and taken out as they are scored: this runs
        for every block scored, so tiers are read inline (`_tier`, `_enter`). With a run
        scorer, the blocks read at a time double from one, so that the hashes scored past
        the victim are never more than those before it."""
        tiers, pending, score_of = self._tiers, self._pending, self._scorer
        tier_index, run_scorer = self._tier_index, self._run_scorer
        num_read = 1 if run_scorer is not None else _SCORE_BATCH
        while True:
            ids, hashes = pending.front(num_read)
            if not ids:
                return None, just_scored
            scores = run_scorer(hashes) if run_scorer is not None else None
            for i, block_hash in enumerate(hashes):
                self.num_scored += 1
                score = score_of(block_hash) if scores is None else scores[i]
                index = tier_index.get(score)
                if not index:
                    pending.take_front(i + 1)
                    if index is None:
                        self._unknown_tier(score)
                    return ids[i], just_scored
                tier = tiers[index]
                num_before = len(tier)
                tier[ids[i]] = block_hash
                self._num_scored += len(tier) - num_before
                just_scored = ids[i]
            pending.take_front(len(ids))
            if run_scorer is not None:
                num_read = min(2 * num_read, _SCORE_BATCH)

    def _unknown_tier(self, score: float) -> NoReturn:
        raise ValueError(f"score {score} is not one of the tiers {list(self._tier_index)}")

    def _enter(self, tier: OrderedDict[int, int], block_id: int, block_hash: int) -> None:
        num_before = len(tier)
        tier[block_id] = block_hash
        self._num_scored += len(tier) - num_before

    def _enter_many(
        self, tier: OrderedDict[int, int], block_ids: list[int], hashes: list[int]
    ) -> None:
        num_before = len(tier)
        tier.update(zip(block_ids, hashes, strict=True))
        self._num_scored += len(tier) - num_before

    def rescore_hashes(self, hashes: Iterable[int]) -> None:
        """Re-read the tier of the candidates holding these hashes (others are ignored)."""
        block_of = self._block_of
        if block_of is None:  # not attached to a pool: look the candidates up here
            block_of = {h: b for tier in self._tiers for b, h in tier.items()}.get
        self.rescore([b for b in map(block_of, hashes) if b is not None])

    def rescore(self, block_ids: Iterable[int]) -> None:
        tiers = self._tiers
        for block_id in block_ids:
            for tier in tiers:
                block_hash = tier.get(block_id)
                if block_hash is not None:
                    index = self._tier(block_hash)
                    if tiers[index] is not tier:
                        del tier[block_id]
                        self._num_scored -= 1
                        self._enter(tiers[index], block_id, block_hash)
                    break

    def order(self) -> list[int]:
        """The eviction order if nothing changed: scored tiers, then unscored blocks by
        their tier now (for tests and debugging; reads scores, changes nothing)."""
        pending_by_tier: list[list[int]] = [[] for _ in self._tiers]
        for block_id, block_hash in self._pending.items():
            score = self._scorer(block_hash)
            pending_by_tier[self._tier_index[score]].append(block_id)
        out: list[int] = []
        for tier, later in zip(self._tiers, pending_by_tier, strict=True):
            out += list(tier) + later
        return out

    def __len__(self) -> int:
        return len(self._pending) + self._num_scored

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._pending or any(block_id in t for t in self._tiers)
