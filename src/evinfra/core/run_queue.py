"""A first-in first-out queue of blocks that arrive in runs (a sequence's blocks, freed at
once): the order is kept per run, not per block.

An `OrderedDict` keeps a linked node per block, and a freed 30k-token context is 500
blocks; here a run of any length is one list, and each block costs one plain dict entry
(block id -> the run holding it) set in one C-level update. Removal deletes that entry and
counts the run down (a context acquired again is one run emptied at once, dropped whole);
a live run's entries for blocks that left are skipped when the front reaches them.
Order: the order of `add`/`add_many` calls, a run in its own order; a block added again
while queued moves to the back.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from operator import is_
from typing import cast

_MIN_STALE_TO_COMPACT = 65536


class _Run:
    __slots__ = ("block_hashes", "block_ids", "key", "num_live", "start")

    def __init__(self, key: int, block_ids: list[int], block_hashes: list[int]) -> None:
        self.key = key
        self.block_ids = block_ids
        self.block_hashes = block_hashes
        self.start = 0
        """Entries before `start` were taken from the front."""
        self.num_live = len(block_ids)
        """Entries from `start` on whose block is still queued in this run."""


class RunQueue:
    def __init__(self) -> None:
        self._run_of: dict[int, int] = {}
        """Queued block id -> key of the run that holds its live entry."""
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        """Runs with a queued block, by key, oldest first."""
        self._front: _Run | None = None
        """The first of `_runs` when last looked up: still first while it has a live
        entry (runs only join at the back)."""
        self._num_runs_added = 0
        self._num_entries = 0
        """Entries in the runs from their starts on: queued blocks plus stale entries."""

    def __len__(self) -> int:
        return len(self._run_of)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._run_of

    def add(self, block_id: int, block_hash: int) -> None:
        self.add_many([block_id], [block_hash])

    def add_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> None:
        """Queue the blocks at the back, in this order, with their hashes."""
        if len(block_ids) != len(block_hashes):
            raise ValueError(f"{len(block_ids)} blocks with {len(block_hashes)} hashes")
        if not block_ids:
            return
        key = self._num_runs_added
        self._num_runs_added += 1
        ids = list(block_ids)
        run_of = self._run_of
        num_before = len(run_of)
        self._runs[key] = _Run(key, ids, list(block_hashes))
        run_of.update(zip(ids, repeat(key)))
        self._num_entries += len(ids)
        if len(run_of) - num_before != len(ids):
            self._compact()  # blocks queued already or repeated: count every run again
        elif self._num_entries > 4 * len(run_of) + _MIN_STALE_TO_COMPACT:
            self._compact()

    def remove(self, block_id: int) -> bool:
        """Take a block out of the queue; False if it was not queued."""
        key = self._run_of.pop(block_id, None)
        if key is None:
            return False
        self._count_down(key, 1)
        return True

    def remove_many(self, block_ids: Sequence[int]) -> list[int]:
        """Take the blocks out of the queue; returns those that were not queued, in order."""
        found = list(map(self._run_of.pop, block_ids, repeat(None)))
        if found:
            first = found[0]
            # one run, usually (a context acquired again): its key is one object, so
            # counting it is identity checks in C, and no None can hide among them
            if first is not None and found.count(first) == len(found):
                self._count_down(first, len(found))
                return []
        missing: list[int] = []
        keys: list[int]
        if None in found:
            missing = list(compress(block_ids, map(is_, found, repeat(None))))
            keys = [k for k in found if k is not None]
        else:
            keys = cast(list[int], found)  # no None in it
        if keys:
            first = keys[0]
            if keys[-1] == first and keys.count(first) == len(keys):  # one run, usually
                self._count_down(first, len(keys))
            else:
                for key, num in Counter(keys).items():
                    self._count_down(key, num)
        return missing

    def _count_down(self, key: int, num_removed: int) -> None:
        run = self._runs[key]
        run.num_live -= num_removed
        if not run.num_live:
            del self._runs[key]
            self._num_entries -= len(run.block_ids) - run.start

    def pop_front(self) -> tuple[int, int] | None:
        """Remove and return the oldest queued (block id, hash); None when empty."""
        run = self._front
        if run is None or not run.num_live:
            if not self._runs:
                return None
            run = self._front = next(iter(self._runs.values()))
        run_of = self._run_of
        ids, key, i = run.block_ids, run.key, run.start
        end = len(ids)
        while i < end:
            block_id = ids[i]
            i += 1
            if run_of.get(block_id) == key:
                del run_of[block_id]
                self._num_entries -= i - run.start
                run.start = i
                run.num_live -= 1
                if not run.num_live:
                    del self._runs[key]
                    self._num_entries -= end - i
                return block_id, run.block_hashes[i - 1]
        raise AssertionError(f"run {key} counted live blocks it does not hold")

    def items(self) -> Iterator[tuple[int, int]]:
        """Queued (block id, hash) pairs, oldest first."""
        run_of = self._run_of
        for run in self._runs.values():
            key = run.key
            for i in range(run.start, len(run.block_ids)):
                block_id = run.block_ids[i]
                if run_of.get(block_id) == key:
                    yield block_id, run.block_hashes[i]

    def _compact(self) -> None:
        """Keep only live entries (the first of a block repeated in a run), recounted.
        O(entries): run when stale entries outnumber queued blocks several times over,
        so O(1) per removal."""
        run_of = self._run_of
        kept: OrderedDict[int, _Run] = OrderedDict()
        for key, run in self._runs.items():
            ids: list[int] = []
            hashes: list[int] = []
            seen: set[int] = set()
            for i in range(run.start, len(run.block_ids)):
                block_id = run.block_ids[i]
                if run_of.get(block_id) == key and block_id not in seen:
                    seen.add(block_id)
                    ids.append(block_id)
                    hashes.append(run.block_hashes[i])
            if ids:
                kept[key] = _Run(key, ids, hashes)
        self._runs = kept
        self._front = None
        self._num_entries = len(run_of)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every queued block has exactly one live entry, each
        run's live count is right and no run is empty."""
        run_of = self._run_of
        live = [b for b, _ in self.items()]
        if len(live) != len(set(live)) or set(live) != set(run_of):
            raise AssertionError("queued blocks and live run entries differ")
        for key, run in self._runs.items():
            ids = run.block_ids[run.start :]
            num_live = sum(1 for b in ids if run_of.get(b) == key)
            if num_live != run.num_live or not num_live:
                raise AssertionError(f"run {key} counts {run.num_live} live of {num_live}")
        entries = sum(len(run.block_ids) - run.start for run in self._runs.values())
        if entries != self._num_entries:
            raise AssertionError(f"entry count {self._num_entries} != {entries}")
