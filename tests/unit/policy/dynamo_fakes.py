"""Small fake NodeViews and requests for the dynamo / aggregated policy tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.types import AgentHints, Request, Role


@dataclass(frozen=True)
class FakeNode:
    node_id: int
    role: Role = Role.DECODE
    is_serving: bool = True
    block_size: int = 16
    num_device_blocks: int = 1000
    num_free_blocks: int = 1000
    num_used_blocks: int = 0
    num_waiting_prefill_tokens: int = 0
    num_waiting_requests: int = 0
    num_running_decodes: int = 0
    num_decode_blocks: int = 0
    num_decode_context_tokens: int = 0
    device_hashes: frozenset[int] = field(default_factory=frozenset)
    host_hashes: frozenset[int] = field(default_factory=frozenset)

    def match_prefix(self, hashes: Sequence[int]) -> PrefixMatch:
        num_device = 0
        for h in hashes:
            if h not in self.device_hashes:
                break
            num_device += 1
        num_host = 0
        for h in hashes[num_device:]:
            if h not in self.host_hashes:
                break
            num_host += 1
        return PrefixMatch(num_device, num_host)


@dataclass(frozen=True)
class FakeCluster:
    nodes: tuple[FakeNode, ...]


def cluster(*nodes: FakeNode) -> FakeCluster:
    return FakeCluster(tuple(nodes))


def cached(num_blocks: int, start: int = 0) -> frozenset[int]:
    """Hashes of the first `num_blocks` blocks of a `make_request` prompt."""
    return frozenset(range(start, start + num_blocks))


def make_request(
    request_id: int = 1,
    num_blocks: int = 10,
    block_size: int = 16,
    extra_tokens: int = 0,
    session_id: str | None = None,
    priority: int | None = None,
    expected_output_tokens: int | None = None,
    first_hash: int = 0,
) -> Request:
    hints = None
    if session_id is not None:
        hints = AgentHints(
            session_id=session_id,
            priority=priority,
            expected_output_tokens=expected_output_tokens,
        )
    return Request(
        request_id=request_id,
        prompt_hashes=tuple(range(first_hash, first_hash + num_blocks)),
        num_prompt_tokens=num_blocks * block_size + extra_tokens,
        max_output_tokens=64,
        hints=hints,
    )
