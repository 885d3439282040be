"""The evolving router: predicts each placement's end-to-end latency and picks the best.

For every prefill candidate it counts what is cached there, what could be pulled from the
node holding the longest prefix (when moving it beats recomputing it), the queue ahead,
and the KV hand-off to a decode node; for decode it weighs batch size and KV room. A
session's next turn usually lands where its context was decoded: its prompt is that
context plus a few new tokens, so a small local prefill on that decode node beats a
remote prefill plus a transfer back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evinfra.core.blocks import num_blocks_for
from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import Request, Role, Route
from evinfra.policy.base import ClusterView, NodeView, match_all, step_remaining_s
from evinfra.policy.evolving.rates import NodeRates
from evinfra.policy.evolving.sessions import SessionTable


@dataclass(frozen=True, slots=True)
class RouterConfig:
    pull_prefix: bool = True
    """Pull a cached prefix from another node when that beats recomputing it."""
    max_local_prefill_tokens: int = 4096
    """Largest uncached prefill a decode-role node takes for a request it will decode."""
    kv_full_penalty_s: float = 30.0
    """Added to a decode node that lacks KV room for the request (it would preempt)."""
    max_candidates: int = 8
    """Prefill placements predicted per request in clusters larger than this."""
    remote_decode_stall: bool = False
    """Count, for a mixed node decoding a request prefilled elsewhere, the prefill queued
    there that its steps will still carry when the request arrives: each chunk lengthens
    the steps the request decodes in."""
    inflight_step_wait: bool = False
    """Count, for a prefill on a node running decodes, the wait for the step in flight
    (half a decode step at its batch, on average): a prefill-only or idle node starts it at
    once. With prefill-only nodes beside mixed ones (the planner's
    `mixed_prefill_fraction`) this is what sends long prompts to them."""
    step_phase_wait: bool = False
    """With `inflight_step_wait`, count the time left in each node's step in flight where
    the cluster view reports it (`step_remaining_s`) instead of half a step: among mixed
    nodes, a prefill goes to one whose step is about to end."""


_Choice = tuple[float, int, int, int | None]
"""A placement's predicted cost (s), prefill node, decode node and node to pull from: a
plain tuple, as a route predicts up to two per candidate and builds one `Route`."""


class EvolvingRouter:
    def __init__(self, table: SessionTable, rates: NodeRates, config: RouterConfig) -> None:
        self.table = table
        self.rates = rates
        self.config = config
        self.num_pulls = 0
        self.num_local_prefills = 0

    def _expected_output_tokens(self, request: Request) -> float:
        hints = request.hints
        if hints is not None and hints.expected_output_tokens is not None:
            return float(hints.expected_output_tokens)
        sid = self.table.request_session.get(request.request_id)
        entry = self.table.sessions.get(sid) if sid is not None else None
        if entry is not None and entry.output_tokens_ewma > 0:
            return entry.output_tokens_ewma
        return self.table.output_tokens_ewma

    def _decode_cost_s(self, node: NodeView, request: Request, out_tokens: float) -> float:
        rates = self.rates
        steps = max(out_tokens - 1.0, 0.0)
        cost = steps * rates.decode_step_s(node.num_running_decodes + 1)
        need = num_blocks_for(request.num_prompt_tokens + int(out_tokens), node.block_size)
        if need > node.num_free_blocks:
            cost += self.config.kv_full_penalty_s
        return cost

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        nodes = [n for n in view.nodes if n.is_serving]
        if not nodes:
            raise RuntimeError("no node is serving")
        matches = match_all(view, request.prompt_hashes)
        holder = max(nodes, key=lambda n: (matches[n.node_id].num_device_blocks, -n.node_id))
        holder_blocks = matches[holder.node_id].num_device_blocks
        out_tokens = self._expected_output_tokens(request)
        decoders = [n for n in nodes if n.role is not Role.PREFILL] or nodes
        candidates = self._candidates(nodes, matches, request)
        remote_decoders = self._decoder_candidates(decoders, matches)
        # decode costs of the nodes predicted only: O(candidates) per request, not O(nodes)
        dcost = {n.node_id: self._decode_cost_s(n, request, out_tokens) for n in remote_decoders}
        for n in candidates:
            if n.role is not Role.PREFILL and n.node_id not in dcost:
                dcost[n.node_id] = self._decode_cost_s(n, request, out_tokens)
        remote = self._best_remote_decoder(remote_decoders, request, matches, dcost)
        best: _Choice | None = None
        for node in candidates:
            wait_s = self._step_wait_s(node, view, now_s)
            choice = self._evaluate(
                node, request, matches[node.node_id], holder, holder_blocks, remote, dcost, wait_s
            )
            if choice is not None and (best is None or choice[0] < best[0]):
                best = choice
        if best is None:  # only decode nodes and every prefill too big: least queued one
            node = min(nodes, key=lambda n: (n.num_waiting_prefill_tokens, n.node_id))
            self.table.note_route(request.request_id, (node.node_id, node.node_id))
            return Route(node.node_id, node.node_id)
        _, prefill_node, decode_node, pull_from = best
        placed = (prefill_node, decode_node)
        self.table.note_route(
            request.request_id, placed if pull_from is None else (*placed, pull_from)
        )
        if pull_from is not None:
            self.num_pulls += 1
        if prefill_node == decode_node:
            self.num_local_prefills += 1
        return Route(prefill_node, decode_node, pull_from)

    def _candidates(
        self, nodes: list[NodeView], matches: dict[int, PrefixMatch], request: Request
    ) -> list[NodeView]:
        """The prefill placements worth predicting: in a large cluster, the nodes holding
        most of the prompt, the least queued ones and the session's home node (power of
        k choices); in a small one, every node."""
        k = self.config.max_candidates
        if len(nodes) <= k:
            return nodes
        picked = _best_of_two_orders(
            nodes,
            k,
            lambda n: (-matches[n.node_id].num_blocks, n.node_id),
            lambda n: (n.num_waiting_prefill_tokens, n.node_id),
        )
        sid = self.table.request_session.get(request.request_id)
        entry = self.table.sessions.get(sid) if sid is not None else None
        if entry is not None and entry.node_id is not None:
            home = next((n for n in nodes if n.node_id == entry.node_id), None)
            if home is not None:
                picked.setdefault(home.node_id, home)
        return sorted(picked.values(), key=lambda n: n.node_id)

    def _decoder_candidates(
        self, decoders: list[NodeView], matches: dict[int, PrefixMatch]
    ) -> list[NodeView]:
        """The decode nodes worth predicting for a remote prefill: in a large cluster, those
        holding most of the prompt (least to move) and the least loaded (fewest running
        decodes, then most free KV); in a small one, every decode node."""
        k = self.config.max_candidates
        if len(decoders) <= k:
            return decoders
        picked = _best_of_two_orders(
            decoders,
            k,
            lambda n: (-matches[n.node_id].num_device_blocks, n.node_id),
            lambda n: (n.num_running_decodes, -n.num_free_blocks, n.node_id),
        )
        return sorted(picked.values(), key=lambda n: n.node_id)

    def _best_remote_decoder(
        self,
        decoders: Sequence[NodeView],
        request: Request,
        matches: dict[int, PrefixMatch],
        dcost: dict[int, float],
    ) -> tuple[NodeView, float, float]:
        """The decode node for a remote prefill, its cost (decode time plus moving the
        blocks it lacks) and the prefill queued there (s) that its steps will carry."""
        num_blocks = num_blocks_for(request.num_prompt_tokens, decoders[0].block_size)
        best: tuple[float, int, NodeView, float, float] | None = None
        for n in decoders:
            move = self.rates.transfer_s(num_blocks - matches[n.node_id].num_device_blocks)
            stall = self._queued_prefill_s(n)
            cost = move + dcost[n.node_id]
            key = (cost + stall, n.node_id, n, cost, stall)
            if best is None or key[:2] < best[:2]:
                best = key
        assert best is not None
        return best[2], best[3], best[4]

    def _step_wait_s(self, node: NodeView, view: ClusterView, now_s: float) -> float:
        """The wait for the step in flight on a node running decodes before a prefill
        can join (0 unless `inflight_step_wait`): what is left of it where the view
        reports it and `step_phase_wait` is on, else half a decode step at its batch."""
        if not self.config.inflight_step_wait or node.num_running_decodes == 0:
            return 0.0
        if self.config.step_phase_wait and node.num_waiting_prefill_tokens == 0:
            left = step_remaining_s(view, node.node_id, now_s)
            if left is not None:
                return left
        return 0.5 * self.rates.decode_step_s(node.num_running_decodes)

    def _queued_prefill_s(self, node: NodeView) -> float:
        """Prefill queued on a mixed node: its chunks ride in the steps a request handed
        to it decodes in (0 unless `remote_decode_stall`)."""
        if not self.config.remote_decode_stall or node.role is not Role.MIXED:
            return 0.0
        return self.rates.prefill_s(node.num_waiting_prefill_tokens)

    def _evaluate(
        self,
        node: NodeView,
        request: Request,
        match: PrefixMatch,
        holder: NodeView,
        holder_blocks: int,
        remote: tuple[NodeView, float, float],
        dcost: dict[int, float],
        wait_s: float,
    ) -> _Choice | None:
        """`wait_s`: the wait for the node's step in flight (`_step_wait_s`)."""
        rates, bs = self.rates, node.block_size
        hit = match.num_blocks
        pull_from: int | None = None
        pull_s = 0.0
        if self.config.pull_prefix and holder_blocks > hit and holder is not node:
            gain = holder_blocks - hit
            t = rates.transfer_s(gain)
            if t < rates.prefill_s(gain * bs):
                pull_from, pull_s, hit = holder.node_id, t, holder_blocks
        uncached = max(request.num_prompt_tokens - hit * bs, 1)
        if node.role is Role.DECODE and uncached > self.config.max_local_prefill_tokens:
            return None
        queue_s = rates.prefill_s(node.num_waiting_prefill_tokens) + wait_s
        ttft_s = queue_s + pull_s + rates.prefill_s(uncached)
        local: _Choice | None = None
        if node.role is not Role.PREFILL:
            local_cost = ttft_s + dcost[node.node_id]
            if node.role is Role.DECODE:
                # a prefill here stalls the node's running decodes for its duration
                local_cost += (
                    rates.prefill_s(uncached)
                    * node.num_running_decodes
                    / max(rates.max_num_seqs, 1)
                )
            local = (local_cost, node.node_id, node.node_id, pull_from)
        dec, dec_cost, dec_stall_s = remote
        if dec is node or node.role is Role.DECODE:
            return local
        # the decode node works through its queue while this request prefills
        remote_cost = ttft_s + dec_cost + max(dec_stall_s - ttft_s, 0.0)
        if local is None or remote_cost < local[0]:
            return (remote_cost, node.node_id, dec.node_id, pull_from)
        return local


def _best_of_two_orders(
    nodes: list[NodeView],
    k: int,
    first: Callable[[NodeView], tuple[int, ...]],
    then: Callable[[NodeView], tuple[int, ...]],
) -> dict[int, NodeView]:
    """The first k // 2 nodes by `first`, filled up to k with the best by `then`."""
    picked = {n.node_id: n for n in sorted(nodes, key=first)[: k // 2]}
    for n in sorted(nodes, key=then):
        if len(picked) >= k:
            break
        picked.setdefault(n.node_id, n)
    return picked
