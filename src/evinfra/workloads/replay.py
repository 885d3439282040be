"""Closed-loop replay bookkeeping, shared by every runtime (pure: no clock, no I/O).

A session's call k+1 is sent `think_s` after call k finished, and after every sub-agent
that call k forked has finished (the later of the two). The runtime reports finishes and
gets back the calls it may send and when; a faster server therefore finishes sessions
sooner. `replay_with_latency` drives it with a latency function (an infinitely wide
server), for tests and quick what-ifs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from evinfra.workloads.types import SessionPlan, Workload


@dataclass(frozen=True, slots=True)
class CallRef:
    plan: SessionPlan
    call_index: int

    @property
    def session_id(self) -> str:
        return self.plan.session_id


@dataclass(frozen=True, slots=True)
class ScheduledCall:
    send_at_s: float
    ref: CallRef


@dataclass(frozen=True, slots=True)
class Progress:
    scheduled: tuple[ScheduledCall, ...] = ()
    finished_sessions: tuple[str, ...] = ()
    """Top-level sessions now complete (all calls and sub-agents finished)."""


@dataclass(slots=True)
class _Join:
    parent: SessionPlan
    call_index: int
    num_pending: int
    ready_s: float


@dataclass(slots=True)
class ClosedLoopTracker:
    """Which calls of the running sessions may be sent, and when."""

    _joins: dict[tuple[str, int], _Join] = field(default_factory=dict)
    _parent_join: dict[str, tuple[str, int]] = field(default_factory=dict)
    _in_flight: set[tuple[str, int]] = field(default_factory=set)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def start(self, plan: SessionPlan, start_s: float) -> ScheduledCall:
        """Schedule a top-level session's first call (its `think_s` after `start_s`)."""
        return self._schedule(plan, 0, start_s)

    def on_finished(self, ref: CallRef, finish_s: float) -> Progress:
        """Record that `ref` finished at `finish_s`; return what may be sent next."""
        key = (ref.session_id, ref.call_index)
        if key not in self._in_flight:
            raise ValueError(f"call {key} was not scheduled or already finished")
        self._in_flight.discard(key)
        call = ref.plan.calls[ref.call_index]
        if not call.forks:
            scheduled: list[ScheduledCall] = []
            finished: list[str] = []
            self._advance(ref.plan, ref.call_index, finish_s, scheduled, finished)
            return Progress(tuple(scheduled), tuple(finished))
        self._joins[key] = _Join(ref.plan, ref.call_index, len(call.forks), finish_s)
        children = []
        for child in call.forks:
            self._parent_join[child.session_id] = key
            children.append(self._schedule(child, 0, finish_s))
        return Progress(tuple(children))

    def _schedule(self, plan: SessionPlan, index: int, after_s: float) -> ScheduledCall:
        self._in_flight.add((plan.session_id, index))
        return ScheduledCall(after_s + plan.calls[index].think_s, CallRef(plan, index))

    def _advance(
        self,
        plan: SessionPlan,
        index: int,
        done_s: float,
        scheduled: list[ScheduledCall],
        finished: list[str],
    ) -> None:
        """Call `index` of `plan` is complete, sub-agents included, at `done_s`."""
        if index + 1 < len(plan.calls):
            scheduled.append(self._schedule(plan, index + 1, done_s))
            return
        join_key = self._parent_join.pop(plan.session_id, None)
        if join_key is None:
            finished.append(plan.session_id)
            return
        join = self._joins[join_key]
        join.num_pending -= 1
        join.ready_s = max(join.ready_s, done_s)
        if join.num_pending == 0:
            del self._joins[join_key]
            self._advance(join.parent, join.call_index, join.ready_s, scheduled, finished)


@dataclass(frozen=True, slots=True)
class ReplayedCall:
    ref: CallRef
    send_s: float
    finish_s: float


def replay_with_latency(
    workload: Workload,
    latency_s: Callable[[CallRef, float], float],
    *,
    max_sessions: int,
) -> list[ReplayedCall]:
    """Replay up to `max_sessions` sessions closed-loop on a server that answers every call
    after `latency_s(ref, send_s)` seconds, whatever the load. Sessions start at their
    `start_s`, or, when the workload sets a concurrency, as earlier ones finish."""
    tracker = ClosedLoopTracker()
    source = itertools.islice(workload.arrivals(), max_sessions)
    seq = itertools.count()
    heap: list[tuple[float, int, int, object]] = []  # (time, phase, seq, payload)
    log: list[ReplayedCall] = []
    if workload.concurrency is None:
        for arrival in source:
            heapq.heappush(heap, (arrival.start_s, 0, next(seq), arrival.plan))
    else:
        for arrival in itertools.islice(source, workload.concurrency):
            heapq.heappush(heap, (0.0, 0, next(seq), arrival.plan))
    while heap:
        now_s, phase, _, payload = heapq.heappop(heap)
        if phase == 0:
            assert isinstance(payload, SessionPlan)
            item = tracker.start(payload, now_s)
            heapq.heappush(heap, (item.send_at_s, 1, next(seq), item.ref))
        elif phase == 1:
            assert isinstance(payload, CallRef)
            finish_s = now_s + latency_s(payload, now_s)
            log.append(ReplayedCall(payload, now_s, finish_s))
            heapq.heappush(heap, (finish_s, 2, next(seq), payload))
        else:
            assert isinstance(payload, CallRef)
            progress = tracker.on_finished(payload, now_s)
            for item in progress.scheduled:
                heapq.heappush(heap, (item.send_at_s, 1, next(seq), item.ref))
            if workload.concurrency is not None:
                for _ in progress.finished_sessions:
                    nxt = next(source, None)
                    if nxt is not None:
                        heapq.heappush(heap, (now_s, 0, next(seq), nxt.plan))
    return log
