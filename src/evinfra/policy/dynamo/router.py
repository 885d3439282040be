"""Dynamo's KV router for disaggregated serving with conditional disaggregation.

Per request (Dynamo `router-disaggregated-serving.md`): the decode stage picks a decode
worker; the `isl_bounding` rule then decides whether the prefill runs locally on it or on a
prefill worker, which the prefill router picks by cached overlap and queued prefill. With no
prefill worker serving, Dynamo falls back to decode-only mode: local prefill.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Request, Role, Route
from evinfra.policy.base import ClusterView, NodeView, match_all
from evinfra.policy.dynamo.cost import (
    KvRouterConfig,
    Phase,
    WorkerCost,
    eligible,
    select_worker,
    worker_cost,
)
from evinfra.policy.dynamo.disagg import IslBounding
from evinfra.policy.dynamo.sessions import AgentRouterState


class DynamoRouter:
    """`route` mutates only the router's RNG (temperature > 0) and, for `dynamo-agentic`,
    the shared agent state (sticky bindings, expected output load)."""

    def __init__(
        self,
        config: KvRouterConfig,
        disagg: IslBounding,
        seed: int = 0,
        agent: AgentRouterState | None = None,
    ) -> None:
        self.config = config
        self.disagg = disagg
        self.agent = agent
        self._rng = random.Random(seed)

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        serving = [n for n in view.nodes if n.is_serving]
        if not serving:
            raise RuntimeError("no node is serving")
        decodes = _with_role(serving, Role.DECODE) or _with_role(serving, Role.MIXED) or serving
        prefills = _with_role(serving, Role.PREFILL)
        matches = match_all(view, request.prompt_hashes)
        decode = self._choose(request, decodes, Phase.DECODE, now_s, matches)
        block_size = _node(decodes, decode.node_id).block_size
        local = not prefills or self.disagg.runs_locally(
            request.num_prompt_tokens, decode.match.num_device_blocks, block_size
        )
        prefill_id = decode.node_id
        if not local:
            prefill_id = self._choose(request, prefills, Phase.PREFILL, now_s, matches).node_id
        self._record(request, decode.node_id, block_size)
        return Route(prefill_id, decode.node_id)

    def _choose(
        self,
        request: Request,
        nodes: Sequence[NodeView],
        phase: Phase,
        now_s: float,
        matches: dict[int, PrefixMatch],
    ) -> WorkerCost:
        sticky = self._sticky(request, nodes, phase, now_s)
        if sticky is not None:
            return self._cost(request, sticky, phase, matches)
        costs = [self._cost(request, n, phase, matches) for n in eligible(nodes, self.config)]
        chosen = select_worker(costs, self.config.temperature, self._rng)
        affinity = self.agent.affinity if self.agent is not None else None
        if affinity is not None and request.session_id is not None:
            affinity.bind(request.session_id, phase, chosen.node_id, now_s)
        return chosen

    def _sticky(
        self, request: Request, nodes: Sequence[NodeView], phase: Phase, now_s: float
    ) -> NodeView | None:
        affinity = self.agent.affinity if self.agent is not None else None
        if affinity is None or request.session_id is None:
            return None
        bound = affinity.lookup(request.session_id, phase, now_s)
        if bound is None:
            return None
        for node in nodes:
            if node.node_id == bound:
                return node
        # the bound worker stopped or changed role: drop the binding, select afresh
        affinity.invalidate(request.session_id, phase)
        return None

    def _cost(
        self, request: Request, node: NodeView, phase: Phase, matches: dict[int, PrefixMatch]
    ) -> WorkerCost:
        extra = 0.0
        if self.agent is not None and self.agent.output is not None and phase is Phase.DECODE:
            extra = float(self.agent.output.num_blocks(node.node_id))
        return worker_cost(
            request,
            node,
            phase,
            self.config,
            decode_overlap_credit=self.disagg.enabled,
            extra_decode_blocks=extra,
            match=matches.get(node.node_id),
        )

    def _record(self, request: Request, decode_id: int, block_size: int) -> None:
        if self.agent is None:
            return
        if self.agent.affinity is not None and request.session_id is not None:
            self.agent.affinity.dispatched(request.session_id)
        if self.agent.output is not None:
            self.agent.output.add(request, decode_id, block_size)


def _with_role(nodes: Sequence[NodeView], role: Role) -> list[NodeView]:
    return [n for n in nodes if n.role is role]


def _node(nodes: Sequence[NodeView], node_id: int) -> NodeView:
    for node in nodes:
        if node.node_id == node_id:
            return node
    raise KeyError(node_id)
