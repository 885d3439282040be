"""The frontend's picture of the nodes, as `policy.base.NodeView`s for the router and planner.

Workers publish `NodeStats` snapshots every few tens of milliseconds. Between snapshots
the frontend keeps routing, so each view adds what it sent that the snapshot cannot count
yet: submissions the node had not read when it took the snapshot (matched by sequence
number) and disaggregated requests on their way to it as a decode node. A role or serving
change the frontend ordered holds until a snapshot confirms it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evinfra.core.blocks import num_blocks_for
from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Role
from evinfra.serve.protocol import NodeStats


@dataclass(frozen=True, slots=True)
class _Sent:
    submit_seq: int
    request_id: int
    num_uncached_tokens: int


@dataclass(slots=True)
class NodeState:
    """One node as the frontend tracks it. Implements `policy.base.NodeView`."""

    node_id: int
    stats: NodeStats
    alive: bool = True
    next_submit_seq: int = 1
    next_control_seq: int = 1
    sent: list[_Sent] = field(default_factory=list)
    incoming: dict[int, int] = field(default_factory=dict)
    """Disaggregated requests decoding here whose KV has not arrived: id -> blocks."""
    role_override: Role | None = None
    serving_override: bool | None = None
    override_seq: int = 0
    received_s: float = 0.0
    """When the frontend received `stats` (its own clock)."""

    def update(self, stats: NodeStats, received_s: float) -> None:
        self.stats = stats
        self.received_s = received_s
        self.sent = [s for s in self.sent if s.submit_seq > stats.last_submit_seq]
        if stats.last_control_seq >= self.override_seq:
            self.role_override = None
            self.serving_override = None

    def record_submit(self, request_id: int, num_uncached_tokens: int) -> int:
        seq = self.next_submit_seq
        self.next_submit_seq += 1
        self.sent.append(_Sent(seq, request_id, num_uncached_tokens))
        return seq

    def order_role(self, role: Role, restart: bool) -> int:
        seq = self.next_control_seq
        self.next_control_seq += 1
        self.override_seq = seq
        self.role_override = role
        self.serving_override = False if restart else None
        return seq

    # -- NodeView ---------------------------------------------------------------------------
    @property
    def role(self) -> Role:
        return self.role_override if self.role_override is not None else self.stats.role

    @property
    def is_serving(self) -> bool:
        if not self.alive:
            return False
        if self.serving_override is not None:
            return self.serving_override
        return self.stats.is_serving

    @property
    def block_size(self) -> int:
        return self.stats.block_size

    @property
    def num_device_blocks(self) -> int:
        return self.stats.num_device_blocks

    @property
    def num_free_blocks(self) -> int:
        return max(0, self.stats.num_free_blocks - self._extra_blocks())

    @property
    def num_used_blocks(self) -> int:
        return min(self.num_device_blocks, self.stats.num_used_blocks + self._extra_blocks())

    def _extra_blocks(self) -> int:
        return sum(self.incoming.values())

    @property
    def num_waiting_prefill_tokens(self) -> int:
        return self.stats.num_waiting_prefill_tokens + sum(s.num_uncached_tokens for s in self.sent)

    @property
    def num_waiting_requests(self) -> int:
        return self.stats.num_waiting_requests + len(self.sent)

    @property
    def num_running_decodes(self) -> int:
        return self.stats.num_running_decodes + len(self.incoming)

    @property
    def num_decode_blocks(self) -> int:
        return self.stats.num_decode_blocks + self._extra_blocks()

    @property
    def num_decode_context_tokens(self) -> int:
        extra = sum(n * self.block_size for n in self.incoming.values())
        return self.stats.num_decode_context_tokens + extra

    def match_prefix(self, hashes: Sequence[int]) -> PrefixMatch:
        cached = self.stats.cached_hashes
        n = 0
        for h in hashes:
            if h not in cached:
                break
            n += 1
        return PrefixMatch(n, 0)

    def blocks_for(self, num_tokens: int) -> int:
        return num_blocks_for(num_tokens, self.block_size)


class ClusterState:
    """Implements `policy.base.ClusterView` over the tracked nodes."""

    def __init__(self, nodes: list[NodeState]) -> None:
        self._nodes = nodes

    @property
    def nodes(self) -> Sequence[NodeState]:
        return self._nodes

    def step_remaining_s(self, node_id: int, now_s: float) -> float | None:
        """Where a node running decodes stands in its step, estimated: a worker publishes
        between steps and starts the next one at once, so its steps are taken to run back
        to back, each as long as its last, from the snapshot's arrival. None (unknown)
        for a node that is not decoding or has not stepped yet."""
        node = self._nodes[node_id]
        length_s = node.stats.last_step_s
        if length_s <= 0 or node.num_running_decodes == 0:
            return None
        return length_s - (max(now_s - node.received_s, 0.0) % length_s)
