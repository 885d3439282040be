"""The KV manager as a Ray actor, and the frontend's handle on it.

`KVManagerActor` holds a `KVReplica` (`control.py`): the bundle's KV manager, seeded with
a copy of the frontend's, fed the frontend's events in order (arrivals, routes, finishes,
KV ticks), and it sends the KV actions it decides (dead blocks to drop, block tiers for
the nodes' eviction, prefetches) to the node actors itself. The frontend keeps its own
KV manager only for the session table its router reads and drops that copy's actions.

`RemoteKVManager`, in the frontend, buffers events for up to `flush_interval_s` (50 ms)
and ships them in one fire-and-forget call: a call per request event cost the frontend
and the 2 cores here about 2 ms a request; batched, the actions reach the nodes at most
that much later (a tier or a drop is not urgent: it matters at the next eviction). A
sequential actor runs one caller's calls in order, so the replica sees the frontend's
order. When the actor dies (a shipment's result raises), the frontend starts a new one
seeded with a copy of its own KV manager (current: it ran every event itself); actions
the dead actor had not sent are lost (a tier is sent again at the session's next
event). After `max_restarts` deaths the frontend applies its own KV manager's actions.
Either way requests keep flowing: the KV manager is off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, ClassVar

import ray

from evinfra.core.types import Request, Route
from evinfra.policy.base import ClusterView, KVManager, RequestArrived, ScoreBlocks
from evinfra.serve.protocol import kv_messages
from evinfra.serve.ray_runtime.control import (
    Arrived,
    ClusterSnapshot,
    Finished,
    KVEvent,
    KVReplica,
    Routed,
    Ticked,
)
from evinfra.serve.ray_runtime.links import ActorLink
from evinfra.serve.ray_runtime.supervised import SupervisedActor
from evinfra.serve.ray_runtime.transport import KVTransport
from evinfra.serve.requests import LiveRequest, finished_observation


class KVManagerActorImpl:
    """A `KVReplica` whose actions go to the node actors."""

    def __init__(self, kv_manager: KVManager, sender: str, transport: KVTransport) -> None:
        self.replica = KVReplica(kv_manager)
        self.sender = sender
        """Its name to the nodes: one per actor, so a new actor's messages are numbered
        from 1 without waiting behind the dead one's sequence."""
        self.transport = transport
        self.links: dict[int, ActorLink] = {}
        self.num_messages = 0
        self.num_scored_hashes = 0

    def connect(self, nodes: dict[int, Any]) -> int:
        """The live node actors by node id; returns how many."""
        self.links = {i: ActorLink(self.sender, h, self.transport) for i, h in nodes.items()}
        return len(self.links)

    def node_lost(self, node_id: int) -> None:
        self.links.pop(node_id, None)

    def apply(self, events: list[KVEvent]) -> int:
        """Replay `events` and send their actions to the nodes; returns once the nodes
        have them (a node that died meanwhile is skipped), with the messages sent."""
        refs = []
        for action in self.replica.apply(events):
            if isinstance(action, ScoreBlocks):
                self.num_scored_hashes += len(action.hashes)
            for node_id, msg in kv_messages(action, max(self.links, default=-1) + 1):
                link = self.links.get(node_id)
                if link is not None:
                    refs.append(link.put(msg))
        for ref in refs:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(ref)
        self.num_messages += len(refs)
        return len(refs)

    def counts(self) -> tuple[int, int, int, int]:
        """(events replayed, actions decided, messages sent, block tiers sent)."""
        replica = self.replica
        return replica.num_events, replica.num_actions, self.num_messages, self.num_scored_hashes


KVManagerActor: Any = ray.remote(max_restarts=0)(KVManagerActorImpl)
"""The Ray actor class (sequential: calls run one at a time, in each caller's order)."""


class RemoteKVManager(SupervisedActor[KVEvent]):
    """The frontend's side of the KV manager actor. Call from the frontend's event loop."""

    NOT_READY: ClassVar[str] = (
        "KV manager actor not ready after {timeout_s:.0f} s ({reason}): KV actions from the"
        " frontend"
    )
    GIVEN_UP: ClassVar[str] = (
        "KV manager actor failed ({reason}) after {num_restarts} restarts: KV actions from"
        " the frontend"
    )
    RESTARTING: ClassVar[str] = (
        "KV manager actor failed ({reason}): starting a new one from the frontend's KV"
        " manager (restart {num_restarts} of {max_restarts})"
    )

    def __init__(
        self,
        kv_manager: KVManager,
        transport: KVTransport,
        num_cpus: float = 0.0,
        max_restarts: int = 3,
        flush_interval_s: float = 0.05,
    ) -> None:
        super().__init__(num_cpus, max_restarts)
        self.kv_manager = kv_manager
        self.flush_interval_s = flush_interval_s
        self.transport = transport
        self.num_calls = 0
        self._nodes: dict[int, Any] = {}
        self._flush_scheduled = False

    def start(self, nodes: dict[int, Any]) -> None:
        """Create the actor, seeded with a copy of the frontend's KV manager, wired to
        the live node actors (`nodes`: node id -> actor handle)."""
        self._nodes = dict(nodes)
        sender = f"kv-manager-{self.num_restarts}"
        actor_cls = KVManagerActor.options(num_cpus=self.num_cpus)
        self.actor = actor_cls.remote(self.kv_manager, sender, self.transport)
        self.actor.connect.remote(self._nodes)
        self._events.clear()
        self._last = None

    def _restart(self) -> None:
        self.start(self._nodes)

    # -- events (the frontend ran its own KV manager on each already) ----------------------
    def arrived(self, request: Request, now_s: float) -> None:
        self._add(Arrived(RequestArrived(request, now_s)))

    def routed(self, request_id: int, route: Route) -> None:
        placed = (route.prefill_node, route.decode_node)
        pulled = () if route.pull_from_node is None else (route.pull_from_node,)
        self._add(Routed(request_id, (*placed, *pulled)))

    def finished(self, live: LiveRequest, node_id: int, now_s: float) -> None:
        self._add(Finished(node_id, finished_observation(live, now_s)))

    def ticked(self, view: ClusterView, now_s: float) -> None:
        self._add(Ticked(ClusterSnapshot.of(view), now_s))

    def node_lost(self, node_id: int) -> None:
        self._nodes.pop(node_id, None)
        if self.actor is not None:
            self.actor.node_lost.remote(node_id)

    def _add(self, event: KVEvent) -> None:
        if self.in_process:
            return
        self._events.append(event)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(self.flush_interval_s, self.flush)

    def flush(self) -> None:
        """Ship the buffered events; notice a dead actor through the previous shipment."""
        self._flush_scheduled = False
        self._check_last()
        if self.in_process or self.actor is None or not self._events:
            return
        events, self._events = self._events, []
        self._last = (self.actor, self.actor.apply.remote(events))
        self.num_calls += 1

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Ship what is buffered and wait until the actor has sent its actions."""
        self.flush()
        if self._last is not None:
            actor, ref = self._last
            try:
                await asyncio.wait_for(ref, timeout_s)
            except Exception as exc:
                self._on_death(exc, actor)

    async def counts(self) -> tuple[int, int, int, int]:
        """The current actor's (events, actions, messages, block tiers) so far."""
        if self.actor is None:
            return 0, 0, 0, 0
        counts: tuple[int, int, int, int] = await self.actor.counts.remote()
        return counts


def frontend_applies(remote: RemoteKVManager | None) -> bool:
    """Whether the frontend's own KV manager's actions are the ones to apply."""
    return remote is None or remote.in_process
