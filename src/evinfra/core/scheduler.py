"""A node's continuous-batching scheduler: chunked prefill under a token budget, decode
batching, preemption when KV runs out, and a role that only changes what it admits.

The scheduler plans a step and is told when the step is done; it never runs a model and
never reads a clock. The simulator charges a cost model's time for each plan; the servers
run an executor on it. Both call the same methods in the same order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from evinfra.core.allocation import Allocation
from evinfra.core.blocks import num_blocks_for
from evinfra.core.decode_batch import DecodeBatch, longest_run
from evinfra.core.kv_pool import KVPool, PrefixMatch
from evinfra.core.sequence import SeqPhase, Sequence
from evinfra.core.types import Request, Role


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    block_size: int
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_prefill_chunk_tokens: int | None = None
    """Cap on one sequence's chunk per step (None: the remaining budget)."""
    allocation: Allocation = Allocation.PROMPT
    """When a prefill gets its blocks: the whole prompt at admission, or chunk by chunk
    (see `core.allocation`)."""

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class ChunkWork:
    seq: Sequence
    num_new_tokens: int
    num_context_tokens: int
    completes_prefill: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    chunks: tuple[ChunkWork, ...]
    decodes: tuple[Sequence, ...]
    num_onboarded_blocks: int
    """Blocks brought from the host tier for sequences admitted in this step."""
    preempted: tuple[Sequence, ...] = ()
    num_decode_context_tokens: int | None = None
    """Sum of num_computed_tokens + 1 over `decodes` when planned (None: not given)."""

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks) + len(self.decodes)


