"""The discrete-event simulation of a cluster: the policy core on a virtual clock.

Events call policies and apply their decisions; they hold no policy themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from evinfra.core.blocks import common_prefix_len, num_blocks_for
from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import PrefixMatch
from evinfra.core.sequence import Sequence
from evinfra.core.types import Request, Role, RoleChange, SwitchMode
from evinfra.policy.base import (
    ClusterView,
    DropBlocks,
    KVAction,
    NodeView,
    OffloadBlocks,
    PrefetchBlocks,
    RequestArrived,
    RequestFinished,
)
from evinfra.policy.bundle import SystemBundle
from evinfra.sim.events import EventQueue, Phase
from evinfra.sim.failure_stop import FailureStop
from evinfra.sim.links import LinkModel
from evinfra.sim.metrics import Metrics, RequestRecord, TimeSample
from evinfra.sim.node import SimNode, StepInFlight
from evinfra.sim.seen_hashes import SeenHashes
from evinfra.sim.sessions import SessionRun
from evinfra.sim.settings import SimSettings
from evinfra.workloads.types import SessionArrival, SessionPlan, Workload

__all__ = ["Progress", "RequestFactory", "SimSettings", "Simulation"]

RequestFactory = Callable[[int, SessionPlan, int], Request]
"""(request id, session plan, call index) -> Request."""
Progress = Callable[[float, int], None]
"""(simulated seconds, events processed)."""


class SimView:
    """What the policies read of the simulated cluster: the schedulers, the global block
    index and, for a router that asks, where each node's step in flight stands."""

    def __init__(self, sim_nodes: Seq[SimNode], index: GlobalBlockIndex) -> None:
        self._sim_nodes = sim_nodes
        self._nodes: Seq[NodeView] = [n.sched for n in sim_nodes]
        self._index = index

    @property
    def nodes(self) -> Seq[NodeView]:
        return self._nodes

    def match_prefix_all(self, hashes: Seq[int]) -> list[PrefixMatch]:
        """Every node's prefix match, in node order, from the global block index."""
        return self._index.match_all(hashes)

    def step_remaining_s(self, node_id: int, now_s: float) -> float:
        """Time until the node's step in flight ends and new work can join (0 when idle);
        within a decode run, the end of the step in progress."""
        node = self._sim_nodes[node_id]
        step = node.step
        if step is None:
            return 0.0
        end_s = step.end_s
        if step.plan is not None and step.num_steps > 1:
            _, end_s = node.boundary_after(step, now_s)
        return max(end_s - now_s, 0.0)


@dataclass(slots=True)
class _Inflight:
    session: SessionRun
    call_index: int
    request: Request
    decode_node: int


