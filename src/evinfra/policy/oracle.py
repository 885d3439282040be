"""`oracle`: a floor for the others, not a deployable system.

Every node is mixed and holds 100x its real KV, so nothing is evicted, nothing preempted
and every block ever computed on a node stays there; the latency-predicting router places
each request where its prefix lives or pulls it. What remains is compute and queueing on
the same GPUs: how close a system gets to this is how much it leaves on the table.
"""

from __future__ import annotations

from evinfra.core.types import Request, Role
from evinfra.policy.base import KVAction
from evinfra.policy.bundle import ClusterShape, SystemBundle, register
from evinfra.policy.dynamo.options import check_known, get_float
from evinfra.policy.evolving.rates import node_rates
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable
from evinfra.policy.simple import LRUKVManager


@register("oracle")
def make_oracle(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    check_known(options, ("kv_capacity_scale",), "oracle")
    table = SessionTable()
    router = EvolvingRouter(table, node_rates(shape), RouterConfig())
    return SystemBundle(
        name="oracle",
        router=router,
        kv_manager=_TableKV(table),
        initial_roles=[Role.MIXED] * shape.num_nodes,
        kv_capacity_scale=get_float(options, "kv_capacity_scale", 100.0, min_value=1.0),
    )


class _TableKV(LRUKVManager):
    """LRU (never reached with unlimited KV) that keeps the router's session table fed."""

    def __init__(self, table: SessionTable) -> None:
        self.table = table

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        self.table.on_arrival(request, now_s)
        return []

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        self.table.on_finish(request, node_id, now_s)
        return []
