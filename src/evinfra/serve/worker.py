"""A node worker process: the core `NodeScheduler` driving an executor.

The loop is the simulator's, on a real clock: read messages, `schedule()`, run the
executor on the plan, `complete_step()`, publish. Token ids live here (the scheduler only
counts them); as generated tokens fill blocks, their chained hashes are appended to the
sequence so later turns hit the cache. A disaggregated request is prefilled here and its
KV bytes pulled by its decode node (see `_on_handoff_offer`, `_on_kv_pull`). A prefill the
router placed with a prefix pull (`Submit.pull_from`) waits until the holder's blocks have
arrived (`_on_prefix_pull`, `_on_prefix_payload`), or until `prefix_pull_timeout_s`, after
which it computes them.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import time
import traceback
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from evinfra.core.allocation import Allocation
from evinfra.core.blocks import ROOT_HASH, chain_hash, num_blocks_for
from evinfra.core.eviction import EvictionPolicy
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig, StepOutcome, StepPlan
from evinfra.core.sequence import Sequence
from evinfra.core.types import Request, Role
from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.policy.published import ScoreSink
from evinfra.serve.executors import Executor, ExecutorSpec, WorkItem, build_executor
from evinfra.serve.links import NodeLinks, node_mailbox
from evinfra.serve.protocol import (
    Abort,
    ApplyKV,
    CheckIntegrity,
    FinishReason,
    Generation,
    HandoffCancel,
    HandoffOffer,
    IntegrityReport,
    KVActionKind,
    KVPayload,
    KVPull,
    NodeStats,
    PrefixPull,
    RequestFailed,
    SetBlockScores,
    SetRole,
    Shutdown,
    Submit,
    TokensOut,
    WorkerFailed,
    WorkerReady,
)

MAX_REMEMBERED_ABORTS = 4096


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    node_id: int
    role: Role
    executor: ExecutorSpec
    num_blocks: int
    block_size: int
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_prefill_chunk_tokens: int | None = None
    allocation: Allocation = Allocation.PROMPT
    """When a prefill gets its KV blocks (`core.allocation`)."""
    eviction: EvictionPolicy | None = None
    stats_interval_s: float = 0.05
    check_integrity: bool = False
    """Debug: run the scheduler's integrity check after every step."""
    prefix_pull_timeout_s: float = 1.0
    """How long a prefill waits for a pulled prefix before computing it (the holder died
    or is slow)."""


class _Job:
    """A request's token ids on this node."""

    __slots__ = ("decode_node", "generation", "num_preemptions", "seq", "src_node", "tokens")

    def __init__(self, generation: Generation, decode_node: int) -> None:
        self.generation = generation
        self.decode_node = decode_node
        self.tokens: list[int] = list(generation.prompt_ids)
        self.seq: Sequence | None = None
        self.src_node: int | None = None
        self.num_preemptions = 0

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.generation.prompt_ids) :]


@dataclass(slots=True)
class _PendingPull:
    """A submitted prefill waiting for the prefix blocks it asked another node for."""

    submit: Submit
    hashes: tuple[int, ...]
    """The blocks asked for: the prompt's, after those this node held."""
    num_uncached_tokens: int
    deadline_s: float


