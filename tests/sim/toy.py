"""Small helpers for simulator tests: a linear cost model and hand-made sessions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from evinfra.core.blocks import Segment
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig
from evinfra.core.types import Request, Role, Route
from evinfra.costmodel.base import BatchShape
from evinfra.policy.base import ClusterView
from evinfra.policy.bundle import SystemBundle
from evinfra.policy.simple import LRUKVManager
from evinfra.sim.links import LinkModel
from evinfra.sim.node import SimNode
from evinfra.sim.simulation import SimSettings, Simulation
from evinfra.workloads.requests import PrefixHashCache, make_request
from evinfra.workloads.types import Call, SessionArrival, SessionPlan


@dataclass(frozen=True)
class LinearCost:
    """step = 10 ms + 0.1 ms per prefill token + 0.01 ms per decode context token."""

    kv_capacity_tokens: int = 4096
    kv_bytes_per_token: int = 1000

    def step_time_s(self, batch: BatchShape) -> float:
        return 0.010 + 1e-4 * batch.num_prefill_tokens + 1e-5 * batch.num_decode_context_tokens

    def decode_run_time_s(self, num_seqs: int, ctx: int, kv: int, num_steps: int) -> float:
        # sum over steps j of 10 ms + 1e-5 * (ctx + j * num_seqs)
        return num_steps * 0.010 + 1e-5 * (
            num_steps * ctx + num_seqs * num_steps * (num_steps - 1) // 2
        )


@dataclass
class ListWorkload:
    sessions: list[SessionArrival]
    name: str = "list"
    concurrency: int | None = None

    def arrivals(self) -> Iterator[SessionArrival]:
        return iter(self.sessions)


def make_session(sid: str, num_calls: int, prompt: int, out: int, think_s: float) -> SessionPlan:
    calls = []
    segs: tuple[Segment, ...] = (Segment(1, 256),)  # shared system prompt
    for i in range(num_calls):
        segs = (*segs, Segment(hash((sid, i)) & 0xFFFFFF, prompt))
        calls.append(Call(segs, out, hash((sid, "out", i)) & 0xFFFFFF, think_s if i else 0.0))
        segs = (*segs, Segment(calls[-1].output_content_id, out))
    return SessionPlan(sid, "toy", tuple(calls))


class FixedRouter:
    """Prefill on node 0, decode on node 1 (disaggregated), or both on `node` if given."""

    def __init__(self, disaggregated: bool) -> None:
        self.disaggregated = disaggregated

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        return Route(0, 1) if self.disaggregated else Route(0, 0)


def make_sim(
    sessions: list[SessionArrival],
    *,
    disaggregated: bool = False,
    num_blocks: int = 256,
    horizon_s: float = 100.0,
) -> Simulation:
    roles = [Role.PREFILL, Role.DECODE] if disaggregated else [Role.MIXED, Role.MIXED]
    bundle = SystemBundle("toy", FixedRouter(disaggregated), LRUKVManager(), roles)
    cfg = SchedulerConfig(block_size=16, max_num_batched_tokens=512, max_num_seqs=16)
    nodes = [
        SimNode(NodeScheduler(i, KVPool(num_blocks), cfg, r), LinearCost(), 1e10)
        for i, r in enumerate(roles)
    ]
    cache = PrefixHashCache()

    def factory(rid: int, plan: SessionPlan, index: int) -> Request:
        return make_request(rid, plan, index, 16, True, cache=cache)

    return Simulation(
        nodes=nodes,
        bundle=bundle,
        workload=ListWorkload(sessions),
        links=LinkModel(2, lambda s, d, b, n: 0.001 + b / 1e9),
        make_request=factory,
        settings=SimSettings(horizon_s=horizon_s, check_integrity=True, drain_s=100.0),
    )
