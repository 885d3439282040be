"""Eviction by a few discrete tiers, least recently freed first inside a tier.

When a scorer gives only a handful of values (the agent-aware KV manager's tiers: away,
active, shared), a heap of per-block scores is more machinery than the order needs: one
queue per tier gives the victim in O(1) and never holds stale entries. Blocks are
scored lazily, oldest first, and only as far as a victim needs: a block scored at the
lowest tier beats every block freed after it.

The unscored blocks and each tier are lanes of one `RunQueue`: a freed context is one
run, and when a run scorer says all of a run's blocks share a tier, the run moves to
that tier whole (its blocks untouched), so that acquiring the context again later is
still one run taken out (`run_at`, `remove_run`) and not one removal per block.

Order: the lowest tier first; inside a tier, the order in which blocks entered it (a
block scored when freed enters in free order; a block whose tier changes on `rescore`
enters its new tier last, and keeps its place when its tier stays the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NoReturn

from evinfra.core.eviction import BlockScorer
from evinfra.core.run_queue import RunQueue

_SCORE_BATCH = 16
"""Blocks read from the front of a lane at a time (a run scorer's answer for them all
decides, when it has one; else they are read one by one, as far as needed)."""
_WHOLE = 1 << 62
"""`RunQueue.front`'s limit that reads a lane's front run to its next stale entry."""
_PENDING = 0
"""The lane of the unscored blocks; tier `i` (ascending) is lane `i + 1`."""
_FLOOR = 1


RunScorer = Callable[[list[int]], list[float]]
"""The scorer's answer for several hashes at once, each as the scorer would score it."""


