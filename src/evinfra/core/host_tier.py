"""The host-memory KV tier: copies of blocks by hash, LRU, no reference counts.

Blocks here are never computed on; a hit is onboarded into the device tier by the
scheduler (which charges its transfer time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Mapping, Sequence
from itertools import islice, takewhile


def held_run(held: Container[int], hashes: Sequence[int], start: int) -> int:
    """How many consecutive `hashes` from `start` on `held` contains (a tier's
    `contents`), counted in C: a node's host run, which starts where its device run
    ends."""
    return len(list(takewhile(held.__contains__, islice(hashes, start, None))))


class HostTier:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.num_offloaded = 0
        self.num_evicted = 0
        self.on_change: Callable[[], None] | None = None
        """Called once after each call that changed which hashes are held (a copy stored
        or gone), never for a refresh, which only reorders them. A reader of the tier
        (the cluster-wide index) reads `contents` itself: it only needs to know when an
        answer it remembers may be stale."""

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def contents(self) -> Mapping[int, None]:
        """The hashes held, as a live view kept current by this tier (read, never
        write): a caller that tests many hashes skips a method call each."""
        return self._lru

    def store(self, block_hash: int) -> None:
        """Copy a block in (or refresh it). Evicts the least recently used when full."""
        self.store_many((block_hash,))

    def store_many(self, hashes: Sequence[int]) -> None:
        """`store` each hash in turn (an eviction's offloads): a hash held is refreshed
        (moved to the back), a new one evicts the least recently used copy when full."""
        capacity, lru = self.capacity_blocks, self._lru
        if capacity == 0:
            return
        held_before, stored = len(lru), 0
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            while len(lru) >= capacity:
                lru.popitem(last=False)
            lru[h] = None
            stored += 1
        if stored:
            self.num_offloaded += stored
            self.num_evicted += held_before + stored - len(lru)
            if self.on_change is not None:
                self.on_change()

    def touch(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            if h in self._lru:
                self._lru.move_to_end(h)

    def drop(self, hashes: Sequence[int]) -> int:
        """Forget dead blocks now; returns how many were held."""
        n = 0
        for h in hashes:
            if self._lru.pop(h, 0) is None:
                n += 1
        if n and self.on_change is not None:
            self.on_change()
        return n

    def hashes(self) -> list[int]:
        return list(self._lru)

    def clear(self) -> None:
        if not self._lru:
            return
        self._lru.clear()
        if self.on_change is not None:
            self.on_change()

    def check_integrity(self) -> None:
        if len(self._lru) > self.capacity_blocks:
            raise AssertionError(f"host tier holds {len(self._lru)} > {self.capacity_blocks}")
