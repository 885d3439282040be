"""The `ray` runtime: the `local` runtime's frontend and policies, with node actors and a
planner actor.

`RayCluster` is a `LocalCluster` whose transport is Ray: each node is a `NodeActor`
(the same `NodeWorker` loop), the frontend's inboxes are `ActorLink`s, the outbox is a
long poll on every actor, and KV moves between actors through a `KVTransport` (Ray's
object store by default). The planner runs in a `PlannerActor` fed the frontend's control
events (`planner_actor.py`), the KV manager's decisions in a `KVManagerActor` fed its
events and sending its actions to the nodes (`kv_actor.py`). Routing, the session table
the router reads (kept by the frontend's copy of the KV manager, whose actions are then
dropped), metrics and the request bookkeeping are the local runtime's code, unchanged,
so both runtimes make the same decisions.

When a node actor dies (its poll raises), the frontend forgets the node's blocks, makes
sure the survivors still prefill and decode and asks the planner to re-plan, then takes
each request that still needs the node (a disaggregated request needs its prefill node
only until its KV has reached the decode node): one that streamed nothing is resent; one
that streamed tokens is resumed on another node with its streamed tokens appended to its
prompt (greedy output continues exactly); after `max_retries` it fails with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import ray

from evinfra.core.types import Request, RoleChange
from evinfra.policy.base import RequestArrived
from evinfra.serve.protocol import FinishReason, TokensOut
from evinfra.serve.ray_runtime.kv_actor import RemoteKVManager, frontend_applies
from evinfra.serve.ray_runtime.links import FRONTEND, ActorLink
from evinfra.serve.ray_runtime.node_actor import NodeActor
from evinfra.serve.ray_runtime.options import RayOptions
from evinfra.serve.ray_runtime.planner_actor import RemotePlanner, failure_reason
from evinfra.serve.ray_runtime.recovery import coverage_changes, depends_on, forget_node, resume
from evinfra.serve.ray_runtime.transport import make_transport
from evinfra.serve.requests import LiveRequest, RequestHandle, StreamEvent, finished_observation
from evinfra.serve.runtime import ClusterConfig, LocalCluster
from evinfra.serve.view import NodeState

log = logging.getLogger(__name__)


def ensure_ray(options: RayOptions) -> bool:
    """Connect to Ray if this process is not connected; True when this call started it."""
    if ray.is_initialized():
        return False
    # ray.init replaces SIGTERM's handler with one that exits at once; the server's own
    # (uvicorn: a graceful shutdown that stops the nodes) must stay
    in_main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if options.address is not None:
        ray.init(address=options.address, log_to_driver=False)
    else:
        ray.init(
            num_cpus=options.local_num_cpus,
            include_dashboard=False,
            object_store_memory=options.object_store_memory_bytes,
            log_to_driver=False,
        )
    if in_main:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return True


class RayCluster(LocalCluster):
    """`LocalCluster`'s surface (`start`, `stop`, `generate`, `set_role`,
    `check_integrity`, `metrics`, `nodes`) on Ray actors."""

    def __init__(
        self,
        config: ClusterConfig,
        options: RayOptions | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(config, now)
        self.options = options or RayOptions()
        self.transport = make_transport(self.options.transport)
        self.actors: list[Any] = []
        self._owns_ray = False
        self._streamed: dict[RequestHandle, list[int]] = {}
        self.num_resumed = 0
        self.num_replans = 0
        """Plans made at once because a node died."""
        self.planner: RemotePlanner | None = None
        """The planner actor's handle (None: the bundle has no planner)."""
        if self.bundle.planner is not None:
            self.planner = RemotePlanner(
                self.bundle, self.options.num_cpus_for_planner, self.options.max_planner_restarts
            )
        self.kv_remote: RemoteKVManager | None = None
        """The KV manager actor's handle (None: the frontend applies its KV actions)."""
        if self.options.kv_manager_actor:
            self.kv_remote = RemoteKVManager(
                self.bundle.kv_manager,
                self.transport,
                self.options.num_cpus_for_planner,
                self.options.max_planner_restarts,
            )

    # -- lifecycle -------------------------------------------------------------------------
    async def _start_nodes(self) -> None:
        """Create the node actors, wire them to each other, wait until each is ready."""
        self._owns_ray = ensure_ray(self.options)
        cfg, opts = self.config, self.options
        actor_options: dict[str, Any] = {
            "num_cpus": opts.num_cpus_per_node,
            "num_gpus": opts.num_gpus_per_node,
            "max_restarts": 0,
        }
        if opts.node_resources:
            actor_options["resources"] = dict(opts.node_resources)
        for i, role in enumerate(self.bundle.initial_roles):
            spec = self._worker_spec(i, role)
            self.actors.append(NodeActor.options(**actor_options).remote(spec, self.transport))
        refs = [actor.connect.remote(self.actors) for actor in self.actors]
        try:
            replies = await asyncio.to_thread(ray.get, refs, timeout=cfg.ready_timeout_s)
        except Exception as exc:
            await self.stop()
            raise RuntimeError(f"a node actor failed to start: {exc}") from exc
        for i, (_ready, stats, pid) in enumerate(replies):
            self._pids.append(pid)
            self.nodes.append(NodeState(i, stats))
        self._inboxes = [ActorLink(FRONTEND, actor, self.transport) for actor in self.actors]
        self._spawn_thread(self._poll_nodes, "evinfra-ray-poll")
        if self.planner is not None:
            self.planner.start()
            await self.planner.wait_placed(self.options.planner_ready_timeout_s)
        if self.kv_remote is not None:
            self.kv_remote.start(dict(enumerate(self.actors)))
            await self.kv_remote.wait_placed(self.options.planner_ready_timeout_s)

    async def _stop_nodes(self, timeout_s: float) -> None:
        """Stop every node loop, kill the actors (the planner's too), and leave Ray if
        this cluster joined it."""
        live_actors = [a for i, a in enumerate(self.actors) if self._node_alive(i)]
        refs = [a.stop.remote(self.options.stop_timeout_s) for a in live_actors]
        with contextlib.suppress(Exception):
            await asyncio.to_thread(ray.get, refs, timeout=timeout_s)
        self._stopping.set()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, self.options.poll_timeout_s + 5.0)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.actors = []
        if self.planner is not None:
            self.planner.close()
        if self.kv_remote is not None:
            self.kv_remote.close()
        self._inboxes = []
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def _node_alive(self, node_id: int) -> bool:
        return node_id >= len(self.nodes) or self.nodes[node_id].alive

    @property
    def worker_pids(self) -> list[int]:
        return list(self._pids)

    # -- actors -> loop --------------------------------------------------------------------
    def _poll_nodes(self) -> None:
        """One long poll in flight per live node; a poll that raises means a dead node."""
        timeout_s = self.options.poll_timeout_s
        pending = {actor.poll.remote(timeout_s): i for i, actor in enumerate(self.actors)}
        while pending and not self._stopping.is_set():
            done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout_s)
            for ref in done:
                node_id = pending.pop(ref)
                try:
                    batches = ray.get(ref)
                except Exception as exc:
                    if not self._stopping.is_set():
                        self._report_death_from_thread(node_id, failure_reason(exc))
                    continue
                for batch in batches:
                    self._deliver_from_thread(batch)
                pending[self.actors[node_id].poll.remote(timeout_s)] = node_id

    # -- requests --------------------------------------------------------------------------
    def _on_tokens(self, msg: TokensOut) -> None:
        live = self._live.get(msg.request_id)
        if live is not None and msg.token_ids:
            self._streamed.setdefault(live.handle, []).extend(msg.token_ids)
        super()._on_tokens(msg)

    def _finish(self, live: LiveRequest, node_id: int, now: float) -> None:
        self._streamed.pop(live.handle, None)
        super()._finish(live, node_id, now)

    def _fail(self, live: LiveRequest, message: str) -> None:
        self._streamed.pop(live.handle, None)
        super()._fail(live, message)

    def _abort_handle(self, handle: RequestHandle) -> None:
        self._streamed.pop(handle, None)
        super()._abort_handle(handle)

    # -- policies: the planner and the KV manager in their actors --------------------------
    # The frontend's own KV manager runs every hook first: it keeps the session table the
    # router reads. Its actions apply only when no KV manager actor does.
    def _policies_on_arrival(self, request: Request, now: float) -> None:
        actions = self.bundle.kv_manager.on_arrival(request, now)
        if frontend_applies(self.kv_remote):
            self._apply_kv(actions)
        else:
            assert self.kv_remote is not None
            self.kv_remote.arrived(request, now)
        if self.planner is not None:
            self.planner.arrived(RequestArrived(request, now))

    def _submit(self, live: LiveRequest) -> None:
        super()._submit(live)
        routed = live.route is not None and live.request.request_id in self._live
        if routed and not frontend_applies(self.kv_remote):
            assert self.kv_remote is not None and live.route is not None
            self.kv_remote.routed(live.request.request_id, live.route)

    def _policies_on_finish(self, live: LiveRequest, node_id: int, now: float) -> None:
        actions = self.bundle.kv_manager.on_finish(live.request, node_id, now)
        if frontend_applies(self.kv_remote):
            self._apply_kv(actions)
        else:
            assert self.kv_remote is not None
            self.kv_remote.finished(live, node_id, now)
        if self.planner is not None:
            self.planner.finished(node_id, finished_observation(live, now))

    def _policies_on_tick(self, now: float) -> None:
        actions = self.bundle.kv_manager.on_tick(self.view, now)
        if frontend_applies(self.kv_remote):
            self._apply_kv(actions)
        else:
            assert self.kv_remote is not None
            self.kv_remote.ticked(self.view, now)
        if self.planner is not None:
            self.planner.ticked(self.view, now)

    async def _plan(self, now: float) -> list[RoleChange]:
        if self.planner is None:
            return []
        return await self.planner.plan(self.view, now)

    # -- failures --------------------------------------------------------------------------
    def _on_node_death(self, node_id: int, reason: str) -> None:
        if self._closing or not self.nodes[node_id].alive:
            return
        message = f"node {node_id} died ({reason})"
        log.warning(message)
        forget_node(self.nodes[node_id])
        if self.kv_remote is not None:
            self.kv_remote.node_lost(node_id)
        self.metrics.num_node_failures += 1
        with contextlib.suppress(Exception):  # a crashed loop leaves the actor up: end it
            ray.kill(self.actors[node_id], no_restart=True)
        self._rebalance()
        for live in list(self._live.values()):
            if not depends_on(live, node_id):
                continue
            if live.num_retries >= self.config.max_retries:
                retried = f" (resent {live.num_retries} times already)" if live.num_retries else ""
                self._fail(live, message + retried)
            elif live.num_output_tokens == 0:
                self._retry(live)
            else:
                self._resume(live, node_id)

    def _rebalance(self) -> None:
        """Cover any missing role now (the requests about to be resumed need a prefill
        and a decode node), and ask the planner to re-plan on the view without the dead
        node (its changes apply when its actor answers)."""
        for change in coverage_changes(self.nodes):
            self.apply_role_change(change)
        if self.planner is not None:
            self._tasks.append(asyncio.create_task(self._replan()))

    async def _replan(self) -> None:
        for change in await self._plan(self.now_s()):
            self.apply_role_change(change)
        self.num_replans += 1

    def _resume(self, live: LiveRequest, node_id: int) -> None:
        """Start the request again on a live node after the tokens it already streamed."""
        streamed = self._streamed.get(live.handle, [])
        resumed = resume(
            live.request, live.generation, streamed, self._take_rid(), self.config.block_size
        )
        if resumed is None:  # every token is out, only its finish was lost: it is done
            live.handle.push(StreamEvent((), FinishReason.LENGTH))
            self._finish(live, node_id, self.now_s())
            return
        self.num_resumed += 1
        self._resubmit(live, resumed.request, resumed.generation)
