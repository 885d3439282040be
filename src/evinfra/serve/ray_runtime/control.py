"""What the planner actor is told and what it keeps: the control events, a compact cluster
view, and the replica of the policy state the planner decides from. Pure: no Ray.

The planner of a bundle may read state that the bundle's KV manager keeps (the `evolving`
planner forecasts from the session table that the KV manager's hooks update). The actor
therefore holds a replica of both, seeded with a copy of the frontend's objects and kept
in step by replaying, in the frontend's order, every call the frontend makes on its own
KV manager (`on_arrival`, `on_finish`, `on_tick`) and every observation. The replica's KV
actions are discarded: the frontend applied its own already. Only `plan` decides.

The KV manager actor holds a `KVReplica`: the same replay (plus the routes, which the
frontend's router writes into the session table it shares with the KV manager), but its
actions are the ones applied; the frontend's own KV manager then only keeps the table
its router reads, and its actions are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Role, RoleChange
from evinfra.policy.base import (
    ClusterView,
    KVAction,
    KVManager,
    NodeView,
    Planner,
    RequestArrived,
    RequestFinished,
)


@dataclass(frozen=True, slots=True)
class Arrived:
    """A request reached the frontend (the KV manager's `on_arrival`, then `observe`)."""

    request_arrived: RequestArrived


@dataclass(frozen=True, slots=True)
class Finished:
    """A request's last token is out on `node_id` (`on_finish`, then `observe`)."""

    node_id: int
    request_finished: RequestFinished


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node's `NodeView` figures at one instant. Carries no block index: planners and
    KV housekeeping read loads, not prefixes (only routers match prefixes, and the router
    stays in the frontend), and the index is the one part of a view that grows with the
    cluster's memory."""

    node_id: int
    role: Role
    is_serving: bool
    block_size: int
    num_device_blocks: int
    num_free_blocks: int
    num_used_blocks: int
    num_waiting_prefill_tokens: int
    num_waiting_requests: int
    num_running_decodes: int
    num_decode_blocks: int
    num_decode_context_tokens: int

    def match_prefix(self, hashes: Sequence[int]) -> PrefixMatch:
        """No index travels with a snapshot: no prefix is known."""
        return PrefixMatch(0, 0)

    @classmethod
    def of(cls, node: NodeView) -> NodeSnapshot:
        return cls(
            node.node_id, node.role, node.is_serving, node.block_size, node.num_device_blocks,
            node.num_free_blocks, node.num_used_blocks, node.num_waiting_prefill_tokens,
            node.num_waiting_requests, node.num_running_decodes, node.num_decode_blocks,
            node.num_decode_context_tokens,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A `ClusterView` of snapshots: what crosses to the planner actor."""

    nodes: tuple[NodeSnapshot, ...]

    @classmethod
    def of(cls, view: ClusterView) -> ClusterSnapshot:
        return cls(tuple(NodeSnapshot.of(n) for n in view.nodes))


@dataclass(frozen=True, slots=True)
class Ticked:
    """The frontend ran its KV manager's periodic `on_tick`."""

    view: ClusterSnapshot
    now_s: float


@dataclass(frozen=True, slots=True)
class Routed:
    """The router placed a request on these nodes (the KV manager's `on_route`): where a
    session's blocks may be, which its drops and tier messages target."""

    request_id: int
    node_ids: tuple[int, ...]


ControlEvent = Arrived | Finished | Ticked
KVEvent = Arrived | Routed | Finished | Ticked


class KVReplica:
    """A KV manager replayed from the frontend's events, whose actions are the ones applied
    (the KV manager actor's state). Its actions for a sequence of events are the frontend's
    own KV manager's for the same calls: both start from the same state and see the same
    calls in the same order."""

    def __init__(self, kv_manager: KVManager) -> None:
        self.kv_manager = kv_manager
        self.num_events = 0
        self.num_actions = 0

    def apply(self, events: Sequence[KVEvent]) -> list[KVAction]:
        """Apply `events` in order; returns the KV actions they produced, in order."""
        kv = self.kv_manager
        actions: list[KVAction] = []
        for event in events:
            if isinstance(event, Arrived):
                arrived = event.request_arrived
                actions += kv.on_arrival(arrived.request, arrived.now_s)
            elif isinstance(event, Routed):
                on_route = getattr(kv, "on_route", None)
                if on_route is not None:
                    on_route(event.request_id, event.node_ids)
            elif isinstance(event, Finished):
                done = event.request_finished
                actions += kv.on_finish(done.request, event.node_id, done.now_s)
            else:
                actions += kv.on_tick(event.view, event.now_s)
        self.num_events += len(events)
        self.num_actions += len(actions)
        return actions


class ControlReplica:
    """The planner, and the KV manager state it may read, replayed from the frontend."""

    def __init__(self, kv_manager: KVManager, planner: Planner) -> None:
        self.kv_manager = kv_manager
        self.planner = planner
        self.num_events = 0
        self.num_plans = 0

    def replay(self, events: Sequence[ControlEvent]) -> None:
        """Apply `events` in order; mutates the replica's KV manager and planner."""
        for event in events:
            if isinstance(event, Arrived):
                arrived = event.request_arrived
                self.kv_manager.on_arrival(arrived.request, arrived.now_s)
                self.planner.observe(arrived)
            elif isinstance(event, Finished):
                done = event.request_finished
                self.kv_manager.on_finish(done.request, event.node_id, done.now_s)
                self.planner.observe(done)
            else:
                self.kv_manager.on_tick(event.view, event.now_s)
        self.num_events += len(events)

    def plan(
        self, events: Sequence[ControlEvent], view: ClusterSnapshot, now_s: float
    ) -> list[RoleChange]:
        """Replay `events`, then the planner's role changes for `view` at `now_s`."""
        self.replay(events)
        self.num_plans += 1
        return self.planner.plan(view, now_s)

    def counts(self) -> tuple[int, int]:
        """(events replayed, plans made) since the replica was seeded."""
        return self.num_events, self.num_plans
