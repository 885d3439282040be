"""What the frontend does when a node dies: forget its KV, cover the roles, resume requests.

Pure functions over the frontend's `NodeState`s and requests; the runtime applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from evinfra.core.blocks import hash_token_blocks
from evinfra.core.types import Request, Role, RoleChange, SwitchMode
from evinfra.serve.protocol import Generation
from evinfra.serve.requests import LiveRequest
from evinfra.serve.view import NodeState

PREFILL_ROLES = (Role.PREFILL, Role.MIXED)
DECODE_ROLES = (Role.DECODE, Role.MIXED)


def forget_node(node: NodeState) -> None:
    """Mark a dead node and drop its blocks from the index the router matches prefixes
    against (its last snapshot's cached hashes), and its in-flight bookkeeping."""
    node.alive = False
    node.stats = replace(
        node.stats,
        cached_hashes=frozenset(),
        num_free_blocks=0,
        num_used_blocks=node.stats.num_device_blocks,
        num_waiting_requests=0,
        num_waiting_prefill_tokens=0,
        num_running_decodes=0,
        num_decode_blocks=0,
        num_decode_context_tokens=0,
    )
    node.sent.clear()
    node.incoming.clear()


def coverage_changes(nodes: Sequence[NodeState]) -> list[RoleChange]:
    """Role changes that leave the live nodes able to prefill and to decode.

    One survivor becomes mixed. Among several, if no one prefills (or decodes), the
    least-loaded node of the over-covered role takes the missing one. Empty when the
    roles are covered (a mixed node covers both) or no node is left."""
    live = [n for n in nodes if n.alive and n.is_serving]
    if not live:
        return []
    if len(live) == 1:
        node = live[0]
        return [] if node.role is Role.MIXED else [RoleChange(node.node_id, Role.MIXED)]
    prefills = [n for n in live if n.role in PREFILL_ROLES]
    decodes = [n for n in live if n.role in DECODE_ROLES]
    if not prefills:
        node = min(decodes, key=lambda n: (n.num_running_decodes, n.node_id))
        return [RoleChange(node.node_id, Role.PREFILL, SwitchMode.IN_PLACE)]
    if not decodes:
        node = min(prefills, key=lambda n: (n.num_waiting_prefill_tokens, n.node_id))
        return [RoleChange(node.node_id, Role.DECODE, SwitchMode.IN_PLACE)]
    return []


def depends_on(live: LiveRequest, node_id: int) -> bool:
    """Whether the request is lost if `node_id` dies: it decodes there, or it prefills
    there and its KV has not reached its decode node yet (the decode node streams the
    first token only once the KV has arrived)."""
    route = live.route
    if route is None:
        return False
    if node_id == route.decode_node:
        return True
    return node_id == route.prefill_node and live.num_output_tokens == 0


@dataclass(frozen=True, slots=True)
class Resumption:
    """A request started again elsewhere: its prompt is the old prompt plus the tokens it
    had streamed, and it may generate what is left of its budget."""

    request: Request
    generation: Generation


def resume(
    request: Request, generation: Generation, streamed: Sequence[int], new_id: int,
    block_size: int,
) -> Resumption | None:  # fmt: skip
    """The resumed form of a request that streamed `streamed` before its node died (None
    when nothing is left to generate). The new node recomputes the KV of the whole
    context (or hits its cache for the shared prefix); greedy decoding continues exactly
    where it stopped."""
    num_left = request.max_output_tokens - len(streamed)
    if num_left <= 0:
        return None
    prompt_ids = (*generation.prompt_ids, *streamed)
    new_request = Request(
        new_id,
        tuple(hash_token_blocks(list(prompt_ids), block_size)),
        len(prompt_ids),
        num_left,
        hints=request.hints,
    )
    return Resumption(
        new_request, Generation(prompt_ids, generation.stop_token_ids, generation.sampling)
    )
