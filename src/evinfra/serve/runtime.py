"""The `local` runtime: node worker processes on this machine, driven from an asyncio
frontend through the same policies the simulator runs.

The frontend routes each request with the bundle's router over views built from the
workers' snapshots, runs the planner every `interval_s` and applies its role changes, and
applies the KV manager's actions. Workers stream token ids back; a request's events reach
its caller through an asyncio queue. A worker that dies is noticed through its process
sentinel: its requests are resent to another node if nothing was streamed yet, else failed.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_sentinels
from typing import Any

from evinfra.core.allocation import Allocation
from evinfra.core.blocks import hash_token_blocks
from evinfra.core.eviction import LRUEviction
from evinfra.core.types import AgentHints, Request, Role, RoleChange, SwitchMode
from evinfra.costmodel.base import CostModel
from evinfra.policy.base import KVAction, RequestArrived, ScoreBlocks
from evinfra.policy.bundle import ClusterShape, SystemBundle, available_systems, make_system
from evinfra.policy.published import ScoreSink
from evinfra.serve.executors import ExecutorSpec
from evinfra.serve.links import LocalLinks
from evinfra.serve.metrics import ServerMetrics
from evinfra.serve.protocol import (
    Abort,
    CheckIntegrity,
    Generation,
    IntegrityReport,
    NodeStats,
    RequestFailed,
    Sampling,
    SetRole,
    Shutdown,
    Submit,
    TokensOut,
    WorkerFailed,
    WorkerReady,
    kv_messages,
)
from evinfra.serve.requests import LiveRequest, RequestHandle, StreamEvent, finished_observation
from evinfra.serve.view import ClusterState, NodeState
from evinfra.serve.worker import WorkerSpec, worker_main

log = logging.getLogger(__name__)
GREEDY = Sampling()

DEFAULT_SYSTEMS = ("evolving", "aggregated", "least-loaded")
"""`--system` default: the first of these that is registered (evolving, once it lands)."""
LOCAL_TRANSFER_OVERHEAD_S = 2e-4
LOCAL_TRANSFER_BYTES_S = 1e9
"""A worker-to-worker pipe on one machine, as the policies' cluster shape describes it."""


def local_transfer_time_s(num_bytes: int) -> float:
    return LOCAL_TRANSFER_OVERHEAD_S + num_bytes / LOCAL_TRANSFER_BYTES_S


def default_system() -> str:
    known = available_systems()
    return next(name for name in DEFAULT_SYSTEMS if name in known)


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    executor: ExecutorSpec
    num_nodes: int = 2
    system: str | None = None
    """None: `default_system()`."""
    system_options: dict[str, object] = field(default_factory=dict)
    num_blocks: int = 512
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_prefill_chunk_tokens: int | None = None
    allocation: Allocation = Allocation.PROMPT
    """When a prefill gets its KV blocks (`core.allocation`)."""
    stats_interval_s: float = 0.05
    kv_tick_s: float = 1.0
    check_integrity: bool = False
    ready_timeout_s: float = 300.0
    max_retries: int = 1
    """Times a request is resent after its node died before streaming anything."""
    kv_bytes_per_token: int = 0
    """For the bundle's cluster shape (0: unknown)."""
    cost_model: CostModel | None = None
    """A node's step-time model, for the policies that predict latency."""

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError("num_nodes must be >= 1")


