"""A first-in first-out queue of blocks that arrive in runs (a sequence's blocks, freed at
once): the order is kept per run, not per block; optionally in several lanes, each its
own queue, that runs move between whole.

An `OrderedDict` keeps a linked node per block, and a freed 30k-token context is 500
blocks; here a run of any length is one list, and a block's membership is one word in a
list indexed by block id: minus the key of the run that holds its live entry, 0 when it
is not queued. A KV pool lends its own reference-count list for those words (`bound`):
a block is in use, free or queued, never two of them, so the pool's count and the
queue's mark share one slot, and freeing a context or acquiring it again writes each
block's word once, in the pool's pass, instead of also churning a dict of a million
entries. Removal counts the run down (a context acquired again is one run emptied at
once, dropped whole); a live run's entries for blocks that left are skipped when the
front reaches them. A run keeps its key in whatever lane it is (`move_front` moves a
whole run without touching its blocks' words), so removal finds it from the word alone.
Order: per lane, the order in which runs joined it (`add_many` calls, `move_front`), a
run in its own order; a block added again while queued moves to the back.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from itertools import islice

_MIN_STALE_TO_COMPACT = 65536


class _Run:
    __slots__ = ("block_hashes", "block_ids", "key", "lane", "num_live", "start")

    def __init__(self, key: int, block_ids: list[int], block_hashes: list[int], lane: int) -> None:
        self.key = key
        self.block_ids = block_ids
        self.block_hashes = block_hashes
        self.lane = lane
        self.start = 0
        """Entries before `start` were taken from the front."""
        self.num_live = len(block_ids)
        """Entries from `start` on whose block is still queued in this run."""


class RunQueue:
    def __init__(self, words: list[int] | None = None, num_lanes: int = 1) -> None:
        if num_lanes < 1:
            raise ValueError(f"num_lanes must be >= 1, got {num_lanes}")
        self._words: list[int] = [] if words is None else words
        """Per block id: -key of the run holding its live entry when queued, else >= 0."""
        self._bound = words is not None
        """The words belong to an owner (a KV pool) that keeps the contract of `bind`."""
        self._runs: dict[int, _Run] = {}
        """Runs with a queued block, by key, in any lane."""
        self._lanes: list[OrderedDict[int, _Run]] = [OrderedDict() for _ in range(num_lanes)]
        """Per lane, its runs with a queued block, by key, in the order they joined it."""
        self._fronts: list[_Run | None] = [None] * num_lanes
        """Per lane, its first run when last looked up: still first while it has a live
        entry and is in the lane (runs only join at the back; one that leaves whole
        clears it)."""
        self.lane_sizes = [0] * num_lanes
        """Queued blocks per lane (for the owner to read, never to write)."""
        self._num_runs_added = 0
        self._num_queued = 0
        self._num_entries = 0
        """Entries in the runs from their starts on: queued blocks plus stale entries."""

    def bind(self, words: list[int]) -> None:
        """Use the owner's per-block words (a pool's reference counts, where a queued
        block's count is 0 or was written 0 before it was added) from now on. The owner
        adds only blocks that are not queued, each once, hands over the lists it adds
        (never changed after), and overwrites the word of
        every block it has `remove_many` take out (with a count or 0) before it asks the
        queue anything else; `remove`, `pop_front` and `take_front` write 0 themselves."""
        if self._num_queued:
            raise ValueError("bind a run queue before anything is queued")
        self._words = words
        self._bound = True

    def __len__(self) -> int:
        return self._num_queued

    def __contains__(self, block_id: object) -> bool:
        words = self._words
        return type(block_id) is int and 0 <= block_id < len(words) and words[block_id] < 0

    def _word(self, block_id: int) -> int:
        words = self._words
        return words[block_id] if 0 <= block_id < len(words) else 0

    def lane_of(self, block_id: int) -> int | None:
        """The lane holding a queued block; None when it is not queued."""
        word = self._word(block_id)
        return self._runs[-word].lane if word < 0 else None

    def add(self, block_id: int, block_hash: int, lane: int = 0) -> None:
        self.add_many([block_id], [block_hash], lane)

    def add_many(
        self, block_ids: Sequence[int], block_hashes: Sequence[int], lane: int = 0
    ) -> None:
        """Queue the blocks at the back of `lane`, in this order, with their hashes."""
        if len(block_ids) != len(block_hashes):
            raise ValueError(f"{len(block_ids)} blocks with {len(block_hashes)} hashes")
        if not block_ids:
            return
        if self._bound and type(block_ids) is list and type(block_hashes) is list:
            ids, hashes = block_ids, block_hashes  # the owner's, handed over: not copied
        else:
            ids, hashes = list(block_ids), list(block_hashes)
        if not self._bound:
            ids, hashes = self._make_room(ids, hashes)
        self._join(lane, ids, hashes)
        if self._num_entries > 4 * self._num_queued + _MIN_STALE_TO_COMPACT:
            self._compact()

    def _join(self, lane: int, ids: list[int], hashes: list[int]) -> None:
        """A new run of blocks not queued, at the back of `lane`."""
        self._num_runs_added += 1
        key = self._num_runs_added
        self._runs[key] = self._lanes[lane][key] = _Run(key, ids, hashes, lane)
        words, neg = self._words, -key
        for block_id in ids:
            words[block_id] = neg
        self.lane_sizes[lane] += len(ids)
        self._num_queued += len(ids)
        self._num_entries += len(ids)

    def _make_room(self, ids: list[int], hashes: list[int]) -> tuple[list[int], list[int]]:
        """Without an owner: grow the words, take queued blocks out first (they move to
        the back) and keep a block repeated in one call once, at its first place."""
        top = max(ids)
        if top < 0:
            raise ValueError(f"negative block id {top}")
        if top >= len(self._words):
            self._words.extend([0] * (top + 1 - len(self._words)))
        self.remove_many(ids)
        if len(set(ids)) != len(ids):
            first = dict(zip(reversed(ids), reversed(hashes), strict=True))
            kept = list(dict.fromkeys(ids))
            return kept, [first[b] for b in kept]
        return ids, hashes

    def remove(self, block_id: int) -> bool:
        """Take a block out of the queue; False if it was not queued."""
        word = self._word(block_id)
        if word >= 0:
            return False
        self._words[block_id] = 0
        self._count_down(-word, 1)
        return True

    def remove_many(self, block_ids: Sequence[int]) -> list[int]:
        """Take the blocks out of the queue; returns those that were not queued, in order.
        Bound to an owner, the words of blocks taken out are left for it to overwrite."""
        if not self._bound:
            return [b for b in block_ids if not self.remove(b)]
        found = list(map(self._words.__getitem__, block_ids))
        if not found:
            return []
        first = found[0]
        # one run, usually (a context acquired again): its word is one object, so
        # counting it is identity checks in C
        if first < 0 and found.count(first) == len(found):
            self._count_down(-first, len(found))
            return []
        missing = [b for b, word in zip(block_ids, found, strict=True) if word >= 0]
        for neg_key, num in Counter(w for w in found if w < 0).items():
            self._count_down(-neg_key, num)
        return missing

    def run_at(self, block_id: int) -> int:
        """How many blocks the `add_many` call that queued `block_id` first added, when
        they are all still queued in that run and none was taken out (0 otherwise), in
        whatever lane the run is now."""
        word = self._word(block_id)
        if word >= 0:
            return 0
        run = self._runs[-word]
        if run.start or run.num_live != len(run.block_ids) or run.block_ids[0] != block_id:
            return 0
        return run.num_live

    def remove_run(self, block_id: int) -> None:
        """Take out the whole untouched run `run_at(block_id)` counts, in O(1) when
        bound (the owner overwrites its blocks' words, as after `remove_many`)."""
        num = self.run_at(block_id)
        if not num:
            raise ValueError(f"block {block_id} heads no untouched run")
        run = self._runs.pop(-self._words[block_id])
        del self._lanes[run.lane][run.key]
        run.num_live = 0  # no longer the front either
        self.lane_sizes[run.lane] -= num
        self._num_queued -= num
        self._num_entries -= num
        if not self._bound:
            for b in run.block_ids:
                self._words[b] = 0

    def _count_down(self, key: int, num_removed: int) -> None:
        run = self._runs[key]
        run.num_live -= num_removed
        self.lane_sizes[run.lane] -= num_removed
        self._num_queued -= num_removed
        if not run.num_live:
            del self._runs[key]
            del self._lanes[run.lane][key]
            self._num_entries -= len(run.block_ids) - run.start

    def _front_run(self, lane: int) -> _Run | None:
        run = self._fronts[lane]
        if run is None or not run.num_live or run.lane != lane:
            runs = self._lanes[lane]
            if not runs:
                return None
            run = self._fronts[lane] = next(iter(runs.values()))
        return run

    def front(self, max_blocks: int, lane: int = 0) -> tuple[list[int], list[int]]:
        """Up to `max_blocks` of the oldest queued blocks of `lane` and their hashes,
        oldest first, from its oldest run (fewer when it holds fewer; at least one unless
        the lane is empty); nothing is taken out: a caller that reads them in turn takes
        out those it used with `take_front`, or moves them with `move_front`."""
        run = self._front_run(lane)
        if run is None:
            return [], []
        start = run.start
        if run.num_live == len(run.block_ids) - start:  # no stale entry left: all queued
            return (
                run.block_ids[start : start + max_blocks],
                run.block_hashes[start : start + max_blocks],
            )
        # stale entries: drop those ahead of the first queued block (as `pop_front`
        # would), then read the queued blocks that follow it up to the next stale entry
        words, neg, all_ids = self._words, -run.key, run.block_ids
        i = start
        while words[all_ids[i]] != neg:  # the run holds a queued block: this stops
            i += 1
        self._num_entries -= i - start
        run.start = i
        j, end = i + 1, min(i + max_blocks, len(all_ids))
        while j < end and words[all_ids[j]] == neg:
            j += 1
        return all_ids[i:j], run.block_hashes[i:j]

    def take_front(self, num_blocks: int, lane: int = 0) -> None:
        """Take out the first `num_blocks` blocks `front(..., lane)` returned (nothing
        changed since), as that many `pop_front` calls would."""
        if num_blocks:
            self._advance(num_blocks, lane, 0)

    def move_front(self, num_blocks: int, lane: int, to_lane: int) -> None:
        """Move the first `num_blocks` blocks `front(..., lane)` returned (nothing changed
        since) to the back of `to_lane`, in order: a run moved whole keeps its key and
        its blocks' words (O(1)); part of one becomes a new run."""
        if not num_blocks or to_lane == lane:
            return
        run = self._fronts[lane]
        if run is not None and run.num_live == num_blocks and run.lane == lane:
            del self._lanes[lane][run.key]
            self._lanes[to_lane][run.key] = run
            run.lane = to_lane
            self._fronts[lane] = None  # should it come back, it is no longer first
            self.lane_sizes[lane] -= num_blocks
            self.lane_sizes[to_lane] += num_blocks
            return
        ids, hashes = self._advance(num_blocks, lane, None)
        self._join(to_lane, ids, hashes)

    def _advance(self, num_blocks: int, lane: int, word: int | None) -> tuple[list[int], list[int]]:
        """Take the first `num_blocks` queued blocks of `lane`'s front run out, writing
        `word` for each (None: left for a new run to write, and returned with their
        hashes; else nothing is returned)."""
        run = self._fronts[lane]
        if run is None or run.num_live < num_blocks or run.lane != lane:
            raise ValueError(f"take_front({num_blocks}) past the front run")
        words, ids, neg, i = self._words, run.block_ids, -run.key, run.start
        taken: list[int] = []
        hashes: list[int] = []
        if run.num_live == len(ids) - i:  # no stale entry: a slice
            end = i + num_blocks
            if word is None:
                taken, hashes = ids[i:end], run.block_hashes[i:end]
            else:
                for block_id in islice(ids, i, end):
                    words[block_id] = word
            i = end
        else:
            num_taken = 0
            while num_taken < num_blocks:
                block_id = ids[i]
                if words[block_id] == neg:
                    num_taken += 1
                    if word is None:
                        taken.append(block_id)
                        hashes.append(run.block_hashes[i])
                    else:
                        words[block_id] = word
                i += 1
        self._num_entries -= i - run.start
        self._num_queued -= num_blocks
        self.lane_sizes[lane] -= num_blocks
        run.start = i
        run.num_live -= num_blocks
        if not run.num_live:
            del self._runs[run.key]
            del self._lanes[lane][run.key]
            self._num_entries -= len(ids) - i
        return taken, hashes

    def pop_front(self, lane: int = 0) -> tuple[int, int] | None:
        """Remove and return the oldest queued (block id, hash) of `lane`; None when it
        is empty."""
        run = self._fronts[lane]  # `_front_run`, inline: this runs for every block evicted
        if run is None or not run.num_live or run.lane != lane:
            runs = self._lanes[lane]
            if not runs:
                return None
            run = self._fronts[lane] = next(iter(runs.values()))
        words = self._words
        ids, neg, i = run.block_ids, -run.key, run.start
        end = len(ids)
        while i < end:
            block_id = ids[i]
            i += 1
            if words[block_id] == neg:
                words[block_id] = 0
                self._num_entries -= i - run.start
                self._num_queued -= 1
                self.lane_sizes[lane] -= 1
                run.start = i
                run.num_live -= 1
                if not run.num_live:
                    del self._runs[run.key]
                    del self._lanes[lane][run.key]
                    self._num_entries -= end - i
                return block_id, run.block_hashes[i - 1]
        raise AssertionError(f"run {run.key} counted live blocks it does not hold")

    def items(self, lane: int | None = None) -> Iterator[tuple[int, int]]:
        """Queued (block id, hash) pairs of `lane` (of every lane, lane by lane, when
        None), oldest first."""
        words = self._words
        lanes = self._lanes if lane is None else [self._lanes[lane]]
        for runs in lanes:
            for run in runs.values():
                neg = -run.key
                for i in range(run.start, len(run.block_ids)):
                    if words[run.block_ids[i]] == neg:
                        yield run.block_ids[i], run.block_hashes[i]

    def _compact(self) -> None:
        """Keep only live entries. O(entries): run when stale entries outnumber queued
        blocks several times over, so O(1) per removal."""
        words = self._words
        for lane, runs in enumerate(self._lanes):
            kept: OrderedDict[int, _Run] = OrderedDict()
            for key, run in runs.items():
                live = [(b, h) for b, h in self._entries(run) if words[b] == -key]
                ids, hashes = (list(column) for column in zip(*live, strict=True))
                kept[key] = self._runs[key] = _Run(key, ids, hashes, lane)
            self._lanes[lane] = kept
        self._fronts = [None] * len(self._lanes)
        self._num_entries = self._num_queued

    @staticmethod
    def _entries(run: _Run) -> Iterator[tuple[int, int]]:
        return zip(run.block_ids[run.start :], run.block_hashes[run.start :], strict=True)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every queued block has exactly one live entry, each
        run's live count and lane are right, no run is empty, each lane counts its
        blocks, and no block is marked queued without a run."""
        live = [b for b, _ in self.items()]
        if len(live) != len(set(live)) or len(live) != self._num_queued:
            raise AssertionError("queued blocks and live run entries differ")
        if sum(1 for w in self._words if w < 0) != self._num_queued:
            raise AssertionError("a block is marked queued without a live entry")
        in_lanes = {key: run for runs in self._lanes for key, run in runs.items()}
        if in_lanes != self._runs:
            raise AssertionError("the lanes and the runs by key differ")
        for lane, runs in enumerate(self._lanes):
            if any(run.lane != lane for run in runs.values()):
                raise AssertionError(f"a run in lane {lane} names another")
            if sum(run.num_live for run in runs.values()) != self.lane_sizes[lane]:
                raise AssertionError(f"lane {lane} counts {self.lane_sizes[lane]} blocks")
        for key, run in self._runs.items():
            num_live = sum(1 for b, _ in self._entries(run) if self._words[b] == -key)
            if num_live != run.num_live or not num_live:
                raise AssertionError(f"run {key} counts {run.num_live} live of {num_live}")
        entries = sum(len(run.block_ids) - run.start for run in self._runs.values())
        if entries != self._num_entries:
            raise AssertionError(f"entry count {self._num_entries} != {entries}")