class Simulation:
    def __init__(
        self,
        *,
        nodes: list[SimNode],
        bundle: SystemBundle,
        workload: Workload,
        links: LinkModel,
        make_request: RequestFactory,
        settings: SimSettings,
        progress: Progress | None = None,
        failure_stop: FailureStop | None = None,
    ) -> None:
        self.nodes = nodes
        self.bundle = bundle
        self.workload = workload
        self.links = links
        self.make_request = make_request
        self.settings = settings
        self.progress = progress
        self.failure_stop = failure_stop
        self.stopped: tuple[float, str] | None = None
        """(time, why) when `failure_stop` ended the run early."""
        self.events = EventQueue()
        self.metrics = Metrics()
        self.block_index = GlobalBlockIndex(len(nodes))
        for node in nodes:
            self.block_index.attach(node.sched.pool, node.node_id)
        self.view: ClusterView = SimView(nodes, self.block_index)
        self._arrivals: Iterator[SessionArrival] = workload.arrivals()
        self._inflight: dict[int, _Inflight] = {}
        self._next_request_id = 0
        self._ever_computed = SeenHashes()
        self._recorded_prompt: dict[str, tuple[int, ...]] = {}
        """Per session, its last prompt added to `_ever_computed` (all of it is in)."""
        self._active_by_kind: dict[str, int] = {}
        self._num_active_sessions = 0
        self._last_seen = [0] * len(nodes)
        self._max_node_blocks = max(n.sched.num_device_blocks for n in nodes)
        self._held: list[tuple[SessionRun, int, Request]] = []
        self._num_admitting = 0
        """Calls sent and not yet past the API overhead."""
        self._awaiting_decode_step: set[int] = set()
        """Handed-off requests whose first token waits for their first decode step."""
        self._last_cached = [0] * len(nodes)

    # -- running ------------------------------------------------------------------------
    def run(self) -> Metrics:
        s = self.settings
        conc = self.workload.concurrency
        if conc is not None:
            for _ in range(conc):
                self._start_next_arrival()
        else:
            self._push_next_arrival()
        if self.bundle.planner is not None:
            self.events.push(self.bundle.planner.interval_s, Phase.PLAN, self._on_plan)
        self.events.push(s.kv_tick_s, Phase.KV_TICK, self._on_kv_tick)
        self.events.push(0.0, Phase.SAMPLE, self._on_sample)
        end_s = s.horizon_s + s.drain_s
        chunk_s = max(s.horizon_s / 100.0, 1.0)
        t = 0.0
        while t < end_s and len(self.events):
            t = min(t + chunk_s, end_s)
            self.events.run_until(t, stop=self._drained)
            if self.progress is not None:
                self.progress(self.events.now_s, self.events.num_processed)
            if self._drained():
                break
            if self.failure_stop is not None and self._certain_to_fail():
                break
        return self.metrics

    def _certain_to_fail(self) -> bool:
        assert self.failure_stop is not None
        now = self.events.now_s
        why = self.failure_stop.check(
            self.metrics.records, self._next_request_id, now, self._awaiting_decode_step
        )
        if why is not None:
            self.stopped = (now, why)
        return why is not None

    def _drained(self) -> bool:
        return (
            self.events.now_s >= self.settings.horizon_s
            and not self._inflight
            and not self._held
            and not self._num_admitting
        )

    @property
    def now_s(self) -> float:
        return self.events.now_s

    # -- sessions -----------------------------------------------------------------------
    def _push_next_arrival(self) -> None:
        arrival = next(self._arrivals, None)
        if arrival is None or arrival.start_s >= self.settings.horizon_s:
            return
        start = max(arrival.start_s, self.now_s)
        self.events.push(start, Phase.SESSION_START, lambda: self._on_arrival(arrival))

    def _on_arrival(self, arrival: SessionArrival) -> None:
        self._start_session(arrival.plan, parent=None)
        self._push_next_arrival()

    def _start_next_arrival(self) -> None:
        if self.now_s >= self.settings.horizon_s:
            return
        arrival = next(self._arrivals, None)
        if arrival is not None:
            self._start_session(arrival.plan, parent=None)

    def _start_session(self, plan: SessionPlan, parent: SessionRun | None) -> None:
        run = SessionRun(plan, parent, top_level=parent is None)
        self.metrics.session_start_s.setdefault(plan.session_id, self.now_s)
        self._active_by_kind[plan.kind] = self._active_by_kind.get(plan.kind, 0) + 1
        self._num_active_sessions += 1
        self._schedule_next_call(run)

    def _schedule_next_call(self, run: SessionRun) -> None:
        if not run.has_next:
            self._end_session(run, finished=True)
            return
        at = self.now_s + run.plan.calls[run.next_call].think_s
        if at >= self.settings.horizon_s:
            self._end_session(run, finished=False)
            return
        self.events.push(at, Phase.CALL, lambda: self._send_call(run))

    def _end_session(self, run: SessionRun, finished: bool) -> None:
        if finished:
            self.metrics.session_end_s[run.plan.session_id] = self.now_s
        self._recorded_prompt.pop(run.plan.session_id, None)
        self._active_by_kind[run.kind] -= 1
        self._num_active_sessions -= 1
        if run.parent is not None:
            run.parent.pending_children -= 1
            if run.parent.pending_children == 0:
                self._schedule_next_call(run.parent)
        elif self.workload.concurrency is not None and finished:
            # a slot whose next call falls past the horizon stays taken until then, as the
            # replay client keeps its session: no fresh session takes its place early
            self._start_next_arrival()

    def _after_call(self, run: SessionRun, call_index: int) -> None:
        call = run.plan.calls[call_index]
        if call.forks:
            run.pending_children = len(call.forks)
            for child in call.forks:
                self._start_session(child, parent=run)
        else:
            self._schedule_next_call(run)

    # -- requests -----------------------------------------------------------------------
    def _send_call(self, run: SessionRun) -> None:
        index = run.next_call
        run.next_call += 1
        run.num_calls_sent += 1
        rid = self._next_request_id
        self._next_request_id += 1
        req = self.make_request(rid, run.plan, index)
        now = self.now_s
        if self._too_large(req):
            # no node could ever hold it: a server answers 400; the session goes on
            self.metrics.num_rejected += 1
            self._after_call(run, index)
            return
        self.metrics.records[rid] = RequestRecord(
            rid, run.plan.session_id, run.kind, now, req.num_prompt_tokens, req.max_output_tokens
        )
        delay_s = self.settings.api_overhead_s
        if delay_s:
            self._num_admitting += 1
            self.events.push(now + delay_s, Phase.CALL, lambda: self._admit_late(run, index, req))
        else:
            self._admit(run, index, req)

    def _admit_late(self, run: SessionRun, index: int, req: Request) -> None:
        self._num_admitting -= 1
        self._admit(run, index, req)

    def _admit(self, run: SessionRun, index: int, req: Request) -> None:
        """The frontend has the request: the KV manager and planner see it, then route."""
        now = self.now_s
        self._apply_kv(self.bundle.kv_manager.on_arrival(req, now))
        if self.bundle.planner is not None:
            self.bundle.planner.observe(RequestArrived(req, now))
        self._route(run, index, req)

    def _route(self, run: SessionRun, index: int, req: Request) -> None:
        """Place a request, or hold it at the frontend while no node serves (every worker
        restarting): it is placed when the first comes back."""
        if not any(n.sched.is_serving for n in self.nodes):
            self._held.append((run, index, req))
            return
        rid = req.request_id
        now = self.now_s
        route = self.bundle.router.route(req, self.view, now)
        for node_id in (route.prefill_node, route.decode_node):
            if not 0 <= node_id < len(self.nodes):
                raise ValueError(f"router {self.bundle.name} chose unknown node {node_id}")
        rec = self.metrics.records[rid]
        rec.prefill_node, rec.decode_node = route.prefill_node, route.decode_node
        self._inflight[rid] = _Inflight(run, index, req, route.decode_node)
        if route.decode_node != route.prefill_node:  # it reserves the prompt's KV later
            self._adopt_match(route.decode_node, req.prompt_hashes)
        src = route.pull_from_node
        if src is not None and src != route.prefill_node:
            self._pull_prefix(src, route.prefill_node, rid, not route.is_disaggregated)
            return
        self._enqueue(route.prefill_node, rid, not route.is_disaggregated)

    def _too_large(self, req: Request) -> bool:
        bs = self.nodes[0].sched.block_size
        need = num_blocks_for(req.num_prompt_tokens + req.max_output_tokens, bs)
        return need > self._max_node_blocks

    def _enqueue(self, node_id: int, rid: int, decode_here: bool) -> None:
        node = self.nodes[node_id]
        request = self._inflight[rid].request
        self._adopt_match(node_id, request.prompt_hashes)
        node.sched.enqueue_prefill(request, decode_here=decode_here)
        self._kick(node, new_work=True)

    def _adopt_match(self, node_id: int, hashes: tuple[int, ...]) -> None:
        """Hand the node's pool the match the router just had from the block index (when
        nothing changed since), so admission does not walk the prompt again."""
        match = self.block_index.last_match(hashes, node_id)
        if match is not None:
            self.nodes[node_id].sched.pool.adopt_match(hashes, match)

    def _pull_prefix(self, src: int, dst: int, rid: int, decode_here: bool) -> None:
        """Move the prefix `src` holds and `dst` lacks, then queue the prefill on `dst`."""
        hashes = self._inflight[rid].request.prompt_hashes
        self._adopt_match(dst, hashes)
        self._adopt_match(src, hashes)
        have = self.nodes[dst].sched.pool.match_prefix(hashes).num_device_blocks
        held = self.nodes[src].sched.pool.match_prefix(hashes).num_device_blocks
        moving = hashes[have:held]
        if not moving:
            self._enqueue(dst, rid, decode_here)
            return
        node = self.nodes[dst]
        num_bytes = len(moving) * node.sched.block_size * node.cost.kv_bytes_per_token
        end = self.links.schedule(self.now_s, src, dst, num_bytes, len(moving))
        record = self.metrics.records[rid]
        record.num_transfer_bytes += num_bytes
        record.num_pulled_bytes += num_bytes
        self.metrics.num_prefix_pulls += 1

        def arrived() -> None:
            node.sched.pool.import_cached(moving)
            self._enqueue(dst, rid, decode_here)

        self.events.push(end, Phase.TRANSFER_DONE, arrived)

    def _record_prefill(self, rid: int, num_cached_tokens: int, num_host_tokens: int) -> None:
        rec = self.metrics.records[rid]
        req = self._inflight[rid].request
        rec.num_cached_tokens = num_cached_tokens
        rec.num_host_cached_tokens = num_host_tokens
        bs = self.nodes[0].sched.block_size
        hit = num_cached_tokens // bs
        seen = self._ever_computed
        rec.num_recomputed_tokens = bs * seen.count_in(req.prompt_hashes[hit:])
        last = self._recorded_prompt.get(rec.session_id, ())
        seen.update(req.prompt_hashes[common_prefix_len(last, req.prompt_hashes) :])
        self._recorded_prompt[rec.session_id] = req.prompt_hashes

    def _first_token(self, rid: int, at_s: float | None = None) -> None:
        rec = self.metrics.records[rid]
        if rec.first_token_s is None:
            rec.first_token_s = self.now_s if at_s is None else at_s

    def _finish(self, rid: int, node_id: int, num_preemptions: int) -> None:
        now = self.now_s
        inflight = self._inflight.pop(rid)
        self._awaiting_decode_step.discard(rid)
        rec = self.metrics.records[rid]
        self._first_token(rid)
        rec.finish_s = now
        rec.num_preemptions = num_preemptions
        req = inflight.request
        self._ever_computed.update(req.output_hashes)
        self._apply_kv(self.bundle.kv_manager.on_finish(req, node_id, now))
        if self.bundle.planner is not None:
            ttft, e2e, tpot = rec.ttft_s, rec.e2e_s, rec.tpot_s
            assert ttft is not None and e2e is not None
            self.bundle.planner.observe(
                RequestFinished(req, now, rec.num_cached_tokens, ttft, e2e, tpot or 0.0)
            )
        self._after_call(inflight.session, inflight.call_index)

    # -- node stepping ------------------------------------------------------------------
    def _kick(self, node: SimNode, new_work: bool = False) -> None:
        """Start the node's next step if it is free; if it is in a decode run and new work
        arrived, cut the run at the next step boundary so the work joins then."""
        step = node.step
        if step is not None:
            if new_work and step.plan is not None and step.num_steps > 1:
                done, end_s = node.boundary_after(step, self.now_s)
                if done < step.num_steps:
                    step.num_steps = done
                    step.end_s = end_s
                    self._push_step_done(node, step.end_s)
            return
        if node.migrate_pending:
            self._migrate_running(node)
        plan = node.sched.schedule()
        if plan is not None and plan.preempted:
            for seq in plan.preempted:
                self.metrics.records[seq.seq_id].num_preemptions += 1
        if plan is None or (not plan.chunks and not plan.decodes):
            self._maybe_restart(node)
            return
        now = self.now_s
        delay = node.pending_delay_s
        node.pending_delay_s = 0.0
        k = 0
        if not plan.chunks and len(plan.decodes) == len(node.sched.running):
            k = node.sched.max_decode_run_steps()
        if k > 1:
            node.sched.reserve_decode_run(plan.decodes, k)
            args = node.decode_run_args()
            dur = node.run_time_s(args, k)
            node.step = StepInFlight(plan, now + delay, now + delay + dur, k, args, {k: dur})
        else:
            dur = node.step_time_s(plan)
            node.step = StepInFlight(plan, now + delay, now + delay + dur, 1)
        node.busy_s += dur
        self._push_step_done(node, node.step.end_s)

    def _push_step_done(self, node: SimNode, end_s: float) -> None:
        node.token += 1
        token = node.token
        self.events.push(end_s, Phase.STEP_DONE, lambda: self._on_step_done(node, token))

    def _on_step_done(self, node: SimNode, token: int) -> None:
        if token != node.token:
            return  # superseded: the run was cut short
        step = node.step
        assert step is not None
        node.step = None
        if step.plan is None:
            self._kick(node)
            return
        sched = node.sched
        if self._awaiting_decode_step:
            self._first_decode_step(node, step)
        if step.num_steps > 1:
            out = sched.apply_decode_run(step.plan.decodes, step.num_steps)
        else:
            out = sched.complete_step(step.plan)
        for seq in out.prefilled:
            if seq.num_generated == 1:
                self._record_prefill(seq.seq_id, seq.num_cached_tokens, seq.num_host_cached_tokens)
            if seq.decode_here:
                self._first_token(seq.seq_id)
        for seq in out.handoffs:
            self._handoff(node, seq)
        for seq in out.finished:
            self._finish(seq.seq_id, node.node_id, seq.num_preemptions)
        if self.settings.check_integrity:
            sched.check_integrity()
        self._retry_incoming(node)
        self._kick(node)

    def _first_decode_step(self, node: SimNode, step: StepInFlight) -> None:
        """First tokens of handed-off requests in this step: at the end of its first pass."""
        assert step.plan is not None
        end_s = step.end_s
        if step.num_steps > 1:
            end_s = step.start_s + node.run_time_of(step, 1)
        waiting = self._awaiting_decode_step
        for seq in step.plan.decodes:
            if seq.seq_id in waiting:
                waiting.discard(seq.seq_id)
                self._first_token(seq.seq_id, end_s)

    # -- disaggregation -----------------------------------------------------------------
    def _handoff(self, src: SimNode, seq: Sequence) -> None:
        dst = self.nodes[self._inflight[seq.seq_id].decode_node]
        dst.pending_incoming.append((src.node_id, seq))
        self._retry_incoming(dst)

    def _retry_incoming(self, dst: SimNode) -> None:
        """Reserve KV on `dst` for waiting handoffs, in order, and start their transfers."""
        while dst.pending_incoming:
            src_id, seq = dst.pending_incoming[0]
            num_blocks = dst.sched.try_reserve_incoming(seq.request, seq.num_generated)
            if num_blocks is None:
                return
            dst.pending_incoming.popleft()
            self._transfer(src_id, dst.node_id, seq.seq_id, num_blocks, migrate=False)

    def _transfer(self, src: int, dst: int, rid: int, num_blocks: int, migrate: bool) -> None:
        node = self.nodes[dst]
        num_bytes = num_blocks * node.sched.block_size * node.cost.kv_bytes_per_token
        end = self.links.schedule(self.now_s, src, dst, num_bytes, num_blocks)
        if not migrate:
            end += self.settings.handoff_overhead_s  # not on the wire: the link is free
        record = self.metrics.records[rid]
        record.num_transfer_bytes += num_bytes
        if migrate:
            record.num_migrated_bytes += num_bytes
        self.events.push(
            end, Phase.TRANSFER_DONE, lambda: self._on_transfer_done(src, dst, rid, migrate)
        )

    def _on_transfer_done(self, src: int, dst: int, rid: int, migrate: bool) -> None:
        src_node, dst_node = self.nodes[src], self.nodes[dst]
        if not migrate:
            src_node.sched.release_handoff(rid)
        dst_node.sched.accept_incoming(rid)
        if migrate or not self.settings.first_token_on_decode_step:
            self._first_token(rid)
        elif self.metrics.records[rid].first_token_s is None:
            self._awaiting_decode_step.add(rid)
        self._retry_incoming(src_node)
        self._kick(src_node)
        self._kick(dst_node, new_work=True)

    def _migrate_running(self, node: SimNode) -> None:
        """Move this node's decodes to decode nodes with room (KV over the link)."""
        node.migrate_pending = False
        targets = [
            n
            for n in self.nodes
            if n is not node and n.sched.is_serving and n.sched.role is not Role.PREFILL
        ]
        for seq in list(node.sched.running):
            room = [t for t in targets if t.sched.num_free_blocks > len(seq.block_ids)]
            if not room:
                return
            dst = max(room, key=lambda t: (t.sched.num_free_blocks, -t.node_id))
            num_blocks = dst.sched.try_reserve_incoming(seq.request, seq.num_generated)
            if num_blocks is None:
                continue
            node.sched.take_running(seq.seq_id)
            self._inflight[seq.seq_id].decode_node = dst.node_id
            self.metrics.records[seq.seq_id].decode_node = dst.node_id
            self.metrics.migrated_seqs += 1
            self._transfer(node.node_id, dst.node_id, seq.seq_id, num_blocks, migrate=True)

    # -- planner and role changes -------------------------------------------------------
    def _on_plan(self) -> None:
        planner = self.bundle.planner
        assert planner is not None
        for change in planner.plan(self.view, self.now_s):
            self._apply_role_change(change)
        if not self._drained():
            self.events.push(self.now_s + planner.interval_s, Phase.PLAN, self._on_plan)

    def _apply_role_change(self, change: RoleChange) -> None:
        node = self.nodes[change.node_id]
        sched = node.sched
        if change.mode is SwitchMode.IN_PLACE:
            if not sched.is_serving or sched.role is change.new_role:
                return
            old = sched.role
            sched.set_role(change.new_role)
            self.metrics.role_switches += 1
            self.metrics.switch_cost_s += self.bundle.switch_cost_s
            node.pending_delay_s += self.bundle.switch_cost_s
            if (
                self.bundle.migrate_on_switch
                and old is not Role.PREFILL
                and change.new_role is Role.PREFILL
            ):
                node.migrate_pending = True
            self._kick(node)
            return
        if not sched.is_serving:
            return
        # Dynamo: stop the worker (it drains what it holds, then loses its KV) and start
        # one in the new role after a cold start
        sched.is_serving = False
        node.restart_role = change.new_role
        self.metrics.role_switches += 1
        self._maybe_restart(node)

    def _maybe_restart(self, node: SimNode) -> None:
        sched = node.sched
        if node.restart_role is None or not sched.is_idle or node.pending_incoming:
            return
        role = node.restart_role
        node.restart_role = None
        sched.pool.clear()

        def ready() -> None:
            sched.set_role(role)
            sched.is_serving = True
            self._kick(node)
            held, self._held = self._held, []
            for run, index, req in held:
                self._route(run, index, req)

        self.events.push(self.now_s + self.bundle.cold_start_s, Phase.NODE_READY, ready)

    # -- KV manager ---------------------------------------------------------------------
    def _on_kv_tick(self) -> None:
        self._apply_kv(self.bundle.kv_manager.on_tick(self.view, self.now_s))
        if not self._drained():
            self.events.push(self.now_s + self.settings.kv_tick_s, Phase.KV_TICK, self._on_kv_tick)

    def _apply_kv(self, actions: list[KVAction]) -> None:
        for action in actions:
            if isinstance(action, DropBlocks):
                targets = self.nodes if action.node_id is None else [self.nodes[action.node_id]]
                for node in targets:
                    node.sched.pool.drop(action.hashes)
            elif isinstance(action, OffloadBlocks):
                self.nodes[action.node_id].sched.pool.offload(action.hashes)
            elif isinstance(action, PrefetchBlocks):
                self.nodes[action.node_id].sched.pool.prefetch(action.hashes)

    # -- sampling -----------------------------------------------------------------------
    def _on_sample(self) -> None:
        roles = {Role.PREFILL: 0, Role.DECODE: 0, Role.MIXED: 0}
        offline = 0
        seen = cached = 0
        for i, node in enumerate(self.nodes):
            sched = node.sched
            if sched.is_serving:
                roles[sched.role] += 1
            else:
                offline += 1
            seen += sched.num_prompt_tokens_seen - self._last_seen[i]
            cached += sched.num_prompt_tokens_cached - self._last_cached[i]
            self._last_seen[i] = sched.num_prompt_tokens_seen
            self._last_cached[i] = sched.num_prompt_tokens_cached
        scheds = [n.sched for n in self.nodes]
        total_blocks = sum(s.num_device_blocks for s in scheds)
        self.metrics.samples.append(
            TimeSample(
                self.now_s,
                roles[Role.PREFILL],
                roles[Role.DECODE],
                roles[Role.MIXED],
                offline,
                dict(self._active_by_kind),
                cached / seen if seen else 0.0,
                sum(s.num_waiting_requests for s in scheds),
                sum(s.num_running_decodes for s in scheds),
                sum(s.num_used_blocks for s in scheds) / total_blocks,
            )
        )
        if not self._drained():
            self.events.push(
                self.now_s + self.settings.sample_interval_s, Phase.SAMPLE, self._on_sample
            )
