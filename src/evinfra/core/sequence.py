"""A request's state on one node: its blocks, how much of it is computed, its phase."""

from __future__ import annotations

import enum
from collections.abc import Sequence as Seq

from evinfra.core.blocks import num_blocks_for
from evinfra.core.types import Request


class SeqPhase(enum.Enum):
    WAITING = "waiting"  # queued for prefill (or re-prefill after preemption)
    PREFILLING = "prefilling"  # admitted: blocks held, chunks under way
    HANDOFF = "handoff"  # prefilled here, KV waiting to move to its decode node
    INCOMING = "incoming"  # blocks reserved here, KV arriving from the prefill node
    DECODING = "decoding"
    FINISHED = "finished"


class DecodeClock:
    """Decode steps a node has applied to its running batch (see `core.decode_batch`)."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = 0


class Sequence:
    """Mutable per-node state of one request.

    Token accounting: `num_generated` output tokens exist; KV is computed for
    `num_computed_tokens` of the `num_prompt + num_generated` tokens. A prefill computes
    every existing token and samples one; a decode step computes the last sampled token
    and samples the next. A request is done when `num_generated == max_output_tokens`.

    While it is in a node's decode batch, both counters are held relative to the node's
    `DecodeClock` (a decode step moves the clock, not each sequence); they read and
    write the same either way.
    """

    __slots__ = (
        "_clock",
        "_clock_base",
        "_computed",
        "_generated",
        "admit_seq",
        "block_ids",
        "decode_here",
        "num_cached_tokens",
        "num_committed_blocks",
        "num_held_blocks",
        "num_host_cached_tokens",
        "num_preemptions",
        "num_prefill_target",
        "output_hashes",
        "pending_prefill_tokens",
        "phase",
        "request",
        "run_pos",
    )

    def __init__(self, request: Request, decode_here: bool = True) -> None:
        self.request = request
        self.decode_here = decode_here
        self.phase = SeqPhase.WAITING
        self.block_ids: list[int] = []
        self._clock: DecodeClock | None = None
        self._clock_base = 0
        """The clock's steps when this sequence's counters were last synced with it."""
        self._computed = 0
        self._generated = 0
        self.run_pos = 0
        """Order of joining the node's running list (the decode order)."""
        self.num_committed_blocks = 0
        """Leading blocks of `block_ids` already recorded in the pool's prefix index."""
        self.num_held_blocks = 0
        """Leading blocks of `block_ids` known to hold their hashes (cached, onboarded or
        committed with no other block holding the content): the pool's free reads them
        from here instead of from each block."""
        self.num_cached_tokens = 0
        self.num_host_cached_tokens = 0
        self.num_prefill_target = request.num_prompt_tokens
        self.pending_prefill_tokens = 0
        self.num_preemptions = 0
        self.admit_seq = 0
        # a server appends hashes of generated blocks as they fill; the simulator knows them
        self.output_hashes: list[int] = list(request.output_hashes)

    @property
    def num_computed_tokens(self) -> int:
        clock = self._clock
        if clock is None:
            return self._computed
        return self._computed + clock.steps - self._clock_base

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        clock = self._clock
        self._computed = value if clock is None else value - clock.steps + self._clock_base

    @property
    def num_generated(self) -> int:
        clock = self._clock
        if clock is None:
            return self._generated
        return self._generated + clock.steps - self._clock_base

    @num_generated.setter
    def num_generated(self, value: int) -> None:
        clock = self._clock
        self._generated = value if clock is None else value - clock.steps + self._clock_base

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

    def known_hashes_between(self, start: int, end: int) -> Seq[int]:
        """Content hashes of blocks `start` up to `end` (exclusive), stopping at the first
        whose content is not known yet."""
        prompt = self.request.prompt_hashes
        n = len(prompt)
        if end <= n:
            return prompt[start:end]
        return [*prompt[start:n], *self.output_hashes[max(start - n, 0) : end - n]]

    def known_hashes(self) -> tuple[int, ...]:
        return self.request.prompt_hashes + tuple(self.output_hashes)

    def num_blocks_needed(self, num_tokens: int, block_size: int) -> int:
        return max(0, num_blocks_for(num_tokens, block_size) - len(self.block_ids))

    # -- decode clock (driven by core.decode_batch) ------------------------------------------
    @property
    def on_clock(self) -> bool:
        return self._clock is not None

    def join_clock(self, clock: DecodeClock) -> None:
        """From now on, every step of `clock` advances this sequence by one token."""
        self._clock = clock
        self._clock_base = clock.steps

    def leave_clock(self) -> None:
        """Fold the steps taken on the clock into the counters and stop following it."""
        clock = self._clock
        if clock is not None:
            steps = clock.steps - self._clock_base
            self._computed += steps
            self._generated += steps
            self._clock = None

    def hold(self, num_steps: int) -> None:
        """The clock moved `num_steps` steps that did not include this sequence."""
        self._clock_base += num_steps

    @property
    def clock_offset(self) -> int:
        """num_computed_tokens minus the clock's steps (constant while on the clock)."""
        return self._computed - self._clock_base

    @property
    def finish_step(self) -> int:
        """The clock's steps at which this sequence has generated all its outputs."""
        return self._clock_base + self.request.max_output_tokens - self._generated

    def need_step(self, block_size: int) -> int:
        """The clock's steps at which this sequence's next token needs a block it lacks."""
        return len(self.block_ids) * block_size - self._computed + self._clock_base