class TieredEviction:
    def __init__(
        self, scorer: BlockScorer, tiers: Sequence[float], run_scorer: RunScorer | None = None
    ) -> None:
        """`run_scorer`, when given, scores unscored blocks several at a time (a freed
        run's blocks often share one answer); it may read hashes past the first block
        that lands in the lowest tier, so a scorer that must not be read ahead has none."""
        if not tiers or sorted(set(tiers)) != list(tiers):
            raise ValueError(f"tiers must be distinct and ascending, got {list(tiers)}")
        self._scorer = scorer
        self._run_scorer = run_scorer
        self._lane_of = {score: i + 1 for i, score in enumerate(tiers)}
        self._queue = RunQueue(num_lanes=len(tiers) + 1)
        self._sizes = self._queue.lane_sizes
        """Blocks per lane: the unscored first, then each tier."""
        self._block_of: Callable[[int], int | None] | None = None
        self.num_scored = 0

    def bind_index(self, block_of: Callable[[int], int | None]) -> None:
        self._block_of = block_of

    def bind_blocks(self, refs: list[int]) -> bool:
        """Candidates, scored or not, are marked in the pool's counts (`RunQueue.bind`)."""
        self._queue.bind(refs)
        return True

    def run_at(self, block_id: int) -> int:
        return self._queue.run_at(block_id)

    def remove_run(self, block_id: int) -> None:
        self._queue.remove_run(block_id)

    def _lane(self, block_hash: int) -> int:
        score = self._scorer(block_hash)
        self.num_scored += 1
        lane = self._lane_of.get(score)
        if lane is None:
            self._unknown_tier(score)
        return lane

    def add(self, block_id: int, block_hash: int) -> None:
        self._queue.add_many([block_id], [block_hash])

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        self._queue.add_many(block_ids, block_hashes)

    def remove(self, block_id: int) -> None:
        self._queue.remove(block_id)

    def remove_many(self, block_ids: Sequence[int]) -> None:
        self._queue.remove_many(block_ids)

    def pop(self) -> int | None:
        """The oldest block of the lowest tier, its tier read again first (a block whose
        tier changed since it was read moves to its new tier and the search goes on)."""
        return self._pop(None)

    def _lowest_tier(self) -> int | None:
        sizes = self._sizes
        return next((lane for lane in range(_FLOOR, len(sizes)) if sizes[lane]), None)

    def _pop(self, just_scored: int | None) -> int | None:
        """`pop`, `just_scored` the block this pop last put in a tier (not read again)."""
        queue, sizes = self._queue, self._sizes
        # score the unscored, oldest first, until one lands in the lowest tier: it beats
        # every block freed after it (they would enter a tier after it), and when that
        # tier was empty it is the victim at once (it would enter and leave it)
        while True:
            if not sizes[_FLOOR]:
                victim, just_scored = self._score_pending(just_scored)
                if victim is not None:
                    return victim
            lane = self._lowest_tier()
            if lane is None:
                return None
            ids, hashes = queue.front(1, lane)
            if ids[0] != just_scored:
                new_lane = self._lane(hashes[0])
                if new_lane != lane:  # its tier changed: it enters the new one
                    queue.move_front(1, lane, new_lane)
                    continue
            queue.take_front(1, lane)
            return ids[0]

    def pop_many(self, num_blocks: int) -> list[int]:
        """`pop` `num_blocks` times (fewer when the candidates run out), the scorer's
        answers taken as unchanged between the pops (nothing runs between them). While
        the lowest tier is empty, victims come from the unscored blocks as `pop` finds
        them (`_take_pending`), or from the head of the lowest scored tier
        (`_take_scored`), read a few at a time; anything else is one `pop`."""
        out: list[int] = []
        sizes = self._sizes
        while len(out) < num_blocks:
            if sizes[_FLOOR]:
                victim = self._pop(None)
            elif sizes[_PENDING]:
                just_scored = self._take_pending(out, num_blocks)
                if len(out) == num_blocks:
                    break
                # the unscored ran out before this pop's victim: it goes on as `pop` would
                victim = self._pop(just_scored)
            elif len(self._queue):
                self._take_scored(out, num_blocks)
                continue
            else:
                break
            if victim is None:
                break
            out.append(victim)
        return out

    def _read_run(self, hashes: list[int]) -> tuple[int | None, list[float] | None]:
        """The run scorer's answers for these hashes (None without one) and, when they
        are one tier's, its lane (else None: they are taken one by one)."""
        if self._run_scorer is None:
            return None, None
        scores = self._run_scorer(hashes)
        if scores.count(scores[0]) != len(scores):
            return None, scores
        return self._lane_of.get(scores[0]), scores

    def _take_pending(self, out: list[int], num_blocks: int) -> int | None:
        """With the lowest tier empty: score unscored blocks oldest first, each one that
        lands in the lowest tier a victim (appended to `out`), the others entering their
        tiers, until `out` holds `num_blocks` (returns None) or none is left (returns the
        last block that entered a tier since the last victim, as `pop` would hold it)."""
        queue = self._queue
        just_scored = None
        while True:
            ids, hashes = queue.front(_SCORE_BATCH, _PENDING)
            if not ids:
                return just_scored
            lane, scores = self._read_run(hashes)
            if lane == _FLOOR:  # victims, as many as wanted
                num_taken = min(len(ids), num_blocks - len(out))
                self.num_scored += num_taken
                queue.take_front(num_taken, _PENDING)
                out += ids[:num_taken]
                just_scored = None
            elif lane is not None:
                just_scored = self._move_up(_PENDING, ids, hashes, lane, _SCORE_BATCH)
            else:
                just_scored = self._settle_each(
                    _PENDING, _FLOOR, ids, hashes, scores, out, num_blocks
                )
            if len(out) == num_blocks:
                return None

    def _take_scored(self, out: list[int], num_blocks: int) -> None:
        """With the lowest tier and the unscored blocks empty: the head blocks of the
        lowest non-empty tier, each read again as `pop` reads it; one still in that tier
        is a victim, one that moved up enters its new tier last (as in `pop`). One that
        moved down is a victim too: every tier below this one is empty (the call only
        takes blocks out of them), so it is alone in the lowest non-empty tier, where
        `pop` would take it next after reading it once more (counted as read twice).
        Old heads of the active tier are often of sessions that have gone away since."""
        lane = self._lowest_tier()
        assert lane is not None, "no scored candidate"
        num_asked = min(num_blocks - len(out), _SCORE_BATCH)
        ids, hashes = self._queue.front(num_asked, lane)
        new_lane, scores = self._read_run(hashes)
        if new_lane is None:
            self._settle_each(lane, lane, ids, hashes, scores, out, num_blocks)
        elif new_lane > lane:
            self._move_up(lane, ids, hashes, new_lane, num_asked)
        else:  # all still in their tier, or all moved down: all victims
            self.num_scored += len(ids) if new_lane == lane else 2 * len(ids)
            self._queue.take_front(len(ids), lane)
            out += ids

    def _move_up(
        self, lane: int, ids: list[int], hashes: list[int], to_lane: int, num_asked: int
    ) -> int:
        """The blocks `ids` at the front of `lane` (read asking `front` for
        `num_asked`), all scored `to_lane` (above every victim this pass takes), enter
        it; so do as many of the blocks after them in their run as the run scorer puts
        there too, read in parts that double (`pop` would read them all in turn before
        any victim: none of them is one). Returns the last block moved."""
        num = len(ids)
        if num == num_asked:  # not cut short by the run's end: the run may go on
            ids, hashes = self._queue.front(_WHOLE, lane)
            while num < len(ids):
                more = min(2 * num, len(ids))
                if self._read_run(hashes[num:more])[0] != to_lane:
                    break
                num = more
        self.num_scored += num
        self._queue.move_front(num, lane, to_lane)
        return ids[num - 1]

    def _settle_each(
        self,
        lane: int,
        floor: int,
        ids: list[int],
        hashes: list[int],
        scores: list[float] | None,
        out: list[int],
        num_blocks: int,
    ) -> int | None:
        """Read the blocks `ids` at the front of `lane` one by one, in order (`scores`,
        the run scorer's answers, or the scorer's): one read at `floor` or below is a
        victim (appended to `out`; one read below `floor`, a scored tier's head that
        moved down, is counted as read twice, as in `_take_scored`), one read above
        enters that tier; stops once `out` holds `num_blocks`. Consecutive blocks going
        the same way go together. Returns the last block that entered a tier after the
        last victim."""
        queue, lane_of, score_of = self._queue, self._lane_of, self._scorer
        group_to, group_start = -1, 0
        """Where the blocks read since `group_start` go: a lane, or 0 for victims."""
        last = None
        num_wanted = num_blocks - len(out)
        num_read = 0
        for block_hash in hashes:
            self.num_scored += 1
            score = score_of(block_hash) if scores is None else scores[num_read]
            new_lane = lane_of.get(score)
            if new_lane is None:
                self._settle(lane, group_to, ids[group_start:num_read], out)
                queue.take_front(1, lane)
                self._unknown_tier(score)
            to = new_lane if new_lane > floor else 0
            if to != group_to:
                self._settle(lane, group_to, ids[group_start:num_read], out)
                group_to, group_start = to, num_read
            num_read += 1
            if to:
                last = ids[num_read - 1]
                continue
            last = None
            if new_lane < floor:  # `pop` reads it again where it moved
                self.num_scored += 1
                if scores is None:  # the same answer: nothing changes between the reads
                    score_of(block_hash)
            num_wanted -= 1
            if not num_wanted:
                break
        self._settle(lane, group_to, ids[group_start:num_read], out)
        return last

    def _settle(self, lane: int, to: int, ids: list[int], out: list[int]) -> None:
        """`_settle_each`'s group: the blocks `ids` at the front of `lane` enter lane
        `to`, or (0) are victims."""
        if not ids:
            return
        if to:
            self._queue.move_front(len(ids), lane, to)
        else:
            self._queue.take_front(len(ids), lane)
            out += ids

    def _score_pending(self, just_scored: int | None) -> tuple[int | None, int | None]:
        """Score unscored blocks, oldest first, into their tiers until one lands in the
        lowest tier (returned as the victim, taken out) or none is left; also returns the
        last block that entered a tier (else `just_scored`). With a run scorer, the
        blocks read at a time double from one, so that the hashes scored past the victim
        are never more than those before it."""
        queue = self._queue
        num_read = 1 if self._run_scorer is not None else _SCORE_BATCH
        while True:
            ids, hashes = queue.front(num_read, _PENDING)
            if not ids:
                return None, just_scored
            lane, scores = self._read_run(hashes)
            if lane == _FLOOR:
                self.num_scored += 1
                queue.take_front(1, _PENDING)
                return ids[0], just_scored
            if lane is not None:
                just_scored = self._move_up(_PENDING, ids, hashes, lane, num_read)
            else:
                out: list[int] = []
                last = self._settle_each(_PENDING, _FLOOR, ids, hashes, scores, out, 1)
                if out:
                    return out[0], just_scored
                just_scored = last
            num_read = min(2 * num_read, _SCORE_BATCH)

    def _unknown_tier(self, score: float) -> NoReturn:
        raise ValueError(f"score {score} is not one of the tiers {list(self._lane_of)}")

    def rescore_hashes(self, hashes: Iterable[int]) -> None:
        """Re-read the tier of the candidates holding these hashes (others are ignored)."""
        block_of = self._block_of
        if block_of is None:  # not attached to a pool: look the candidates up here
            block_of = {h: b for b, h in self._queue.items()}.get
        pairs = []
        for block_hash in hashes:
            block_id = block_of(block_hash)
            if block_id is not None:
                pairs.append((block_id, block_hash))
        self._rescore(pairs)

    def rescore(self, block_ids: Iterable[int]) -> None:
        """`rescore_hashes` by block id (tests and debugging: the hashes are found in one
        pass over every candidate; the pool's path is `rescore_hashes`)."""
        ids = list(block_ids)
        wanted = set(ids)
        held = {b: h for b, h in self._queue.items() if b in wanted}
        self._rescore([(b, held[b]) for b in ids if b in held])

    def _rescore(self, pairs: list[tuple[int, int]]) -> None:
        """Scored candidates whose tier changed enter the new one last, in the order
        given (consecutive ones for one tier together); unscored ones are not read."""
        queue = self._queue
        group_ids: list[int] = []
        group_hashes: list[int] = []
        grouped: set[int] = set()
        group_lane = 0
        for block_id, block_hash in pairs:
            lane = queue.lane_of(block_id)
            if not lane:
                continue
            if block_id in grouped:  # read again: its new tier, where it stays
                self.num_scored += 1
                continue
            new_lane = self._lane(block_hash)
            if new_lane == lane:
                continue
            if group_ids and new_lane != group_lane:
                self._enter(group_ids, group_hashes, group_lane)
                group_ids, group_hashes = [], []
            group_ids.append(block_id)
            group_hashes.append(block_hash)
            grouped.add(block_id)
            group_lane = new_lane
        if group_ids:
            self._enter(group_ids, group_hashes, group_lane)

    def _enter(self, block_ids: list[int], hashes: list[int], lane: int) -> None:
        self._queue.remove_many(block_ids)
        self._queue.add_many(block_ids, hashes, lane)

    def order(self) -> list[int]:
        """The eviction order if nothing changed: scored tiers, then unscored blocks by
        their tier now (for tests and debugging; reads scores, changes nothing)."""
        later: list[list[int]] = [[] for _ in self._sizes]
        for block_id, block_hash in self._queue.items(_PENDING):
            later[self._lane_of[self._scorer(block_hash)]].append(block_id)
        out: list[int] = []
        for lane in range(_FLOOR, len(self._sizes)):
            out += [block_id for block_id, _ in self._queue.items(lane)] + later[lane]
        return out

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._queue
