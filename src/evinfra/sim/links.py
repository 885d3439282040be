"""KV transfer links: each node has one egress and one ingress; a transfer holds its
source's egress and its destination's ingress for its whole duration (bytes over
bandwidth plus a fixed and a per-block cost, from the node spec), and starts at the
earliest time both are free that long.

Each end keeps the intervals booked on it, so a transfer booked later fills a gap left
before an earlier one (one that waits for its other end). Booking each end only up to a
single "free from" time instead would hold an idle end for a transfer still waiting on
its other end, and the next transfer through either end would wait for both in turn:
the waits chain from node to node, and past about 30% of each end's time in use a
cluster of 16 or more nodes queued without bound (uniform random pairs, 14 ms transfers:
P95 wait 0.30 s at 32 nodes and 30%, 84 s at 40%; `tests/unit/sim/test_links.py`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

TransferTime = Callable[[int, int, int, int], float]
"""(src node, dst node, bytes, blocks) -> seconds on the wire."""


class _Booked:
    """One end's booked intervals [start, end), sorted and disjoint (so both the starts
    and the ends ascend)."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def forget_before(self, now_s: float) -> None:
        """Drop the intervals over by `now_s` (time only moves forward)."""
        k = bisect_right(self.ends, now_s)
        if k:
            del self.starts[:k]
            del self.ends[:k]

    def fit(self, from_s: float, dur_s: float) -> float:
        """The earliest start at or after `from_s` with `dur_s` free here."""
        starts, ends = self.starts, self.ends
        t = from_s
        i = bisect_right(ends, t)
        while i < len(starts) and starts[i] < t + dur_s:
            t = ends[i]
            i += 1
        return t

    def book(self, start_s: float, end_s: float) -> None:
        i = bisect_right(self.starts, start_s)
        self.starts.insert(i, start_s)
        self.ends.insert(i, end_s)


class LinkModel:
    def __init__(self, num_nodes: int, transfer_time_s: TransferTime) -> None:
        self._transfer_time_s = transfer_time_s
        self._egress = [_Booked() for _ in range(num_nodes)]
        self._ingress = [_Booked() for _ in range(num_nodes)]
        self.num_bytes_moved = 0
        self.num_transfers = 0
        self.busy_s = 0.0

    def schedule(self, now_s: float, src: int, dst: int, num_bytes: int, num_blocks: int) -> float:
        """Book a transfer; returns its completion time (`now_s` when nothing moves)."""
        self.num_bytes_moved += num_bytes
        self.num_transfers += 1
        if not num_bytes:
            return now_s
        dur = self._transfer_time_s(src, dst, num_bytes, num_blocks)
        out, into = self._egress[src], self._ingress[dst]
        out.forget_before(now_s)
        into.forget_before(now_s)
        start = now_s
        while True:  # alternate until both ends agree: each step only moves later
            start = out.fit(start, dur)
            agreed = into.fit(start, dur)
            if agreed == start:
                break
            start = agreed
        end = start + dur
        out.book(start, end)
        into.book(start, end)
        self.busy_s += dur
        return end
