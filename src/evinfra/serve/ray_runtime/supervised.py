"""What the frontend's handles on its control actors (the planner, the KV manager) share:
waiting for the actor to be placed, noticing its death through a fire-and-forget call's
result, restarting it up to `max_restarts` times, then doing its work in the frontend.

One death means one restart: a failure reported for an actor already replaced (a plan
and a replay both failing on the same dead actor) is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, ClassVar, Generic, TypeVar

import ray

log = logging.getLogger(__name__)

EventT = TypeVar("EventT")


def failure_reason(exc: BaseException) -> str:
    """`ActorDiedError: <first line>`: what the log says about a failed call."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ("no answer in time" if isinstance(exc, TimeoutError) else "")
    return f"{type(exc).__name__}: {first}"[:300]


class SupervisedActor(Generic[EventT]):
    """A control actor the frontend restarts; subclasses start it (`_restart`) and word
    the log lines. Templates take `str.format` fields: NOT_READY `timeout_s`, `reason`,
    `num_cpus`; GIVEN_UP and RESTARTING `what` ("died" or "failed"), `reason`,
    `num_restarts`, `max_restarts`."""

    NOT_READY: ClassVar[str]
    GIVEN_UP: ClassVar[str]
    RESTARTING: ClassVar[str]

    def __init__(self, num_cpus: float, max_restarts: int) -> None:
        self.num_cpus = num_cpus
        self.max_restarts = max_restarts
        self.actor: Any = None
        self.num_restarts = 0
        self.in_process = False
        """True once the actor was given up on: the frontend does its work itself."""
        self._events: list[EventT] = []
        self._last: tuple[Any, Any] | None = None
        """(actor, ref) of the last fire-and-forget call, checked at the next one."""

    def _restart(self) -> None:
        """Start a new actor seeded from the frontend's state."""
        raise NotImplementedError

    async def wait_placed(self, timeout_s: float) -> bool:
        """Wait until the actor answers; else give it up and work in the frontend (an actor
        Ray cannot place, for want of the CPUs it declares, would never answer)."""
        try:
            await asyncio.wait_for(self.actor.counts.remote(), timeout_s)
        except Exception as exc:
            reason = failure_reason(exc)
            text = self.NOT_READY.format(timeout_s=timeout_s, reason=reason, num_cpus=self.num_cpus)
            log.warning("%s", text)
            self.close()
            self.in_process = True
            return False
        return True

    def close(self) -> None:
        if self.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
            self.actor = None

    def _check_last(self) -> None:
        """Notice a dead actor through the last fire-and-forget call's result."""
        if self._last is None:
            return
        actor, ref = self._last
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return
        self._last = None
        try:
            ray.get(ref)
        except Exception as exc:
            self._on_death(exc, actor)

    def _on_death(self, exc: BaseException, actor: Any) -> None:
        """`actor` died, hung or raised (its replica may then be half-updated): end it and
        start a new one, or work in the frontend from now on."""
        if actor is not self.actor:
            return
        fields = {
            "what": "died" if isinstance(exc, ray.exceptions.RayActorError) else "failed",
            "reason": failure_reason(exc),
            "max_restarts": self.max_restarts,
        }
        self.close()
        if self.num_restarts >= self.max_restarts:
            log.warning("%s", self.GIVEN_UP.format(num_restarts=self.num_restarts, **fields))
            self.in_process = True
            self._events.clear()
            return
        self.num_restarts += 1
        log.warning("%s", self.RESTARTING.format(num_restarts=self.num_restarts, **fields))
        self._restart()
