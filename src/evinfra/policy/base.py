"""Policy protocols and the read-only views they decide from. Pure: no clock, no I/O.

A runtime (simulator, local server, Ray) owns the nodes, builds these views, calls the
policies, and applies the decisions they return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from evinfra.core.eviction import EvictionPolicy
from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Request, Role, RoleChange, Route


class NodeView(Protocol):
    """What a policy may read about one node. `NodeScheduler` implements it."""

    @property
    def node_id(self) -> int: ...
    @property
    def role(self) -> Role: ...
    @property
    def is_serving(self) -> bool:
        """False while a node is stopped or cold-starting: route nothing to it."""

    @property
    def block_size(self) -> int: ...
    @property
    def num_device_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_waiting_prefill_tokens(self) -> int:
        """Uncached prompt tokens queued or in progress for prefill on this node."""

    @property
    def num_waiting_requests(self) -> int: ...
    @property
    def num_running_decodes(self) -> int: ...
    @property
    def num_decode_blocks(self) -> int:
        """Device blocks held by sequences that are decoding (or waiting to)."""

    @property
    def num_decode_context_tokens(self) -> int: ...
    def match_prefix(self, hashes: Sequence[int]) -> PrefixMatch: ...


class ClusterView(Protocol):
    @property
    def nodes(self) -> Sequence[NodeView]: ...


def match_all(view: ClusterView, hashes: Sequence[int]) -> dict[int, PrefixMatch]:
    """Every node's prefix match by node id: from the view's global block index when it
    has one (`match_prefix_all`, one pass over the prompt), else node by node."""
    fast = getattr(view, "match_prefix_all", None)
    if fast is not None:
        matches: list[PrefixMatch] = fast(hashes)
        return {n.node_id: matches[i] for i, n in enumerate(view.nodes)}
    return {n.node_id: n.match_prefix(hashes) for n in view.nodes}


def step_remaining_s(view: ClusterView, node_id: int, now_s: float) -> float | None:
    """How long until the step in flight on a node ends, where new work joins: from the
    view's `step_remaining_s` when it has one (the simulator knows each step's end; the
    servers' frontend estimates it from each worker's last step time and when its
    snapshot arrived), else None."""
    known = getattr(view, "step_remaining_s", None)
    if known is None:
        return None
    remaining: float | None = known(node_id, now_s)
    return remaining


class Router(Protocol):
    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        """Choose the prefill and decode nodes for `request`. May update the router's
        own bookkeeping (round-robin cursor, sticky sessions); mutates nothing else."""


@dataclass(frozen=True, slots=True)
class RequestArrived:
    """Told to planners when a request reaches the frontend."""

    request: Request
    now_s: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """Told to planners when a request's last token is out (the frontend's metrics)."""

    request: Request
    now_s: float
    num_cached_prompt_tokens: int
    ttft_s: float
    e2e_s: float
    tpot_s: float


PlannerObservation = RequestArrived | RequestFinished


class Planner(Protocol):
    @property
    def interval_s(self) -> float:
        """How often the runtime calls `plan`."""

    def observe(self, observation: PlannerObservation) -> None:
        """Record a frontend observation (arrival or finish). Mutates only the planner."""

    def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        """Role changes to apply now (empty: keep the split). Mutates only its own state."""


@dataclass(frozen=True, slots=True)
class DropBlocks:
    """Free dead content now on `node_id` (None: every node)."""

    node_id: int | None
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OffloadBlocks:
    """Copy content from device to host on `node_id` and let the device blocks go."""

    node_id: int
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefetchBlocks:
    """Bring content from host to device on `node_id` ahead of its use."""

    node_id: int
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ScoreBlocks:
    """The keep-score of content on `node_id` is now `score` (lowest evicted first).

    How a KV manager reaches an eviction strategy in another process (a server's node
    worker), which cannot call back into the manager's state: the node keeps the scores
    it was told (`policy.published.PublishedTiers`). Sent per session event (a call
    arrives or finishes, a session nears its return, goes overdue, ends), never per step.
    """

    node_id: int
    score: float
    hashes: tuple[int, ...]


KVAction = DropBlocks | OffloadBlocks | PrefetchBlocks | ScoreBlocks


class KVManager(Protocol):
    """Cluster-wide KV decisions from request and session signals."""

    def eviction_for(self, node_id: int) -> EvictionPolicy:
        """The eviction strategy the pool of `node_id` uses (called once per node)."""

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        """A request reached the frontend. Returns actions to apply now."""

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        """A request finished decoding on `node_id`. Returns actions to apply now."""

    def on_tick(self, view: ClusterView, now_s: float) -> list[KVAction]:
        """Periodic housekeeping (offload before long waits, prefetch before returns)."""
