"""Minimal policies: round-robin and least-loaded routing, plain LRU KV management.

They make whole runs work and serve as the floor that real policies must beat.
"""

from __future__ import annotations

from evinfra.core.eviction import EvictionPolicy, LRUEviction
from evinfra.core.types import Request, Role, Route
from evinfra.policy.base import ClusterView, KVAction, NodeView
from evinfra.policy.bundle import ClusterShape, SystemBundle, register


def _serving(view: ClusterView, roles: tuple[Role, ...]) -> list[NodeView]:
    nodes = [n for n in view.nodes if n.is_serving and n.role in roles]
    if not nodes:
        nodes = [n for n in view.nodes if n.is_serving]
    if not nodes:
        raise RuntimeError("no node is serving")
    return nodes


class RoundRobinRouter:
    """Each request to the next serving node in turn; prefill and decode on the same node."""

    def __init__(self) -> None:
        self._cursor = 0

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        nodes = _serving(view, (Role.MIXED,))
        node = nodes[self._cursor % len(nodes)]
        self._cursor += 1
        return Route(node.node_id, node.node_id)


def _load(node: NodeView) -> float:
    return node.num_waiting_prefill_tokens / node.block_size + node.num_used_blocks


class LeastLoadedRouter:
    """The node with the fewest queued prefill blocks plus used KV blocks; ties: lowest id."""

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        node = min(_serving(view, (Role.MIXED,)), key=lambda n: (_load(n), n.node_id))
        return Route(node.node_id, node.node_id)


class LRUKVManager:
    """Per-node LRU and no cluster-level actions: what a plain engine does."""

    def eviction_for(self, node_id: int) -> EvictionPolicy:
        return LRUEviction()

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        return []

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        return []

    def on_tick(self, view: ClusterView, now_s: float) -> list[KVAction]:
        return []


@register("round-robin")
def make_round_robin(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    return SystemBundle(
        name="round-robin",
        router=RoundRobinRouter(),
        kv_manager=LRUKVManager(),
        initial_roles=[Role.MIXED] * shape.num_nodes,
    )


@register("least-loaded")
def make_least_loaded(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    return SystemBundle(
        name="least-loaded",
        router=LeastLoadedRouter(),
        kv_manager=LRUKVManager(),
        initial_roles=[Role.MIXED] * shape.num_nodes,
    )
