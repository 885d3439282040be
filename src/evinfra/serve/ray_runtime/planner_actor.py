"""The planner as a Ray actor, and the frontend's handle on it.

`PlannerActor` holds a `ControlReplica` (the bundle's planner and a replica of its KV
manager, see `control.py`). `RemotePlanner`, in the frontend, buffers the control events
the frontend's policies produce (arrivals, finishes, KV ticks), ships them in one call per
KV tick (`replay`, fire-and-forget) and with each plan (`plan`, awaited), and returns the
role changes for the frontend to apply. A sequential actor runs one caller's calls in the
order they were sent, so the replica sees the frontend's order.

When the actor dies (its call raises), the frontend logs it and starts a new one, seeded
with a copy of the frontend's KV manager (current) and planner (as it was seeded: the
frontend does not plan while an actor does, so the new planner's observation window and
dwell timers start empty). After `max_restarts` deaths it plans in the frontend instead.
Either way the frontend keeps serving: the planner is off the request path.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import ray

from evinfra.core.types import RoleChange
from evinfra.policy.base import ClusterView, RequestArrived, RequestFinished
from evinfra.policy.bundle import SystemBundle
from evinfra.serve.ray_runtime.control import (
    Arrived,
    ClusterSnapshot,
    ControlEvent,
    ControlReplica,
    Finished,
    Ticked,
)
from evinfra.serve.ray_runtime.supervised import SupervisedActor, failure_reason

__all__ = ["PlannerActor", "RemotePlanner", "failure_reason"]

PlannerActor: Any = ray.remote(max_restarts=0)(ControlReplica)
"""The Ray actor class (sequential: calls run one at a time, in each caller's order)."""


class RemotePlanner(SupervisedActor[ControlEvent]):
    """The frontend's side of the planner actor. Call from the frontend's event loop."""

    NOT_READY: ClassVar[str] = (
        "planner actor not ready after {timeout_s:.0f} s ({reason}; it declares"
        " {num_cpus:g} CPUs): planning in the frontend"
    )
    GIVEN_UP: ClassVar[str] = (
        "planner actor {what} ({reason}) after {num_restarts} restarts: planning in the"
        " frontend from now on"
    )
    RESTARTING: ClassVar[str] = (
        "planner actor {what} ({reason}): starting a new one from the frontend's KV manager"
        " state (restart {num_restarts} of {max_restarts}); its observation window and"
        " dwell timers start empty"
    )

    def __init__(
        self,
        bundle: SystemBundle,
        num_cpus: float = 0.0,
        max_restarts: int = 3,
        plan_timeout_s: float = 30.0,
    ) -> None:
        if bundle.planner is None:
            raise ValueError(f"system {bundle.name} has no planner")
        super().__init__(num_cpus, max_restarts)
        self.bundle = bundle
        self.plan_timeout_s = plan_timeout_s
        self.num_replay_calls = 0
        self.num_plan_calls = 0

    def start(self) -> None:
        """Create the actor, seeded with a copy of the frontend's KV manager and planner
        (one argument, so their shared state stays shared in the copy)."""
        seed = (self.bundle.kv_manager, self.bundle.planner)
        self.actor = PlannerActor.options(num_cpus=self.num_cpus).remote(*seed)
        self._events.clear()
        self._last = None

    def _restart(self) -> None:
        self.start()

    # -- events ---------------------------------------------------------------------------
    def arrived(self, event: RequestArrived) -> None:
        if self.in_process:
            self._planner.observe(event)
        else:
            self._events.append(Arrived(event))

    def finished(self, node_id: int, event: RequestFinished) -> None:
        if self.in_process:
            self._planner.observe(event)
        else:
            self._events.append(Finished(node_id, event))

    def ticked(self, view: ClusterView, now_s: float) -> None:
        """The frontend's KV tick: ship what happened since the last call; notice a dead
        actor through the previous shipment."""
        if self.in_process:
            return
        self._check_last()
        self._events.append(Ticked(ClusterSnapshot.of(view), now_s))
        events, self._events = self._events, []
        self._last = (self.actor, self.actor.replay.remote(events))
        self.num_replay_calls += 1

    async def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        """The planner's role changes for `view` now ([] while the actor is replaced)."""
        if self.in_process:
            local: list[RoleChange] = self._planner.plan(view, now_s)
            return local
        events, self._events = self._events, []
        actor = self.actor
        ref = actor.plan.remote(events, ClusterSnapshot.of(view), now_s)
        self.num_plan_calls += 1
        try:
            changes: list[RoleChange] = await asyncio.wait_for(ref, self.plan_timeout_s)
        except Exception as exc:  # dead, hung (TimeoutError) or raising: replace it
            self._on_death(exc, actor)
            return []
        return changes

    @property
    def _planner(self) -> Any:
        return self.bundle.planner

    async def counts(self) -> tuple[int, int]:
        """(events replayed, plans made) by the current actor."""
        if self.actor is None:
            return 0, 0
        counts: tuple[int, int] = await self.actor.counts.remote()
        return counts