@dataclass(slots=True)
class StepOutcome:
    prefilled: list[Sequence] = field(default_factory=list)
    """Sequences whose prefill completed (a token was sampled)."""
    handoffs: list[Sequence] = field(default_factory=list)
    """Of those, the ones whose decode runs elsewhere (KV must move)."""
    finished: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class NodeScheduler:
    """One node: a KV pool, queues, a role. Implements policy.base.NodeView."""

    def __init__(self, node_id: int, pool: KVPool, config: SchedulerConfig, role: Role) -> None:
        self.node_id = node_id
        self.pool = pool
        self.config = config
        self.role = role
        self.is_serving = True
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        """Decoding sequences, in the order they joined (the decode order)."""
        self._decode = DecodeBatch(config.block_size)
        """The running sequences, advanced by the node's decode clock."""
        self._skipped: list[Sequence] = []
        """Sequences on the clock that the planned step does not decode."""
        self._num_joined = 0
        self.handoff: dict[int, Sequence] = {}
        self.incoming: dict[int, Sequence] = {}
        self._admit_counter = 0
        self.num_preemptions = 0
        self.num_prompt_tokens_seen = 0
        self.num_prompt_tokens_cached = 0
        self.num_prompt_tokens_host_cached = 0

    # -- NodeView ----------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def num_device_blocks(self) -> int:
        return self.pool.num_device_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def num_waiting_prefill_tokens(self) -> int:
        return sum(s.pending_prefill_tokens for s in self.waiting) + sum(
            s.num_prefill_target - s.num_computed_tokens for s in self.prefilling
        )

    @property
    def num_waiting_requests(self) -> int:
        return len(self.waiting) + len(self.prefilling)

    @property
    def num_running_decodes(self) -> int:
        return len(self.running) + len(self.incoming)

    @property
    def num_decode_blocks(self) -> int:
        return sum(len(s.block_ids) for s in self.running) + sum(
            len(s.block_ids) for s in self.incoming.values()
        )

    @property
    def num_decode_context_tokens(self) -> int:
        return self._decode.num_context_tokens()

    def match_prefix(self, hashes: Seq[int]) -> PrefixMatch:
        return self.pool.match_prefix(hashes)

    @property
    def is_idle(self) -> bool:
        return not (
            self.waiting or self.prefilling or self.running or self.handoff or self.incoming
        )

    # -- admission -----------------------------------------------------------------------
    def enqueue_prefill(self, request: Request, decode_here: bool) -> Sequence:
        """Queue a request for prefill on this node; `decode_here` keeps its decode here."""
        seq = Sequence(request, decode_here)
        match = self.pool.match_prefix(request.prompt_hashes)
        seq.pending_prefill_tokens = max(
            0, request.num_prompt_tokens - match.num_blocks * self.block_size
        )
        self.waiting.append(seq)
        return seq

    def _try_admit(self, seq: Sequence, budget: int) -> int | None:
        """Give a waiting sequence its blocks: cached prefix first (device, then host),
        then new ones, for the whole prompt or (per-chunk allocation) for the chunk that
        `budget` lets it run now. Returns the number of blocks onboarded from host, None
        if short (nothing taken)."""
        bs = self.block_size
        target = seq.num_tokens
        # at least one token must be computed to sample from
        max_hit = (target - 1) // bs
        hashes = _hashes_upto(seq, max_hit)
        match = self.pool.match_prefix(hashes, max_hit)
        need_total = num_blocks_for(target, bs)
        hit_hashes = hashes[: match.num_device_blocks]
        num_hit = match.num_device_blocks + match.num_host_blocks
        allocation = self.config.allocation
        if not allocation.per_chunk:
            need = need_total
        elif allocation is Allocation.CHUNK_WHEN_PROMPT_FITS and not self.pool.can_allocate_after(
            need_total - match.num_device_blocks, hit_hashes
        ):
            return None
        else:
            first = self._chunk_tokens(target - num_hit * bs, budget)
            need = num_blocks_for(num_hit * bs + first, bs)
        ids = self.pool.try_acquire_and_allocate(hit_hashes, need - match.num_device_blocks)
        if ids is None:
            return None
        seq.block_ids = ids
        seq.num_held_blocks = match.num_device_blocks
        # cached and onboarded blocks are indexed
        self._commit(seq, match.num_device_blocks, hashes[match.num_device_blocks : num_hit])
        seq.num_computed_tokens = num_hit * bs
        seq.num_prefill_target = target
        if seq.num_generated == 0 and seq.num_preemptions == 0:  # its first admission
            seq.num_cached_tokens = num_hit * bs
            seq.num_host_cached_tokens = match.num_host_blocks * bs
            self.num_prompt_tokens_seen += seq.request.num_prompt_tokens
            self.num_prompt_tokens_cached += seq.num_cached_tokens
            self.num_prompt_tokens_host_cached += seq.num_host_cached_tokens
        seq.pending_prefill_tokens = 0
        seq.phase = SeqPhase.PREFILLING
        self._admit_counter += 1
        seq.admit_seq = self._admit_counter
        return match.num_host_blocks

    # -- planning ------------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        """Plan the next step: decodes first, then prefill chunks under the token budget.
        Admits waiting sequences (allocating their blocks) and preempts the newest running
        sequence when a decode cannot get a block. None when there is nothing to run.

        The role is not consulted: it decides what the router sends here; whatever is
        queued here runs here, so a role switch never strands work."""
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        preempted: list[Sequence] = []
        decoding = SeqPhase.DECODING
        decodes = self._plan_decodes(min(cfg.max_num_seqs, budget), preempted)
        budget -= len(decodes)
        if preempted:
            decodes = [s for s in decodes if s.phase is decoding]
            budget = cfg.max_num_batched_tokens - len(decodes)
        chunks: list[ChunkWork] = []
        prefilling = SeqPhase.PREFILLING
        for seq in list(self.prefilling):
            if budget <= 0:
                break
            if seq.phase is not prefilling:
                continue  # preempted for an older sequence's chunk or decode
            take = self._chunk_tokens(seq.num_prefill_target - seq.num_computed_tokens, budget)
            # per-chunk allocation: the chunk's blocks now, or it waits a step (a whole-prompt
            # allocation already holds them)
            if self._ensure_blocks(seq, seq.num_computed_tokens + take, preempted):
                budget -= self._add_chunk(seq, take, chunks)
        if preempted:
            decodes = [s for s in decodes if s.phase is decoding]
        # admit new prefills only while this step has budget for them (as vLLM does): a
        # burst of requests sharing a prefix then hits the blocks the first one computed
        # (committed chunk by chunk) instead of every one computing them. Per-chunk
        # allocation admits none in a step that had to preempt (as vLLM does)
        onboarded = 0
        while (
            budget > 0
            and self.waiting
            and len(decodes) + len(self.prefilling) < cfg.max_num_seqs
            and not (preempted and cfg.allocation.per_chunk)
        ):
            got = self._try_admit(self.waiting[0], budget)
            if got is None:
                break
            onboarded += got
            seq = self.waiting.popleft()
            self.prefilling.append(seq)
            take = self._chunk_tokens(seq.num_prefill_target - seq.num_computed_tokens, budget)
            budget -= self._add_chunk(seq, take, chunks)
        if not chunks and not decodes:
            return None if not preempted else StepPlan((), (), 0, tuple(preempted))
        batch = self._decode
        if len(decodes) == len(batch):
            self._skipped = []
            context = batch.num_context_tokens()
        else:
            planned = set(decodes)
            self._skipped = [s for s in self.running if s not in planned]
            context = sum(s.num_computed_tokens + 1 for s in decodes)
        return StepPlan(tuple(chunks), tuple(decodes), onboarded, tuple(preempted), context)

    def _plan_decodes(self, max_decodes: int, preempted: list[Sequence]) -> list[Sequence]:
        """The running sequences this step decodes, in order: all of them but those
        whose next token needs a block none can be found for (they wait a step). Only
        those whose next token starts a block are looked at, unless the batch is over
        `max_decodes` (then the first `max_decodes` that can run)."""
        batch = self._decode
        batch.join_all()
        self._skipped = []
        due = batch.take_needing(batch.clock.steps)
        decoding = SeqPhase.DECODING
        if len(self.running) <= max_decodes:
            waiting: set[Sequence] = set()
            for seq in due:
                if seq.phase is decoding and not self._ensure_blocks(
                    seq, seq.num_computed_tokens + 1, preempted
                ):
                    waiting.add(seq)
            decodes = [s for s in self.running if s not in waiting] if waiting else self.running
            decodes = list(decodes)
        else:
            bs = self.block_size
            decodes = []
            for seq in list(self.running):
                if len(decodes) >= max_decodes:
                    break
                if seq.phase is not decoding:
                    continue  # preempted while making room for an earlier one
                # only a sequence whose next token starts a block needs one
                if seq.num_computed_tokens + 1 > len(
                    seq.block_ids
                ) * bs and not self._ensure_blocks(seq, seq.num_computed_tokens + 1, preempted):
                    continue
                decodes.append(seq)
        for seq in due:
            if seq in batch:
                batch.track_need(seq)
        return decodes

    def _chunk_tokens(self, remaining: int, budget: int) -> int:
        take = min(remaining, budget)
        if self.config.max_prefill_chunk_tokens is not None:
            take = min(take, self.config.max_prefill_chunk_tokens)
        return take

    def _add_chunk(self, seq: Sequence, take: int, chunks: list[ChunkWork]) -> int:
        remaining = seq.num_prefill_target - seq.num_computed_tokens
        chunks.append(ChunkWork(seq, take, seq.num_computed_tokens, take == remaining))
        return take

    def _ensure_blocks(self, seq: Sequence, num_tokens: int, preempted: list[Sequence]) -> bool:
        """Extend `seq`'s blocks to hold `num_tokens`, preempting while short; False if
        still short (it then waits a step)."""
        need = seq.num_blocks_needed(num_tokens, self.block_size)
        while need > 0:
            ids = self.pool.try_allocate(need)
            if ids is not None:
                seq.block_ids.extend(ids)
                return True
            victim = self._pick_preemption_victim(seq)
            if victim is None:
                return False
            self.preempt(victim)
            preempted.append(victim)
        return True

    def _pick_preemption_victim(self, exclude: Sequence) -> Sequence | None:
        """The newest decoding sequence but `exclude`. Under per-chunk allocation a
        prefilling sequence holds part of its blocks and is a candidate too, and only
        sequences admitted after `exclude` are: the oldest can then always take every
        block it needs, so no two sequences wait on each other (vLLM's FCFS order)."""
        decoding = SeqPhase.DECODING
        cands = [s for s in self.running if s is not exclude and s.phase is decoding]
        if self.config.allocation.per_chunk:
            cands = [s for s in [*cands, *self.prefilling] if s.admit_seq > exclude.admit_seq]
        if not cands:
            return None
        return max(cands, key=lambda s: s.admit_seq)

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption of a decoding sequence, or (per-chunk allocation) of
        one whose prefill is under way: keep its full blocks cached, free them, requeue it
        at the front; it will re-prefill here (a decode continues here, a prefill's decode
        stays where the router put it)."""
        if seq.phase is SeqPhase.PREFILLING:
            self.prefilling.remove(seq)
        else:
            seq.decode_here = True
            self._remove_running(seq)  # off the decode clock before its counters reset
        self._release(seq)
        seq.num_computed_tokens = 0
        seq.phase = SeqPhase.WAITING
        seq.num_preemptions += 1
        seq.pending_prefill_tokens = seq.num_tokens
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _commit_computed(self, seq: Sequence) -> None:
        start = seq.num_committed_blocks
        end = min(len(seq.block_ids), seq.num_computed_tokens // self.block_size)
        if end > start:
            # the hashes known, up to the first unknown
            self._commit(seq, start, seq.known_hashes_between(start, end))

    def _commit(self, seq: Sequence, start: int, hashes: Seq[int]) -> None:
        """Index `seq`'s blocks from `start` under `hashes`. The held prefix grows over them
        only when it reaches `start` and every block took its content (none was found
        already in another block, which leaves this one empty)."""
        end = start + len(hashes)
        num_added = self.pool.commit_many(seq.block_ids[start:end], hashes)
        seq.num_committed_blocks = end
        if num_added == len(hashes) and seq.num_held_blocks == start:
            seq.num_held_blocks = end

    def _release(self, seq: Sequence) -> None:
        self._commit_computed(seq)
        self.pool.free(seq.block_ids, seq.known_hashes_between(0, seq.num_held_blocks))
        seq.block_ids = []
        seq.num_committed_blocks = 0
        seq.num_held_blocks = 0

    # -- completion ----------------------------------------------------------------------
    def complete_step(self, plan: StepPlan, stopped: frozenset[int] = frozenset()) -> StepOutcome:
        """Account for a finished step: chunks advance, prefills sample their first token,
        decodes sample one each. `stopped` names sequences that hit a stop token (server)."""
        out = StepOutcome(preempted=list(plan.preempted))
        for chunk in plan.chunks:
            seq = chunk.seq
            seq.num_computed_tokens += chunk.num_new_tokens
            # full blocks are visible to other requests as soon as they are computed
            self._commit_computed(seq)
            if chunk.completes_prefill:
                self.prefilling.remove(seq)
                seq.num_generated += 1
                out.prefilled.append(seq)
                self._after_prefill(seq, stopped, out)
        if plan.decodes:
            self._advance_decodes(plan.decodes, 1, stopped, out)
        return out

    def _advance_decodes(
        self, decodes: Seq[Sequence], num_steps: int, stopped: frozenset[int], out: StepOutcome
    ) -> None:
        """`decodes` (the planned step's) each decoded `num_steps` tokens: move the clock,
        hold back the sequences on it that the plan left out, finish those done."""
        batch = self._decode
        batch.advance(num_steps)
        for seq in self._skipped:
            if seq in batch:
                batch.hold(seq, num_steps)
        self._skipped = []
        done = batch.take_finished()
        if stopped:
            done = [s for s in decodes if s in batch and (s.is_done or s.seq_id in stopped)]
        for seq in done:
            self._finish(seq, was_running=True)
            out.finished.append(seq)

    def _after_prefill(self, seq: Sequence, stopped: frozenset[int], out: StepOutcome) -> None:
        if seq.is_done or seq.seq_id in stopped:
            self._finish(seq, was_running=False)
            out.finished.append(seq)
        elif not seq.decode_here:
            self._commit_computed(seq)
            seq.phase = SeqPhase.HANDOFF
            self.handoff[seq.seq_id] = seq
            out.handoffs.append(seq)
        else:
            seq.phase = SeqPhase.DECODING
            self._add_running(seq)

    def _add_running(self, seq: Sequence) -> None:
        self._num_joined += 1
        seq.run_pos = self._num_joined
        self.running.append(seq)
        self._decode.add(seq)

    def _remove_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._decode.remove(seq)

    def _finish(self, seq: Sequence, was_running: bool) -> None:
        if was_running:
            self._remove_running(seq)
        self._release(seq)
        seq.phase = SeqPhase.FINISHED

    def max_decode_run_steps(self) -> int:
        """Steps a pure-decode batch can run with no scheduling decision changing: until
        the first sequence finishes or KV runs short. 0 when the next step is not a pure
        decode of every running sequence (the caller then steps one at a time)."""
        if self.prefilling or not self.running:
            return 0
        if len(self.running) > min(self.config.max_num_seqs, self.config.max_num_batched_tokens):
            return 0
        k = self._decode.min_remaining_outputs()
        if k is None or k <= 0:
            return 0
        num_free_blocks, bs = self.pool.num_free_blocks, self.block_size
        # each room takes ceil((k - room) / bs) blocks at most: when even the lowest room's
        # need times the rooms fits, `longest_run` answers k without reading every room
        num_rooms, floor = self._decode.room_bound()
        if num_rooms * max(0, -((floor - k) // bs)) <= num_free_blocks:
            return k
        return longest_run(self._decode.rooms(), k, num_free_blocks, bs)

    def reserve_decode_run(self, seqs: Seq[Sequence], num_steps: int) -> None:
        """Allocate now every block a decode run of `num_steps` over `seqs` (the plan's
        decodes: every running sequence) will need, so that work arriving during the run
        cannot take them. Only the sequences that cross a block boundary are touched."""
        self._check_run(seqs)
        self._decode.allocate_run(self.pool, num_steps)

    def apply_decode_run(self, seqs: Seq[Sequence], num_steps: int) -> StepOutcome:
        """Advance `seqs` (the decodes of the plan that started the run: every sequence on
        the decode clock; work that joined during it waits for the next step) by
        `num_steps` decode steps at once. Blocks still missing (no `reserve_decode_run`)
        are taken first, in decode order, before any sequence of the run finishes."""
        self._check_run(seqs)
        self._decode.allocate_run(self.pool, num_steps)
        out = StepOutcome()
        self._advance_decodes(seqs, num_steps, frozenset(), out)
        return out

    def _check_run(self, seqs: Seq[Sequence]) -> None:
        """A run moves the whole decode clock: every sequence on it must be in `seqs`."""
        self._decode.join_listed(seqs)
        if len(seqs) != len(self._decode):
            raise ValueError("a decode run advances every sequence on the decode clock")
        self._skipped = []

    # -- disaggregation ------------------------------------------------------------------
    def release_handoff(self, seq_id: int) -> Sequence:
        """The KV of a handed-off sequence has reached its decode node: free it here (its
        blocks stay cached for later hits)."""
        seq = self.handoff.pop(seq_id)
        self._release(seq)
        seq.phase = SeqPhase.FINISHED
        return seq

    def try_reserve_incoming(self, request: Request, num_generated: int) -> int | None:
        """Reserve blocks for a sequence prefilled elsewhere, reusing this node's own
        cached prefix. Returns the number of blocks whose KV must be transferred, or None
        when KV is short (retry after blocks are freed)."""
        seq = Sequence(request, decode_here=True)
        seq.num_generated = num_generated
        bs = self.block_size
        computed = seq.num_tokens - 1
        hashes = _hashes_upto(seq, computed // bs)
        match = self.pool.match_prefix(hashes, computed // bs)
        need = num_blocks_for(computed + 1, bs) - match.num_device_blocks
        hit_hashes = hashes[: match.num_device_blocks]
        ids = self.pool.try_acquire_and_allocate(hit_hashes, need)
        if ids is None:
            return None
        seq.block_ids = ids
        seq.num_committed_blocks = match.num_device_blocks
        seq.num_held_blocks = match.num_device_blocks
        seq.num_computed_tokens = computed
        seq.phase = SeqPhase.INCOMING
        self._admit_counter += 1
        seq.admit_seq = self._admit_counter
        self.incoming[request.request_id] = seq
        return num_blocks_for(computed, bs) - match.num_device_blocks

    def accept_incoming(self, seq_id: int) -> Sequence:
        """The KV arrived: the sequence starts decoding here."""
        seq = self.incoming.pop(seq_id)
        self._commit_computed(seq)
        seq.phase = SeqPhase.DECODING
        self._add_running(seq)
        return seq

    def take_running(self, seq_id: int) -> Sequence:
        """Detach a decoding sequence to migrate it (its blocks stay cached here)."""
        seq = next(s for s in self.running if s.seq_id == seq_id)
        self._remove_running(seq)
        self._release(seq)
        seq.phase = SeqPhase.FINISHED
        return seq

    def abort(self, seq_id: int) -> Sequence | None:
        """Drop a request wherever it is on this node (client gone, node failure), freeing
        its blocks. Returns it, or None if it is not here."""
        for seq in list(self.waiting):
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                seq.phase = SeqPhase.FINISHED
                return seq
        for seq in self.prefilling:
            if seq.seq_id == seq_id:
                self.prefilling.remove(seq)
                self._release(seq)
                seq.phase = SeqPhase.FINISHED
                return seq
        for table in (self.handoff, self.incoming):
            if seq_id in table:
                seq = table.pop(seq_id)
                self._release(seq)
                seq.phase = SeqPhase.FINISHED
                return seq
        for seq in self.running:
            if seq.seq_id == seq_id:
                self._finish(seq, was_running=True)
                return seq
        return None

    def set_role(self, role: Role) -> None:
        """Change what the router may send here. KV and queued work stay."""
        self.role = role

    def check_integrity(self) -> None:
        """The pool's check, plus: every held block belongs to exactly one live sequence
        reference, and queue phases are consistent."""
        self.pool.check_integrity()
        refs: dict[int, int] = {}
        live = list(self.prefilling) + self.running
        live += list(self.handoff.values()) + list(self.incoming.values())
        for seq in live:
            for b in seq.block_ids:
                refs[b] = refs.get(b, 0) + 1
            held = seq.known_hashes_between(0, seq.num_held_blocks)
            if len(held) != seq.num_held_blocks or any(
                self.pool.hash_of(b) != h for b, h in zip(seq.block_ids, held, strict=False)
            ):
                raise AssertionError(f"sequence {seq.seq_id}: a held block lacks its hash")
        for b, n in refs.items():
            if self.pool.ref_count(b) != n:
                raise AssertionError(f"block {b}: ref {self.pool.ref_count(b)} != holders {n}")
        if self.pool.num_used_blocks != len(refs):
            raise AssertionError("blocks in use that no sequence holds")
        for seq in self.waiting:
            if seq.block_ids or seq.phase is not SeqPhase.WAITING:
                raise AssertionError(f"waiting sequence {seq.seq_id} holds blocks")
        self._decode.check_integrity(self.running)


def _hashes_upto(seq: Sequence, num_blocks: int) -> Seq[int]:
    """Hashes that start with `seq`'s first `num_blocks` known ones: the request's own
    prompt tuple when that covers them (the pool remembers its match of that tuple),
    else prompt and outputs joined."""
    prompt = seq.request.prompt_hashes
    return prompt if num_blocks <= len(prompt) else seq.known_hashes()
