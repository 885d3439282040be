"""KV transfer links: each node has one egress and one ingress queue; a transfer starts
when both ends are free and holds both for its duration (bytes over bandwidth plus a
fixed and a per-block cost, from the node spec)."""

from __future__ import annotations

from collections.abc import Callable

TransferTime = Callable[[int, int, int, int], float]
"""(src node, dst node, bytes, blocks) -> seconds on the wire."""


class LinkModel:
    def __init__(self, num_nodes: int, transfer_time_s: TransferTime) -> None:
        self._transfer_time_s = transfer_time_s
        self._egress_free_s = [0.0] * num_nodes
        self._ingress_free_s = [0.0] * num_nodes
        self.num_bytes_moved = 0
        self.num_transfers = 0
        self.busy_s = 0.0

    def schedule(self, now_s: float, src: int, dst: int, num_bytes: int, num_blocks: int) -> float:
        """Book a transfer; returns its completion time."""
        start = max(now_s, self._egress_free_s[src], self._ingress_free_s[dst])
        dur = self._transfer_time_s(src, dst, num_bytes, num_blocks) if num_bytes else 0.0
        end = start + dur
        self._egress_free_s[src] = end
        self._ingress_free_s[dst] = end
        self.num_bytes_moved += num_bytes
        self.num_transfers += 1
        self.busy_s += dur
        return end
