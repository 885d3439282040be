"""The shared heads of prompts, walked once: system prompts and tool definitions that
every session of a kind starts with, held by most nodes, are most of what the
cluster-wide index reads on a route (20,000 tokens, 312 blocks of 64, for an interactive
coding session). The index remembers, for a few such heads, which nodes hold all of it
and where the others' runs end in it, and marks the head's blocks in its table with a
pin bit (`GlobalBlockIndex`): any change to a pinned block forgets every head, so an
answer read from a head is always the walk's.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from operator import neg

MIN_HEAD_BLOCKS = 16
"""Shorter heads are walked: remembering them saves little."""
_MIN_HEAD_NODES = 3
"""A head is held whole by at least this many nodes: what fewer hold is a session's own
context, which changes too often to remember."""
_MAX_HEADS = 16


class Head:
    __slots__ = ("alive", "hashes")

    def __init__(self, hashes: tuple[int, ...], alive: int) -> None:
        self.hashes = hashes
        self.alive = alive
        """The nodes (a mask) that hold every block of it on device; no other node holds
        its first block."""


class SharedHeads:
    def __init__(
        self,
        table: dict[int, int],
        pin: int,
        one: Callable[[int], int],
        min_blocks: int = MIN_HEAD_BLOCKS,
    ) -> None:
        self._table = table
        self._min_blocks = max(min_blocks, 1)
        self._pin_bit = pin
        self._one = one
        """The index's canonical mask object for a mask."""
        self.pin = 0
        """The pin bit while any head is remembered (its blocks carry it), else 0: a
        change to a block whose mask has it must call `forget`."""
        self._heads: dict[int, Head] = {}
        """By the hash of a head's last block."""
        self._lengths: list[int] = []
        """The remembered heads' lengths, longest first."""

    def __len__(self) -> int:
        return len(self._heads)

    def find(self, hashes: tuple[int, ...]) -> Head | None:
        """The longest remembered head that `hashes` starts with, else None."""
        n = len(hashes)
        heads = self._heads
        for length in self._lengths:
            if length <= n:
                head = heads.get(hashes[length - 1])
                if head is not None and hashes[:length] == head.hashes:
                    return head
        return None

    def keep(self, hashes: tuple[int, ...], alive: list[int]) -> None:
        """Remember the head of `hashes` from a walk of it from the first block (`alive`:
        the running AND of its masks), if it has one: the leading blocks held by the
        same nodes as the first one, at least `_MIN_HEAD_NODES` of them and
        `min_blocks` long."""
        if len(alive) <= self._min_blocks:
            return
        top = alive[1]
        if top.bit_count() < _MIN_HEAD_NODES:
            return
        length = bisect_right(alive, -top, lo=1, key=neg) - 1
        if length < self._min_blocks or hashes[length - 1] in self._heads:
            return
        if len(self._heads) >= _MAX_HEADS:
            self.forget()
        head = Head(hashes[:length], top)
        pin, table, one = self._pin_bit, self._table, self._one
        for h in head.hashes:
            table[h] = one(table[h] | pin)
        self._heads[hashes[length - 1]] = head
        self._lengths = sorted({*self._lengths, length}, reverse=True)
        self.pin = pin

    def forget(self) -> None:
        """Forget every head and take the pin bit off its blocks."""
        keep, table, one = ~self._pin_bit, self._table, self._one
        for head in self._heads.values():
            for h in head.hashes:
                mask = table.get(h, 0) & keep
                if mask:
                    table[h] = one(mask)
                else:
                    table.pop(h, None)
        self._heads.clear()
        self._lengths = []
        self.pin = 0
