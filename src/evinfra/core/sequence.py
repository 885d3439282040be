"""A request's state on one node: its blocks, how much of it is computed, its phase."""

from __future__ import annotations

import enum

from evinfra.core.blocks import num_blocks_for
from evinfra.core.types import Request


class SeqPhase(enum.Enum):
    WAITING = "waiting"  # queued for prefill (or re-prefill after preemption)
    PREFILLING = "prefilling"  # admitted: blocks held, chunks under way
    HANDOFF = "handoff"  # prefilled here, KV waiting to move to its decode node
    INCOMING = "incoming"  # blocks reserved here, KV arriving from the prefill node
    DECODING = "decoding"
    FINISHED = "finished"


class Sequence:
    """Mutable per-node state of one request.

    Token accounting: `num_generated` output tokens exist; KV is computed for
    `num_computed_tokens` of the `num_prompt + num_generated` tokens. A prefill computes
    every existing token and samples one; a decode step computes the last sampled token
    and samples the next. A request is done when `num_generated == max_output_tokens`.
    """

    __slots__ = (
        "admit_seq",
        "block_ids",
        "decode_here",
        "num_cached_tokens",
        "num_committed_blocks",
        "num_computed_tokens",
        "num_generated",
        "num_host_cached_tokens",
        "num_preemptions",
        "num_prefill_target",
        "output_hashes",
        "pending_prefill_tokens",
        "phase",
        "request",
    )

    def __init__(self, request: Request, decode_here: bool = True) -> None:
        self.request = request
        self.decode_here = decode_here
        self.phase = SeqPhase.WAITING
        self.block_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_committed_blocks = 0
        """Leading blocks of `block_ids` already recorded in the pool's prefix index."""
        self.num_generated = 0
        self.num_cached_tokens = 0
        self.num_host_cached_tokens = 0
        self.num_prefill_target = request.num_prompt_tokens
        self.pending_prefill_tokens = 0
        self.num_preemptions = 0
        self.admit_seq = 0
        # a server appends hashes of generated blocks as they fill; the simulator knows them
        self.output_hashes: list[int] = list(request.output_hashes)

    @property
    def seq_id(self) -> int:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.num_prompt_tokens + self.num_generated

    @property
    def num_remaining_outputs(self) -> int:
        return self.request.max_output_tokens - self.num_generated

    @property
    def is_done(self) -> bool:
        return self.num_generated >= self.request.max_output_tokens

    def block_hash(self, index: int) -> int | None:
        """Content hash of block `index` of this sequence, when known."""
        req = self.request
        n = len(req.prompt_hashes)
        if index < n:
            return req.prompt_hashes[index]
        j = index - n
        return self.output_hashes[j] if j < len(self.output_hashes) else None

    def known_hashes(self) -> tuple[int, ...]:
        return self.request.prompt_hashes + tuple(self.output_hashes)

    def num_blocks_needed(self, num_tokens: int, block_size: int) -> int:
        return max(0, num_blocks_for(num_tokens, block_size) - len(self.block_ids))