class NodeWorker:
    def __init__(
        self,
        spec: WorkerSpec,
        executor: Executor,
        inbox: Any,
        outbox: Any,
        peers: list[Any],
        clock: Any = time.monotonic,
    ) -> None:
        self.spec = spec
        self.node_id = spec.node_id
        self.executor = executor
        self.inbox = inbox
        self.outbox = outbox
        self.peers = peers
        self.clock = clock
        pool = KVPool(spec.num_blocks, 0, spec.eviction)
        cfg = SchedulerConfig(
            spec.block_size,
            spec.max_num_batched_tokens,
            spec.max_num_seqs,
            spec.max_prefill_chunk_tokens,
            spec.allocation,
        )
        self.sched = NodeScheduler(spec.node_id, pool, cfg, spec.role)
        self.jobs: dict[int, _Job] = {}
        self.pending_incoming: deque[int] = deque()
        self._incoming_requests: dict[int, Request] = {}
        self._pulling: dict[int, _PendingPull] = {}
        self.num_prefix_pulls = 0
        self.num_prefix_blocks_pulled = 0
        self._aborted: set[int] = set()
        self._aborted_order: deque[int] = deque()
        self._pending_out: list[Any] = []
        self._last_submit_seq = 0
        self._last_control_seq = 0
        self._num_steps = 0
        self._busy_s = 0.0
        self._last_step_s = 0.0
        self._stop = False
        self._restart_role: Role | None = None
        self._cold_start_s = 0.0
        self._ready_at: float | None = None
        self._next_stats_s = 0.0
        self._has_work = False

    # -- loop ------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Leave the loop after the current step (SIGTERM)."""
        self._stop = True

    def run(self) -> None:
        parent = multiprocessing.parent_process()
        while not self._stop:
            self._drain(block=not self._has_work)
            if self._stop:
                break
            self._expire_pulls()
            self._has_work = self.step()
            self._maybe_restart()
            self._publish(force=False)
            self._flush()
            if parent is not None and not self._has_work and not parent.is_alive():
                break

    def _drain(self, block: bool) -> None:
        timeout = self.spec.stats_interval_s
        while True:
            try:
                msg = self.inbox.get(timeout=timeout) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            self.handle(msg)
            block = False  # after the first message, take only what is already there

    def _send(self, msg: Any) -> None:
        self._pending_out.append(msg)

    def _flush(self) -> None:
        if self._pending_out:
            self.outbox.put(self._pending_out)
            self._pending_out = []

    # -- messages --------------------------------------------------------------------------
    def handle(self, msg: Any) -> None:
        if isinstance(msg, Submit):
            self._on_submit(msg)
        elif isinstance(msg, Abort):
            self._on_abort(msg.request_id)
        elif isinstance(msg, HandoffOffer):
            self._on_handoff_offer(msg)
        elif isinstance(msg, KVPull):
            self._on_kv_pull(msg)
        elif isinstance(msg, KVPayload):
            if msg.request_id in self._pulling:
                self._on_prefix_payload(msg)
            else:
                self._on_kv_payload(msg)
        elif isinstance(msg, PrefixPull):
            self._on_prefix_pull(msg)
        elif isinstance(msg, HandoffCancel):
            if msg.request_id in self.sched.handoff:
                self.sched.abort(msg.request_id)
                self.jobs.pop(msg.request_id, None)
        elif isinstance(msg, SetRole):
            self._on_set_role(msg)
        elif isinstance(msg, ApplyKV):
            self._on_apply_kv(msg)
        elif isinstance(msg, SetBlockScores):
            eviction = self.sched.pool.eviction
            if isinstance(eviction, ScoreSink):  # else the node runs a strategy that scores
                eviction.set_scores(msg.score, msg.hashes)  # nothing (LRU): ignore
        elif isinstance(msg, CheckIntegrity):
            self._on_check(msg.token)
        elif isinstance(msg, Shutdown):
            self._stop = True
        else:
            raise TypeError(f"unknown message {type(msg).__name__}")
        self._has_work = True

    def _on_submit(self, msg: Submit) -> None:
        self._last_submit_seq = max(self._last_submit_seq, msg.submit_seq)
        self.jobs[msg.request.request_id] = _Job(msg.generation, msg.decode_node)
        src = msg.pull_from
        if src is None or src == self.node_id or not 0 <= src < len(self.peers):
            self._admit(msg)
            return
        hashes = msg.request.prompt_hashes
        have = self.sched.pool.match_prefix(hashes).num_device_blocks
        if have >= len(hashes):
            self._admit(msg)
            return
        rid = msg.request.request_id
        uncached = max(0, msg.request.num_prompt_tokens - have * self.sched.block_size)
        deadline_s = self.clock() + self.spec.prefix_pull_timeout_s
        self._pulling[rid] = _PendingPull(msg, hashes[have:], uncached, deadline_s)
        self.peers[src].put(PrefixPull(self.node_id, rid, hashes[have:]))

    def _admit(self, msg: Submit) -> None:
        """Queue a submitted request's prefill (with whatever prefix is cached here now)."""
        job = self.jobs[msg.request.request_id]
        decode_here = msg.decode_node == self.node_id
        job.seq = self.sched.enqueue_prefill(msg.request, decode_here=decode_here)

    def _on_abort(self, rid: int) -> None:
        job = self.jobs.pop(rid, None)
        if job is None:
            self._remember_abort(rid)  # its handoff offer may still be on the way
            return
        if self._pulling.pop(rid, None) is not None:
            return  # never queued; a late payload finds no pull and is dropped
        if rid in self.pending_incoming:
            self.pending_incoming.remove(rid)
            del self._incoming_requests[rid]
        self.sched.abort(rid)

    def _remember_abort(self, rid: int) -> None:
        self._aborted.add(rid)
        self._aborted_order.append(rid)
        if len(self._aborted_order) > MAX_REMEMBERED_ABORTS:
            self._aborted.discard(self._aborted_order.popleft())

    def _on_set_role(self, msg: SetRole) -> None:
        self._last_control_seq = max(self._last_control_seq, msg.control_seq)
        if msg.restart:
            self.sched.is_serving = False
            self._restart_role = msg.role
            self._cold_start_s = msg.cold_start_s
        else:
            self.sched.set_role(msg.role)
        self._publish(force=True)

    def _maybe_restart(self) -> None:
        """Dynamo-style restart: once drained, lose the KV, wait the cold start, serve."""
        if self._restart_role is None:
            return
        now = self.clock()
        if self._ready_at is None:
            if not self.sched.is_idle or self.pending_incoming or self._pulling:
                return
            self.sched.pool.clear()
            self._ready_at = now + self._cold_start_s
        if now >= self._ready_at:
            self.sched.set_role(self._restart_role)
            self.sched.is_serving = True
            self._restart_role = None
            self._ready_at = None
            self._publish(force=True)

    def _on_apply_kv(self, msg: ApplyKV) -> None:
        pool = self.sched.pool
        if msg.kind is KVActionKind.DROP:
            pool.drop(msg.hashes)
        elif msg.kind is KVActionKind.OFFLOAD:
            pool.offload(msg.hashes)
        else:
            pool.prefetch(msg.hashes)

    def _on_check(self, token: int) -> None:
        try:
            self.sched.check_integrity()
            ok, message = True, ""
        except AssertionError as exc:
            ok, message = False, str(exc)
        self._send(
            IntegrityReport(
                self.node_id,
                token,
                ok,
                message,
                self.sched.pool.num_used_blocks,
                self.sched.is_idle and not self.pending_incoming and not self._pulling,
            )
        )

    # -- disaggregation --------------------------------------------------------------------
    def _on_handoff_offer(self, msg: HandoffOffer) -> None:
        rid = msg.request.request_id
        if rid in self._aborted:
            self._aborted.discard(rid)
            self.peers[msg.src_node].put(HandoffCancel(rid))
            return
        job = _Job(msg.generation, self.node_id)
        job.tokens.extend(msg.generated_ids)
        job.src_node = msg.src_node
        self.jobs[rid] = job
        self._incoming_requests[rid] = msg.request
        self.pending_incoming.append(rid)
        self._retry_incoming()

    def _retry_incoming(self) -> None:
        """Reserve blocks for offered handoffs, in order, and pull their KV."""
        bs = self.sched.block_size
        while self.pending_incoming:
            rid = self.pending_incoming[0]
            job = self.jobs[rid]
            request = self._incoming_requests[rid]
            num_blocks = self.sched.try_reserve_incoming(request, len(job.generated))
            if num_blocks is None:
                return
            self.pending_incoming.popleft()
            del self._incoming_requests[rid]
            seq = self.sched.incoming[rid]
            job.seq = seq
            first = num_blocks_for(seq.num_computed_tokens, bs) - num_blocks
            assert job.src_node is not None
            self.peers[job.src_node].put(KVPull(self.node_id, rid, first, num_blocks))

    def _on_kv_pull(self, msg: KVPull) -> None:
        seq = self.sched.handoff.get(msg.request_id)
        if seq is None:
            self.peers[msg.dst_node].put(KVPayload(self.node_id, msg.request_id, 0, None))
            return
        ids = seq.block_ids[msg.first_block : msg.first_block + msg.num_blocks]
        data = self.executor.read_blocks(ids).tobytes() if ids else b""
        self.peers[msg.dst_node].put(KVPayload(self.node_id, msg.request_id, msg.first_block, data))
        self.sched.release_handoff(msg.request_id)
        self.jobs.pop(msg.request_id, None)

    def _on_kv_payload(self, msg: KVPayload) -> None:
        rid = msg.request_id
        seq = self.sched.incoming.get(rid)
        job = self.jobs.get(rid)
        if seq is None or job is None:
            return  # aborted while the bytes were on the way
        if msg.data is None:
            self.sched.abort(rid)
            self.jobs.pop(rid)
            self._send(RequestFailed(self.node_id, rid, f"node {msg.src_node} lost the KV"))
            return
        bs = self.sched.block_size
        num_blocks = len(msg.data) // max(1, bs * self.executor.kv_bytes_per_token)
        if num_blocks:
            ids = seq.block_ids[msg.first_block : msg.first_block + num_blocks]
            self.executor.write_blocks(ids, msg.data)
        self.sched.accept_incoming(rid)
        self._send(
            TokensOut(self.node_id, rid, tuple(job.generated), num_transfer_bytes=len(msg.data))
        )

    # -- prefix pulls ----------------------------------------------------------------------
    def _on_prefix_pull(self, msg: PrefixPull) -> None:
        """Send the leading blocks of `msg.hashes` held on device here (maybe none)."""
        pool = self.sched.pool
        num_held = pool.match_prefix(msg.hashes).num_device_blocks
        block_ids = _indexed_blocks(pool, msg.hashes[:num_held])
        data = self.executor.read_blocks(block_ids).tobytes() if block_ids else b""
        self.peers[msg.dst_node].put(KVPayload(self.node_id, msg.request_id, 0, data))

    def _on_prefix_payload(self, msg: KVPayload) -> None:
        """Install the pulled blocks as cached here, then queue the waiting prefill."""
        pending = self._pulling.pop(msg.request_id)
        data = msg.data or b""
        block_bytes = self.sched.block_size * self.executor.kv_bytes_per_token
        num_blocks = min(len(data) // block_bytes, len(pending.hashes))
        num_installed = self._install_prefix(pending.hashes[:num_blocks], data, block_bytes)
        self.num_prefix_pulls += 1
        self.num_prefix_blocks_pulled += num_installed
        if data:
            n = len(data)
            self._send(
                TokensOut(
                    self.node_id, msg.request_id, (), num_transfer_bytes=n, num_pulled_bytes=n
                )
            )
        self._admit(pending.submit)

    def _install_prefix(self, hashes: tuple[int, ...], data: bytes, block_bytes: int) -> int:
        """Write received blocks into this node's pool as cached, unused blocks: those not
        held here already, as many as fit. Returns how many were installed."""
        pool = self.sched.pool
        missing = [i for i, h in enumerate(hashes) if not pool.holds(h)]
        num_installed = pool.import_cached(hashes)
        installed = missing[:num_installed]
        if not installed:
            return 0
        block_ids = _indexed_blocks(pool, [hashes[i] for i in installed])
        view = memoryview(data)
        parts = [view[i * block_bytes : (i + 1) * block_bytes] for i in installed]
        self.executor.write_blocks(block_ids, b"".join(parts))
        return num_installed

    def _expire_pulls(self) -> None:
        """Queue the prefills whose prefix has not arrived in time; they compute it."""
        if not self._pulling:
            return
        now = self.clock()
        for rid, pending in list(self._pulling.items()):
            if now >= pending.deadline_s:
                del self._pulling[rid]
                self._admit(pending.submit)
                self._has_work = True

    # -- stepping --------------------------------------------------------------------------
    def step(self) -> bool:
        """Plan and run one step; False when there was nothing to run."""
        plan = self.sched.schedule()
        if plan is None:
            return False
        for seq in plan.preempted:
            self.jobs[seq.seq_id].num_preemptions += 1
        if not plan.chunks and not plan.decodes:
            return True
        works = self._works(plan)
        start = time.perf_counter()
        try:
            sampled = self.executor.execute(works, self._shape(plan))
        except Exception as exc:  # a model error fails the step's requests, not the node
            self._fail_plan(plan, f"executor error: {exc!r}")
            return True
        self._last_step_s = time.perf_counter() - start
        self._busy_s += self._last_step_s
        self._num_steps += 1
        stopped: set[int] = set()
        new_tokens: dict[int, int] = {}
        for seq_id, token in sampled.items():
            job = self.jobs[seq_id]
            if token in job.generation.stop_token_ids:
                stopped.add(seq_id)
            else:
                job.tokens.append(token)
                new_tokens[seq_id] = token
                assert job.seq is not None
                self._extend_hashes(job.seq, job.tokens)
        out = self.sched.complete_step(plan, frozenset(stopped))
        self._emit(plan, out, new_tokens, stopped)
        if self.spec.check_integrity:
            self.sched.check_integrity()
        self._retry_incoming()
        return True

    def _works(self, plan: StepPlan) -> list[WorkItem]:
        works: list[WorkItem] = []
        for chunk in plan.chunks:
            job = self.jobs[chunk.seq.seq_id]
            start = chunk.num_context_tokens
            tokens = tuple(job.tokens[start : start + chunk.num_new_tokens])
            works.append(
                WorkItem(
                    chunk.seq.seq_id,
                    tokens,
                    start,
                    tuple(chunk.seq.block_ids),
                    chunk.completes_prefill,
                    job.generation.sampling,
                )
            )
        for seq in plan.decodes:
            job = self.jobs[seq.seq_id]
            works.append(
                WorkItem(
                    seq.seq_id,
                    (job.tokens[-1],),
                    seq.num_computed_tokens,
                    tuple(seq.block_ids),
                    True,
                    job.generation.sampling,
                )
            )
        return works

    def _shape(self, plan: StepPlan) -> BatchShape:
        return BatchShape(
            prefill_chunks=tuple(
                PrefillChunk(c.num_new_tokens, c.num_context_tokens) for c in plan.chunks
            ),
            num_decode_seqs=len(plan.decodes),
            num_decode_context_tokens=sum(s.num_computed_tokens + 1 for s in plan.decodes),
            num_kv_tokens_in_use=self.sched.pool.num_used_blocks * self.sched.block_size,
        )

    def _extend_hashes(self, seq: Sequence, tokens: list[int]) -> None:
        """Append the chained hash of every block the known tokens now fill."""
        bs = self.sched.block_size
        prompt = seq.request.prompt_hashes
        known = len(prompt) + len(seq.output_hashes)
        while (known + 1) * bs <= len(tokens):
            if seq.output_hashes:
                parent = seq.output_hashes[-1]
            else:
                parent = prompt[-1] if prompt else ROOT_HASH
            block = tuple(tokens[known * bs : (known + 1) * bs])
            seq.output_hashes.append(chain_hash(parent, block))
            known += 1

    def _emit(
        self, plan: StepPlan, out: StepOutcome, new_tokens: dict[int, int], stopped: set[int]
    ) -> None:
        handed_off = {s.seq_id for s in out.handoffs}
        finished = {s.seq_id: s for s in out.finished}
        first_prefill = {s.seq_id: s for s in out.prefilled if s.num_generated == 1}
        touched = [c.seq for c in plan.chunks if c.completes_prefill] + list(plan.decodes)
        for seq in touched:
            rid = seq.seq_id
            job = self.jobs[rid]
            cached = seq.num_cached_tokens if rid in first_prefill else None
            if rid in handed_off:
                # the decode node streams the first token once the KV has arrived
                self._send(TokensOut(self.node_id, rid, (), num_cached_tokens=cached))
                self._offer(seq, job)
                continue
            tokens = (new_tokens[rid],) if rid in new_tokens else ()
            finish = None
            if rid in finished:
                finish = FinishReason.STOP if rid in stopped else FinishReason.LENGTH
                del self.jobs[rid]
            self._send(
                TokensOut(
                    self.node_id,
                    rid,
                    tokens,
                    finish,
                    num_cached_tokens=cached,
                    num_preemptions=job.num_preemptions,
                )
            )

    def _offer(self, seq: Sequence, job: _Job) -> None:
        req = seq.request
        request = Request(
            req.request_id,
            req.prompt_hashes,
            req.num_prompt_tokens,
            req.max_output_tokens,
            tuple(seq.output_hashes),
            req.hints,
        )
        offer = HandoffOffer(self.node_id, request, job.generation, tuple(job.generated))
        self.peers[job.decode_node].put(offer)

    def _fail_plan(self, plan: StepPlan, message: str) -> None:
        rids = [c.seq.seq_id for c in plan.chunks] + [s.seq_id for s in plan.decodes]
        for rid in rids:
            self.sched.abort(rid)
            self.jobs.pop(rid, None)
            self._send(RequestFailed(self.node_id, rid, message))

    # -- stats -----------------------------------------------------------------------------
    def _publish(self, force: bool) -> None:
        now = self.clock()
        if not force and now < self._next_stats_s:
            return
        self._next_stats_s = now + self.spec.stats_interval_s
        self._send(self.stats())

    def stats(self) -> NodeStats:
        s = self.sched
        return NodeStats(
            node_id=self.node_id,
            role=s.role,
            is_serving=s.is_serving,
            block_size=s.block_size,
            num_device_blocks=s.num_device_blocks,
            num_free_blocks=s.num_free_blocks,
            num_used_blocks=s.num_used_blocks,
            num_waiting_prefill_tokens=s.num_waiting_prefill_tokens
            + sum(p.num_uncached_tokens for p in self._pulling.values()),
            num_waiting_requests=s.num_waiting_requests + len(self._pulling),
            num_running_decodes=s.num_running_decodes,
            num_decode_blocks=s.num_decode_blocks,
            num_decode_context_tokens=s.num_decode_context_tokens,
            cached_hashes=frozenset(s.pool.cached_hashes()),
            last_submit_seq=self._last_submit_seq,
            last_control_seq=self._last_control_seq,
            num_prompt_tokens_seen=s.num_prompt_tokens_seen,
            num_prompt_tokens_cached=s.num_prompt_tokens_cached,
            num_preemptions=s.num_preemptions,
            num_steps=self._num_steps,
            num_pending_incoming=len(self.pending_incoming),
            busy_s=self._busy_s,
            last_step_s=self._last_step_s,
        )


def _indexed_blocks(pool: KVPool, hashes: Iterable[int]) -> list[int]:
    """The block ids holding `hashes`, each of which the pool is known to hold."""
    block_ids: list[int] = []
    for block_hash in hashes:
        block_id = pool.block_of(block_hash)
        assert block_id is not None, f"block {block_hash:#x} is not held"
        block_ids.append(block_id)
    return block_ids


def worker_main(spec: WorkerSpec, links: NodeLinks) -> None:
    """Process entry point (spawn): build the executor, report ready, serve until told to
    stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the frontend, which stops us
    outbox = links.outbox
    inbox, peers = node_mailbox(links)
    try:
        executor = build_executor(spec.executor, spec.num_blocks, spec.block_size)
        worker = NodeWorker(spec, executor, inbox, outbox, peers)
        signal.signal(signal.SIGTERM, lambda signum, frame: worker.request_stop())
        vocab = int(getattr(executor, "vocab_size", spec.executor.vocab_size))
        outbox.put(
            [
                WorkerReady(
                    spec.node_id,
                    spec.num_blocks,
                    spec.block_size,
                    executor.kv_bytes_per_token,
                    vocab,
                ),
                worker.stats(),
            ]
        )
        worker.run()
    except Exception:
        outbox.put([WorkerFailed(spec.node_id, traceback.format_exc())])
        raise
