"""`oracle` and `oracle-split`: floors for the others, not deployable systems.

Every node holds 100x its real KV, so nothing is evicted, nothing preempted and every
block a later call can read stays where it was computed or copied; the latency-predicting
router places each request where its prefix lives or pulls it. Blocks no call can read
again (the part of a session's context its next prompt no longer holds, after a compaction
or truncation the workload's hints announce, and no other live context holds) are freed at
once (`drop_dead`, on by default): reading them is impossible, keeping them only costs the
simulation memory (computer-use drops old screenshots every turn: without this, over 90%
of the floor's device blocks at 900 s on 32 GPUs were such blocks). `oracle` keeps every
node mixed; `oracle-split` lets evolving's planner split the nodes into prefill and decode
in place when the load asks for it. Neither is best everywhere (a split keeps prefills off
the decoding nodes, which wins on computer-use at 64 GPUs; all-mixed spreads decodes
wider, which wins on a small cluster), so `evinfra bench` takes the lower of the two per
metric as the floor. What remains is compute and queueing on the same GPUs: how close a
system gets to the floor is how much it leaves on the table.
"""

from __future__ import annotations

from evinfra.core.types import Request, Role, SwitchMode
from evinfra.policy.base import KVAction
from evinfra.policy.bundle import ClusterShape, SystemBundle, register
from evinfra.policy.dynamo.options import check_known, get_bool, get_float
from evinfra.policy.evolving.bundle import monotone_decode
from evinfra.policy.evolving.kv_manager import drop_where_session_ran
from evinfra.policy.evolving.planner import EvolvingPlanner, PlannerConfig
from evinfra.policy.evolving.rates import node_rates
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable
from evinfra.policy.simple import LRUKVManager


@register("oracle")
def make_oracle(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    return _make(shape, options, "oracle", split_default=False)


@register("oracle-split")
def make_oracle_split(shape: ClusterShape, options: dict[str, object]) -> SystemBundle:
    return _make(shape, options, "oracle-split", split_default=True)


def _make(
    shape: ClusterShape, options: dict[str, object], name: str, split_default: bool
) -> SystemBundle:
    check_known(options, ("kv_capacity_scale", "planner", "drop_dead"), name)
    table = SessionTable()
    rates = monotone_decode(node_rates(shape))
    planner = None
    if get_bool(options, "planner", split_default):
        planner = EvolvingPlanner(table, rates, shape.block_size, PlannerConfig())
    return SystemBundle(
        name=name,
        router=EvolvingRouter(table, rates, RouterConfig()),
        kv_manager=_TableKV(table, drop_dead=get_bool(options, "drop_dead", True)),
        initial_roles=[Role.MIXED] * shape.num_nodes,
        planner=planner,
        switch_mode=SwitchMode.IN_PLACE,
        kv_capacity_scale=get_float(options, "kv_capacity_scale", 100.0, min_value=1.0),
    )


class _TableKV(LRUKVManager):
    """LRU (never reached with unlimited KV) that keeps the router's session table fed and,
    with `drop_dead`, frees the blocks a prompt leaves dead where the session ran."""

    def __init__(self, table: SessionTable, drop_dead: bool) -> None:
        self.table = table
        self.drop_dead = drop_dead

    def on_arrival(self, request: Request, now_s: float) -> list[KVAction]:
        arrival = self.table.on_arrival(request, now_s)
        # only what the workload says is dead: a context inferred from prefixes (a trace
        # without hints) may be wrong, and a floor must not lose a block a call reads
        if not self.drop_dead or request.hints is None or not arrival.dead_hashes:
            return []
        nodes = self.table.sessions[arrival.session_id].nodes
        return drop_where_session_ran(arrival.dead_hashes, nodes)

    def on_finish(self, request: Request, node_id: int, now_s: float) -> list[KVAction]:
        self.table.on_finish(request, node_id, now_s)
        return []
