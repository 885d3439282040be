"""The host-memory KV tier: copies of blocks by hash, LRU, no reference counts.

Blocks here are never computed on; a hit is onboarded into the device tier by the
scheduler (which charges its transfer time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class HostListener(Protocol):
    def on_host(self, block_hash: int, present: bool) -> None: ...

    def on_host_many(self, block_hashes: Sequence[int], present: bool) -> None:
        """`on_host` for each hash in turn."""


class HostTier:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.num_offloaded = 0
        self.num_evicted = 0
        self.listener: HostListener | None = None

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    def store(self, block_hash: int) -> None:
        """Copy a block in (or refresh it). Evicts the least recently used when full."""
        if self.capacity_blocks == 0:
            return
        if block_hash in self._lru:
            self._lru.move_to_end(block_hash)
            return
        while len(self._lru) >= self.capacity_blocks:
            gone, _ = self._lru.popitem(last=False)
            self.num_evicted += 1
            if self.listener is not None:
                self.listener.on_host(gone, False)
        self._lru[block_hash] = None
        self.num_offloaded += 1
        if self.listener is not None:
            self.listener.on_host(block_hash, True)

    def store_many(self, hashes: Sequence[int]) -> None:
        """`store` each hash in turn (an eviction's offloads); the listener hears in two
        calls the hashes that left and those that came in, and is left knowing what is
        held after the last store."""
        capacity, lru = self.capacity_blocks, self._lru
        if capacity == 0:
            return
        evicted: list[int] = []
        stored: list[int] = []
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            while len(lru) >= capacity:
                evicted.append(lru.popitem(last=False)[0])
            lru[h] = None
            stored.append(h)
        self.num_evicted += len(evicted)
        self.num_offloaded += len(stored)
        if self.listener is None:
            return
        # a hash may have left and come back, or come and left again (refreshed older
        # copies move behind it): tell what is held after the last store
        evicted = [h for h in evicted if h not in lru]
        stored = [h for h in stored if h in lru]
        if evicted:
            self.listener.on_host_many(evicted, False)
        if stored:
            self.listener.on_host_many(stored, True)

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
                if self.listener is not None:
                    self.listener.on_host(h, False)
        return n

    def hashes(self) -> list[int]:
        return list(self._lru)

    def clear(self) -> None:
        if self.listener is not None:
            for h in self._lru:
                self.listener.on_host(h, False)
        self._lru.clear()

    def count_run(self, hashes: Sequence[int], start: int) -> int:
        """How many consecutive hashes from `start` on are held here."""
        n = 0
        for h in hashes[start:]:
            if h not in self._lru:
                break
            n += 1
        return n

    def check_integrity(self) -> None:
        if len(self._lru) > self.capacity_blocks:
            raise AssertionError(f"host tier holds {len(self._lru)} > {self.capacity_blocks}")