class LocalCluster:
    """Node workers plus the policies that drive them. Call from one asyncio loop.

    A runtime that puts nodes or policies elsewhere subclasses it, keeping routing, views,
    request bookkeeping and metrics, through this protected interface. Nodes: override
    `_start_nodes`, `_stop_nodes`; build nodes from `_worker_spec`; fill `nodes`,
    `_inboxes` (node i's `put(msg)`), `_pids`; feed the loop with `_deliver_from_thread`,
    `_report_death_from_thread` (`_spawn_thread` threads end once `_stopping` is set).
    Failures: override `_on_node_death`; use `_live`, `_fail`, `_retry`, `_resubmit`,
    `_take_rid`. Policies: override `_policies_on_arrival`, `_policies_on_finish`,
    `_policies_on_tick`, `_plan`, `_start_policy_loops`; apply with `_apply_kv`."""

    def __init__(self, config: ClusterConfig, now: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.system = config.system or default_system()
        self._now = now
        self._t0 = now()
        shape = ClusterShape(
            num_nodes=config.num_nodes, block_size=config.block_size,
            num_device_blocks_per_node=config.num_blocks, num_host_blocks_per_node=0,
            kv_bytes_per_token=config.kv_bytes_per_token,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs, cost_model=config.cost_model,
            transfer_time_s=local_transfer_time_s,
            can_pull_prefix=True,  # a prefill pulls a held prefix (`Submit.pull_from`)
            eviction_in_process=False,  # each node's strategy is pickled into its worker
        )  # fmt: skip
        self.bundle: SystemBundle = make_system(self.system, shape, dict(config.system_options))
        if len(self.bundle.initial_roles) != config.num_nodes:
            raise ValueError(f"system {self.system} gave {len(self.bundle.initial_roles)} roles")
        self.metrics = ServerMetrics()
        self.nodes: list[NodeState] = []
        self.view = ClusterState(self.nodes)
        self._live: dict[int, LiveRequest] = {}
        self._next_rid = 1
        self._procs: list[Any] = []
        self._pids: list[int] = []
        self._links: LocalLinks | None = None
        self._inboxes: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: dict[int, WorkerReady] = {}
        self._first_stats: dict[int, NodeStats] = {}
        self._ready_event = asyncio.Event()
        self._start_error: str | None = None
        self._integrity: dict[int, asyncio.Future[IntegrityReport]] = {}
        self._next_token = 1
        self._tasks: list[asyncio.Task[None]] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._closing = False
        self.started = False

    def now_s(self) -> float:
        return self._now() - self._t0

    # -- lifecycle -------------------------------------------------------------------------
    def _worker_spec(self, node_id: int, role: Role) -> WorkerSpec:
        """What node `node_id` needs to start (the same for local processes and Ray actors)."""
        cfg = self.config
        return WorkerSpec(
            node_id=node_id,
            role=role,
            executor=cfg.executor,
            num_blocks=cfg.num_blocks,
            block_size=cfg.block_size,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            max_prefill_chunk_tokens=cfg.max_prefill_chunk_tokens,
            allocation=cfg.allocation,
            eviction=_picklable_eviction(self.bundle, node_id),
            stats_interval_s=cfg.stats_interval_s,
            check_integrity=cfg.check_integrity,
        )

    async def start(self) -> None:
        """Start the nodes, wait until each has built its executor, start the policy loops."""
        self._loop = asyncio.get_running_loop()
        await self._start_nodes()
        self._start_policy_loops()
        self.started = True

    async def _start_nodes(self) -> None:
        """Start a node per initial role; return once `nodes` has each one's state (else
        stop them and raise RuntimeError). Here: processes, watched and read on threads."""
        ctx = multiprocessing.get_context("spawn")
        cfg = self.config
        self._links = links = LocalLinks(ctx, cfg.num_nodes)
        self._inboxes = links.inboxes
        for i, role in enumerate(self.bundle.initial_roles):
            spec = self._worker_spec(i, role)
            proc = ctx.Process(
                target=worker_main,
                args=(spec, links.for_node(i)),
                name=f"evinfra-node-{i}",
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)
        # late-bound, so a subclass's (or a test's) `_deliver_from_thread` is the one used
        links.start_readers(lambda batch: self._deliver_from_thread(batch))
        self._spawn_thread(self._watch_processes, "evinfra-sentinels")
        try:
            await asyncio.wait_for(self._ready_event.wait(), cfg.ready_timeout_s)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"workers not ready after {cfg.ready_timeout_s} s") from None
        if self._start_error is not None:
            await self.stop()
            raise RuntimeError(f"a worker failed to start:\n{self._start_error}")

    def _start_policy_loops(self) -> None:
        if self.bundle.planner is not None:
            self._tasks.append(asyncio.create_task(self._plan_loop()))
        self._tasks.append(asyncio.create_task(self._kv_tick_loop()))

    def _spawn_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the policy loops, fail what is in flight, stop the nodes."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for live in list(self._live.values()):
            self._fail(live, "server shutting down")
        await self._stop_nodes(timeout_s)
        self.started = False

    async def _stop_nodes(self, timeout_s: float) -> None:
        """Ask each worker to stop, wait for it, kill it if it does not exit in time."""
        for inbox, proc in zip(self._inboxes, self._procs, strict=True):
            if proc.is_alive():
                inbox.put(Shutdown())
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            await asyncio.to_thread(proc.join, max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5.0)
        self._stopping.set()
        if self._links is not None:  # wakes the readers of the nodes that exited
            await asyncio.to_thread(self._links.close, [n.alive for n in self.nodes], 5.0)
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 5.0)
        # dropping the queues (the process objects hold them too) releases their
        # semaphores now rather than leaving them to the resource tracker at exit
        self._pids = [int(p.pid) for p in self._procs]
        self._links = None
        self._inboxes = []
        self._procs = []

    @property
    def worker_pids(self) -> list[int]:
        return [int(p.pid) for p in self._procs] if self._procs else list(self._pids)

    @property
    def is_ready(self) -> bool:
        return self.started and any(n.alive for n in self.nodes)

    # -- threads -> loop -------------------------------------------------------------------
    def _watch_processes(self) -> None:
        pending = {p.sentinel: i for i, p in enumerate(self._procs)}
        while pending and not self._stopping.is_set():
            for sentinel in wait_sentinels(list(pending), timeout=0.5):
                node_id = pending.pop(sentinel)
                self._procs[node_id].join(1.0)  # reap it, so its exit code is known
                if not self._stopping.is_set():
                    reason = f"exit code {self._procs[node_id].exitcode}"
                    self._report_death_from_thread(node_id, reason)

    def _deliver_from_thread(self, batch: list[Any]) -> None:
        """Hand a batch of a node's messages to the frontend's loop (from any thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._dispatch_batch, batch)

    def _report_death_from_thread(self, node_id: int, reason: str) -> None:
        """Tell the frontend's loop that node `node_id` died (from any thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._on_node_death, node_id, reason)

    def _dispatch_batch(self, batch: list[Any]) -> None:
        for msg in batch:
            try:
                self._dispatch(msg)
            except Exception:
                log.exception("error handling %r", msg)

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, TokensOut):
            self._on_tokens(msg)
        elif isinstance(msg, NodeStats):
            if msg.node_id < len(self.nodes):
                self.nodes[msg.node_id].update(msg, self.now_s())
        elif isinstance(msg, RequestFailed):
            live = self._live.get(msg.request_id)
            if live is not None:
                self._fail(live, msg.message)
        elif isinstance(msg, IntegrityReport):
            fut = self._integrity.pop(msg.token, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, WorkerReady):
            self._ready[msg.node_id] = msg
        elif isinstance(msg, WorkerFailed):
            self._start_error = f"node {msg.node_id}: {msg.message}"
            self._ready_event.set()
        self._check_ready(msg)

    def _check_ready(self, msg: Any) -> None:
        if self.nodes or not isinstance(msg, NodeStats):
            return
        # the first snapshots arrive right after each WorkerReady
        self._first_stats[msg.node_id] = msg
        if len(self._first_stats) == self.config.num_nodes:
            self.nodes.extend(NodeState(i, self._first_stats[i]) for i in range(len(self._procs)))
            self._ready_event.set()

    # -- requests --------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        stop_token_ids: frozenset[int] = frozenset(),
        sampling: Sampling = GREEDY,
        hints: AgentHints | None = None,
    ) -> RequestHandle:
        """Route and submit one request; its events arrive on the returned handle."""
        if not self.started:
            raise RuntimeError("cluster not started")
        self.metrics.num_requests += 1
        rid = self._take_rid()
        request = Request(
            request_id=rid,
            prompt_hashes=tuple(hash_token_blocks(prompt_ids, self.config.block_size)),
            num_prompt_tokens=len(prompt_ids),
            max_output_tokens=max_tokens,
            hints=hints,
        )
        generation = Generation(tuple(prompt_ids), stop_token_ids, sampling)
        handle = RequestHandle(rid, len(prompt_ids), self._abort_handle)
        live = LiveRequest(request, generation, handle, arrival_s=self.now_s())
        self._policies_on_arrival(request, self.now_s())
        self._submit(live)
        return handle

    def _post(self, node_id: int, msg: Any) -> None:
        """Put a message in a live node's inbox (dropped once the node or cluster is gone)."""
        if node_id < len(self._inboxes) and self.nodes[node_id].alive:
            self._inboxes[node_id].put(msg)

    def _take_rid(self) -> int:
        rid = self._next_rid
        self._next_rid += 1
        return rid

    def _submit(self, live: LiveRequest) -> None:
        try:
            route = self.bundle.router.route(live.request, self.view, self.now_s())
        except RuntimeError as exc:
            self._fail(live, f"no node can take the request: {exc}")
            return
        for node_id in (route.prefill_node, route.decode_node):
            if not 0 <= node_id < len(self.nodes) or not self.nodes[node_id].alive:
                self._fail(live, f"router {self.system} chose unusable node {node_id}")
                return
        live.route = route
        self._live[live.request.request_id] = live
        prefill = self.nodes[route.prefill_node]
        hashes = live.request.prompt_hashes
        num_cached = prefill.match_prefix(hashes).num_blocks
        pull_from = route.pull_from_node
        if pull_from == route.prefill_node or (
            pull_from is not None
            and not (0 <= pull_from < len(self.nodes) and self.nodes[pull_from].alive)
        ):
            pull_from = None  # nothing to pull from itself; an unknown node: compute it
        if pull_from is not None:
            self.metrics.num_prefix_pulls += 1
            num_cached = max(num_cached, self.nodes[pull_from].match_prefix(hashes).num_blocks)
        uncached = max(0, live.request.num_prompt_tokens - num_cached * prefill.block_size)
        seq = prefill.record_submit(live.request.request_id, uncached)
        if route.is_disaggregated:
            decode = self.nodes[route.decode_node]
            decode.incoming[live.request.request_id] = decode.blocks_for(
                live.request.num_prompt_tokens + 1
            )
        self._post(
            route.prefill_node,
            Submit(live.request, live.generation, route.decode_node, seq, pull_from),
        )

    def _on_tokens(self, msg: TokensOut) -> None:
        live = self._live.get(msg.request_id)
        if live is None:
            return
        now = self.now_s()
        # the handle sees the counts as they come: a response cut by a stop string is
        # answered before the request finishes here
        if msg.num_cached_tokens is not None:
            live.num_cached_tokens = msg.num_cached_tokens
            live.handle.num_cached_tokens = msg.num_cached_tokens
        if msg.num_transfer_bytes:
            live.handle.num_transfer_bytes += msg.num_transfer_bytes
            live.handle.num_pulled_bytes += msg.num_pulled_bytes
            self.metrics.num_kv_bytes_moved += msg.num_transfer_bytes
            self.metrics.num_kv_bytes_pulled += msg.num_pulled_bytes
        if msg.token_ids:
            self._clear_incoming(live)
            for _ in msg.token_ids:
                if live.first_token_s is None:
                    live.first_token_s = now
                    self.metrics.ttft_s.observe(now - live.arrival_s)
                elif live.last_token_s is not None:
                    self.metrics.itl_s.observe(now - live.last_token_s)
                live.last_token_s = now
            live.num_output_tokens += len(msg.token_ids)
            self.metrics.num_output_tokens += len(msg.token_ids)
        if msg.token_ids or msg.finish is not None:
            # a message with neither (a hand-off's cached-token count) is bookkeeping:
            # streaming it as an empty chunk would look like a first token to clients
            live.handle.push(StreamEvent(msg.token_ids, msg.finish))
        if msg.finish is not None:
            self._finish(live, msg.node_id, now)

    def _finish(self, live: LiveRequest, node_id: int, now: float) -> None:
        del self._live[live.request.request_id]
        self._clear_incoming(live)
        self.metrics.num_finished += 1
        self.metrics.num_prompt_tokens += live.request.num_prompt_tokens
        self.metrics.num_cached_prompt_tokens += live.num_cached_tokens
        self.metrics.e2e_s.observe(now - live.arrival_s)
        self._policies_on_finish(live, node_id, now)

    def _clear_incoming(self, live: LiveRequest) -> None:
        if live.route is not None:
            self.nodes[live.route.decode_node].incoming.pop(live.request.request_id, None)

    def _fail(self, live: LiveRequest, message: str) -> None:
        rid = live.request.request_id
        self._live.pop(rid, None)
        self._clear_incoming(live)
        self._abort_on_nodes(live)
        self.metrics.num_failed += 1
        live.handle.push(StreamEvent((), None, error=message))

    def _abort_on_nodes(self, live: LiveRequest) -> None:
        if live.route is None:
            return
        for node_id in {live.route.prefill_node, live.route.decode_node}:
            self._post(node_id, Abort(live.request.request_id))

    def _abort_handle(self, handle: RequestHandle) -> None:
        """The client went away: drop the request on its nodes (frees its KV)."""
        live = self._live.pop(handle.request_id, None)
        if live is None:
            return
        self._clear_incoming(live)
        self.metrics.num_aborted += 1
        self._abort_on_nodes(live)

    def _on_node_death(self, node_id: int, reason: str) -> None:
        """A node died: resend what it was serving that streamed nothing, fail the rest."""
        if self._closing:
            return
        node = self.nodes[node_id] if node_id < len(self.nodes) else None
        message = f"node {node_id} died ({reason})"
        log.warning(message)
        if node is None:  # during start-up
            self._start_error = message
            self._ready_event.set()
            return
        node.alive = False
        self.metrics.num_node_failures += 1
        for live in list(self._live.values()):
            route = live.route
            if route is None or node_id not in (route.prefill_node, route.decode_node):
                continue
            if live.num_output_tokens == 0 and live.num_retries < self.config.max_retries:
                self._retry(live)
            else:
                self._fail(live, message)

    def _retry(self, live: LiveRequest) -> None:
        """Send `live` again from the start, under a new id."""
        request = Request(
            self._take_rid(), live.request.prompt_hashes, live.request.num_prompt_tokens,
            live.request.max_output_tokens, hints=live.request.hints,
        )  # fmt: skip
        self._resubmit(live, request, live.generation)

    def _resubmit(self, live: LiveRequest, request: Request, generation: Generation) -> None:
        """Drop `live` from its nodes and route it again as `request` (a new id, from
        `_take_rid`) generating `generation`; counts a retry. Its handle stays."""
        self._live.pop(live.request.request_id, None)
        self._clear_incoming(live)
        self._abort_on_nodes(live)
        live.request = request
        live.generation = generation
        live.handle.request_id = request.request_id
        live.num_retries += 1
        self.metrics.num_retried += 1
        self._submit(live)

    # -- policies --------------------------------------------------------------------------
    def _policies_on_arrival(self, request: Request, now: float) -> None:
        """A request reached the frontend: apply the KV manager's actions, tell the planner."""
        self._apply_kv(self.bundle.kv_manager.on_arrival(request, now))
        if self.bundle.planner is not None:
            self.bundle.planner.observe(RequestArrived(request, now))

    def _policies_on_finish(self, live: LiveRequest, node_id: int, now: float) -> None:
        self._apply_kv(self.bundle.kv_manager.on_finish(live.request, node_id, now))
        if self.bundle.planner is not None:
            self.bundle.planner.observe(finished_observation(live, now))

    def _policies_on_tick(self, now: float) -> None:
        self._apply_kv(self.bundle.kv_manager.on_tick(self.view, now))

    async def _plan(self, now: float) -> list[RoleChange]:
        """The planner's role changes for the current view (none without a planner)."""
        planner = self.bundle.planner
        return [] if planner is None else planner.plan(self.view, now)

    async def _plan_loop(self) -> None:
        planner = self.bundle.planner
        assert planner is not None
        while True:
            await asyncio.sleep(planner.interval_s)
            for change in await self._plan(self.now_s()):
                self.apply_role_change(change)

    def apply_role_change(self, change: RoleChange) -> bool:
        """Tell a node its new role; False when nothing changes (dead, same role)."""
        node = self.nodes[change.node_id]
        if not node.alive or not node.is_serving or node.role is change.new_role:
            return False
        restart = change.mode is SwitchMode.RESTART
        seq = node.order_role(change.new_role, restart)
        cold = self.bundle.cold_start_s if restart else 0.0
        self._post(change.node_id, SetRole(change.new_role, restart, cold, seq))
        self.metrics.num_role_switches += 1
        return True

    def set_role(self, node_id: int, role: Role) -> bool:
        if not 0 <= node_id < len(self.nodes):
            raise ValueError(f"no node {node_id}")
        return self.apply_role_change(RoleChange(node_id, role, SwitchMode.IN_PLACE))

    async def _kv_tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.kv_tick_s)
            self._policies_on_tick(self.now_s())

    def _apply_kv(self, actions: list[KVAction]) -> None:
        for action in actions:
            for node_id, msg in kv_messages(action, len(self.nodes)):
                self._post(node_id, msg)
            if isinstance(action, ScoreBlocks):
                self.metrics.num_kv_score_messages += 1
                self.metrics.num_kv_scored_hashes += len(action.hashes)

    # -- inspection ------------------------------------------------------------------------
    async def check_integrity(self, timeout_s: float = 10.0) -> list[IntegrityReport]:
        """Every live node's integrity check (pool and scheduler)."""
        assert self._loop is not None
        futures = []
        for node in self.nodes:
            if not node.alive:
                continue
            token = self._next_token
            self._next_token += 1
            fut: asyncio.Future[IntegrityReport] = self._loop.create_future()
            self._integrity[token] = fut
            self._inboxes[node.node_id].put(CheckIntegrity(token))
            futures.append(fut)
        return list(await asyncio.wait_for(asyncio.gather(*futures), timeout_s))

    @property
    def num_live_requests(self) -> int:
        return len(self._live)


def _picklable_eviction(bundle: SystemBundle, node_id: int) -> Any:
    """The bundle's eviction strategy for a node when it can live in the worker process.

    LRU can, and so can a strategy that is told its scores (`ScoreSink`: the evolving
    KV manager's `PublishedTiers`, fed by `ScoreBlocks` actions). A strategy that reads
    its scores from the KV manager in the frontend cannot: a pickled copy would score
    from a frozen snapshot of the manager, so the worker uses LRU instead."""
    eviction = bundle.kv_manager.eviction_for(node_id)
    if isinstance(eviction, LRUEviction | ScoreSink):
        return eviction
    if node_id == 0:
        name = type(eviction).__name__
        log.warning("system %s: eviction %s runs as LRU in the workers", bundle.name, name)
    return None
