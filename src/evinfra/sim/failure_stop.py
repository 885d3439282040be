"""Stopping a run once it is certain to fail a P95 TTFT target: a goodput search's
overloaded loads cost the most simulator time of all its runs and only their verdict is
used.

The verdict is the one `evinfra.bench.goodput.judge` gives the whole run (one seed): the
run fails when more than `max_unfinished_frac` of the window's N calls are unfinished, or
when the P95 TTFT over the F finished ones passes the target. A call is certain to count
against the run once its TTFT is known to pass the target, or once it has waited past the
target with no first token: from then on it either finishes late or is left unfinished.
Let K be those calls. With u unfinished, either u > max_unfinished_frac N (a fail), or at
least K - max_unfinished_frac N finished ones are late; numpy's P95 (linear) of F values
is at least its value at index floor(0.95 (F - 1)), which passes the target once
F - floor(0.95 (F - 1)) <= 0.05 F + 1.95 values do. So the run fails when
K >= (0.05 + max_unfinished_frac) N_max + 2, for any N_max >= N: the window's calls so far
plus every call not yet sent that the sessions starting before the horizon can send before
it (a second pass over the workload's arrivals, which gives the same sessions; a call is
sent no earlier than its think times after its session's start), or, past the horizon, the
window's calls alone.

Handed-off calls waiting for their first decode step are left out of K until their first
token is known: that token is stamped at the end of the step's first pass, which can lie
before the moment of the check. Every other first token is stamped at the event that
gives it, never earlier than now.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Iterable, Mapping

from evinfra.sim.metrics import RequestRecord
from evinfra.workloads.types import SessionArrival, SessionPlan

PERCENTILE_SHARE = 0.05
"""The share of the finished calls above P95."""


def num_calls_by(plan: SessionPlan, start_s: float, horizon_s: float) -> int:
    """Calls of a session started at `start_s` that can be sent before the horizon, those
    of the sessions its calls fork included. A call goes out at the earliest its think time
    after its predecessor's send (which it follows after that call's end), and a forked
    session starts at the earliest when its parent call is sent: so the calls whose think
    times alone reach the horizon are never sent."""
    at_s = start_s
    count = 0
    for call in plan.calls:
        at_s += call.think_s
        if at_s >= horizon_s:
            break
        count += 1 + sum(num_calls_by(child, at_s, horizon_s) for child in call.forks)
    return count


def num_calls_before(arrivals: Iterable[SessionArrival], horizon_s: float) -> int:
    """Calls that can be sent before the horizon, over sessions in start order."""
    starting = itertools.takewhile(lambda a: a.start_s < horizon_s, arrivals)
    return sum(num_calls_by(a.plan, a.start_s, horizon_s) for a in starting)


class FailureStop:
    """Watches one run's records; `check` says why the run is certain to fail, or None."""

    def __init__(
        self,
        *,
        ttft_p95_s: float,
        max_unfinished_frac: float,
        warmup_s: float,
        horizon_s: float,
        count_calls: Callable[[], int],
    ) -> None:
        self.ttft_p95_s = ttft_p95_s
        self.max_unfinished_frac = max_unfinished_frac
        self.warmup_s = warmup_s
        self.horizon_s = horizon_s
        self._count_calls = count_calls
        """Every call the run could send before its horizon; counted when first needed."""
        self._num_calls: int | None = None
        self._num_scanned = 0
        """Request ids below this are classified (late, on time, or pending)."""
        self.num_window = 0
        self.num_late = 0
        self._pending: list[int] = []
        """Window calls with no first token yet, not yet known to be late."""

    def _needed(self, num_window_max: int) -> float:
        share = PERCENTILE_SHARE + self.max_unfinished_frac
        return share * num_window_max + 2

    def check(
        self,
        records: Mapping[int, RequestRecord],
        num_sent: int,
        now_s: float,
        awaiting_decode_step: Container[int],
    ) -> str | None:
        """`num_sent`: calls sent so far (request ids 0..num_sent-1; a rejected call has
        no record)."""
        target = self.ttft_p95_s
        for rid in range(self._num_scanned, num_sent):
            rec = records.get(rid)
            if rec is not None and self.warmup_s <= rec.arrival_s < self.horizon_s:
                self.num_window += 1
                self._pending.append(rid)
        self._num_scanned = num_sent
        still: list[int] = []
        for rid in self._pending:
            rec = records[rid]
            if rec.first_token_s is not None:
                self.num_late += rec.first_token_s - rec.arrival_s > target
            elif now_s - rec.arrival_s > target and rid not in awaiting_decode_step:
                self.num_late += 1
            else:
                still.append(rid)
        self._pending = still
        if self.num_late < self._needed(self.num_window):
            return None
        bound = self.num_window
        if now_s < self.horizon_s:
            if self._num_calls is None:
                self._num_calls = self._count_calls()
            bound += max(0, self._num_calls - num_sent)
        if self.num_late < self._needed(bound):
            return None
        return (
            f"stopped at {now_s:.0f} s: {self.num_late} calls past the {target:g} s TTFT"
            f" target of at most {bound} in the window, so P95 TTFT > {target:g} s"
            f" or more than {self.max_unfinished_frac:.0%} unfinished"
        )
