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
import contextlib
import logging
from typing import Any

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

log = logging.getLogger(__name__)

PlannerActor: Any = ray.remote(max_restarts=0)(ControlReplica)
"""The Ray actor class (sequential: calls run one at a time, in each caller's order)."""


def failure_reason(exc: BaseException) -> str:
    """`ActorDiedError: <first line>`: what the log says about a failed call."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ("no answer in time" if isinstance(exc, TimeoutError) else "")
    return f"{type(exc).__name__}: {first}"[:300]


class RemotePlanner:
    """The frontend's side of the planner actor. Call from the frontend's event loop."""

    def __init__(
        self,
        bundle: SystemBundle,
        num_cpus: float = 0.0,
        max_restarts: int = 3,
        plan_timeout_s: float = 30.0,
    ) -> None:
        if bundle.planner is None:
            raise ValueError(f"system {bundle.name} has no planner")
        self.bundle = bundle
        self.num_cpus = num_cpus
        self.max_restarts = max_restarts
        self.plan_timeout_s = plan_timeout_s
        self.actor: Any = None
        self.num_restarts = 0
        self.num_replay_calls = 0
        self.num_plan_calls = 0
        self.in_process = False
        """True once the actor was given up on: the frontend plans itself."""
        self._events: list[ControlEvent] = []
        self._last_replay: Any = None

    def start(self) -> None:
        """Create the actor, seeded with a copy of the frontend's KV manager and planner
        (one argument, so their shared state stays shared in the copy)."""
        seed = (self.bundle.kv_manager, self.bundle.planner)
        self.actor = PlannerActor.options(num_cpus=self.num_cpus).remote(*seed)
        self._events.clear()
        self._last_replay = None

    async def wait_placed(self, timeout_s: float) -> bool:
        """Wait until the actor answers; else give it up and plan in the frontend (an actor
        Ray cannot place, for want of the CPUs it declares, would never answer)."""
        try:
            await asyncio.wait_for(self.actor.counts.remote(), timeout_s)
        except Exception as exc:
            log.warning(
                "planner actor not ready after %.0f s (%s; it declares %g CPUs):"
                " planning in the frontend",
                timeout_s,
                failure_reason(exc),
                self.num_cpus,
            )
            self.close()
            self.in_process = True
            return False
        return True

    def close(self) -> None:
        if self.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            self.actor = None

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
        self._check_last_replay()
        self._events.append(Ticked(ClusterSnapshot.of(view), now_s))
        events, self._events = self._events, []
        self._last_replay = (self.actor, self.actor.replay.remote(events))
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

    # -- failures -------------------------------------------------------------------------
    def _check_last_replay(self) -> None:
        if self._last_replay is None:
            return
        actor, ref = self._last_replay
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return
        self._last_replay = None
        try:
            ray.get(ref)
        except Exception as exc:
            self._on_death(exc, actor)

    def _on_death(self, exc: BaseException, actor: Any) -> None:
        """`actor` died, hung past `plan_timeout_s` or raised (its replica may then be
        half-updated): end it and start a new one, or plan in the frontend. A failure of
        an actor already replaced (a plan and a replay both failing on the same dead
        actor) is ignored: one death, one restart."""
        if actor is not self.actor:
            return
        what = "died" if isinstance(exc, ray.exceptions.RayActorError) else "failed"
        reason = failure_reason(exc)
        old, self.actor = self.actor, None
        with contextlib.suppress(Exception):
            ray.kill(old, no_restart=True)
        if self.num_restarts >= self.max_restarts:
            log.warning(
                "planner actor %s (%s) after %d restarts: planning in the frontend from now on",
                what,
                reason,
                self.num_restarts,
            )
            self.in_process = True
            self._events.clear()
            return
        self.num_restarts += 1
        log.warning(
            "planner actor %s (%s): starting a new one from the frontend's KV manager state"
            " (restart %d of %d); its observation window and dwell timers start empty",
            what,
            reason,
            self.num_restarts,
            self.max_restarts,
        )
        self.start()

    async def counts(self) -> tuple[int, int]:
        """(events replayed, plans made) by the current actor."""
        if self.actor is None:
            return 0, 0
        counts: tuple[int, int] = await self.actor.counts.remote()
        return counts
