"""Every block hash a run has computed, in 9-10 bytes a hash: behind `num_recomputed_tokens`.

A Python set of the hashes costs 16-32 bytes a slot plus, for a block no pool holds any
more, its 32-byte int: over a long run the largest metrics-only structure
(`benchmarks/sim_memory.py`). Here the hashes live in one sorted int64 array, the newest
in a small set that is merged into it once it holds an eighth of it (a merge is linear:
the two sorted runs are joined by a stable sort). A lookup that misses the newest set
reads one bit of a filter first (8-16 bits a hash, one bit per hash: a hash's low bits
pick it, the hashes being uniform), so most of a call's blocks, never computed before,
cost a set lookup and a bit test, and only the filter's hits (the true ones and about one
in nine others) a binary search (over 600 s of 64 GPUs, 7.5% of the blocks looked up).
The answers are a set's.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

MIN_MERGE = 1 << 16
"""The newest-hash set is merged at this size at the least."""
FILTER_BITS_PER_HASH = 8
"""The filter grows (to the next power of two) to keep at least this many bits a hash."""
MIN_FILTER_BYTES = 1 << 16


class SeenHashes:
    """A set of non-negative 63-bit ints (chained block hashes) that only grows: adding is
    a set update, as for a set (a hash already in the array may enter the newest set
    again; the merge drops the repeat)."""

    __slots__ = ("_bits", "_mask", "_recent", "_sorted", "_view")

    def __init__(self) -> None:
        self._sorted: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._view = self._sorted.data
        """`_sorted`'s buffer: its items are Python ints, for `bisect`."""
        self._recent: set[int] = set()
        self._bits = bytearray(MIN_FILTER_BYTES)
        """Bit `h & _mask` is set for every hash `h` in `_sorted` (and for others)."""
        self._mask = 8 * MIN_FILTER_BYTES - 1

    def __contains__(self, value: object) -> bool:
        if value in self._recent:
            return True
        if not isinstance(value, int):
            return False
        return self._count_sorted([value]) == 1

    def _count_sorted(self, values: list[int]) -> int:
        """How many of `values` are in the array (the filter read first)."""
        bits, mask = self._bits, self._mask
        maybe = [v for v in values if bits[(v & mask) >> 3] >> (v & 7) & 1]
        if not maybe:
            return 0
        # a few per call at most: a binary search each over the array's buffer, which
        # costs less than numpy's fixed cost per call
        view = self._view
        n = len(view)
        hits = 0
        for v in maybe:
            i = bisect_left(view, v)
            hits += i < n and view[i] == v
        return hits

    def count_in(self, values: Sequence[int]) -> int:
        """How many of `values` (repeats counted) are in the set."""
        if not values:
            return 0
        recent = self._recent
        rest = [v for v in values if v not in recent]
        return len(values) - len(rest) + (self._count_sorted(rest) if rest else 0)

    def update(self, values: Iterable[int]) -> None:
        recent = self._recent
        recent.update(values)
        if len(recent) >= max(MIN_MERGE, len(self._sorted) >> 3):
            self._merge()

    def _merge(self) -> None:
        add = np.fromiter(self._recent, dtype=np.int64, count=len(self._recent))
        add.sort()
        joined = np.concatenate((self._sorted, add))
        joined.sort(kind="stable")  # two sorted runs: a linear merge
        keep = np.empty(len(joined), dtype=bool)
        keep[:1] = True
        np.not_equal(joined[1:], joined[:-1], out=keep[1:])  # a hash added twice
        self._sorted = joined[keep]
        self._view = self._sorted.data
        self._recent = set()
        want_bits = FILTER_BITS_PER_HASH * len(self._sorted)
        if want_bits > 8 * len(self._bits):
            num_bytes = 1 << max(want_bits - 1, 1).bit_length() >> 3
            self._bits = bytearray(num_bytes)
            self._mask = 8 * num_bytes - 1
            self._set_bits(self._sorted)
        else:
            self._set_bits(add)

    def _set_bits(self, values: npt.NDArray[np.int64]) -> None:
        idx = np.bitwise_and(values, self._mask)
        view = np.frombuffer(self._bits, dtype=np.uint8)
        np.bitwise_or.at(view, idx >> 3, np.left_shift(1, idx & 7).astype(np.uint8))

    def num_distinct(self) -> int:
        """How many distinct hashes are held: what a set's `len` would be (for tests)."""
        return len(self._sorted) + sum(1 for v in self._recent if self._count_sorted([v]) == 0)
