"""A simulated node: the core scheduler, a cost model, and the step in flight."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from evinfra.core.scheduler import NodeScheduler, StepPlan
from evinfra.core.sequence import Sequence
from evinfra.core.types import Role
from evinfra.costmodel.base import BatchShape, CostModel, PrefillChunk


@dataclass(slots=True)
class StepInFlight:
    plan: StepPlan | None
    """None for a pause (a role switch's cost)."""
    start_s: float
    end_s: float
    num_steps: int
    """>1: a decode run of that many steps (apply_decode_run); 1: one planned step."""
    run_args: tuple[int, int, int] = (0, 0, 0)
    """(num_seqs, context tokens, kv tokens) at the start of a decode run."""
    run_times_s: dict[int, float] = field(default_factory=dict)
    """The cost model's time for the run's first n steps, by n, as far as asked."""


class SimNode:
    def __init__(self, sched: NodeScheduler, cost: CostModel, host_load_bytes_s: float) -> None:
        self.sched = sched
        self.cost = cost
        self.host_load_bytes_s = host_load_bytes_s
        self.step: StepInFlight | None = None
        self.token = 0
        self.pending_incoming: deque[tuple[int, Sequence]] = deque()
        """(source node, sequence) handoffs waiting for KV room here."""
        self.restart_role: Role | None = None
        self.pending_delay_s = 0.0
        self.migrate_pending = False
        self.busy_s = 0.0

    @property
    def node_id(self) -> int:
        return self.sched.node_id

    def batch_shape(self, plan: StepPlan) -> BatchShape:
        chunks = tuple(PrefillChunk(c.num_new_tokens, c.num_context_tokens) for c in plan.chunks)
        ctx = plan.num_decode_context_tokens
        if ctx is None:
            ctx = sum(s.num_computed_tokens + 1 for s in plan.decodes)
        kv = self.sched.pool.num_used_blocks * self.sched.block_size
        return BatchShape(chunks, len(plan.decodes), ctx, kv)

    def step_time_s(self, plan: StepPlan) -> float:
        t = self.cost.step_time_s(self.batch_shape(plan))
        if plan.num_onboarded_blocks:
            num_bytes = (
                plan.num_onboarded_blocks * self.sched.block_size * self.cost.kv_bytes_per_token
            )
            t += num_bytes / self.host_load_bytes_s
        return t

    def decode_run_args(self) -> tuple[int, int, int]:
        sched = self.sched
        kv = sched.pool.num_used_blocks * sched.block_size
        return len(sched.running), sched.num_decode_context_tokens, kv

    def run_time_s(self, args: tuple[int, int, int], num_steps: int) -> float:
        return self.cost.decode_run_time_s(args[0], args[1], args[2], num_steps)

    def run_time_of(self, step: StepInFlight, num_steps: int) -> float:
        """The time of the first `num_steps` steps of the decode run `step` (each asked of
        the cost model once per run)."""
        times = step.run_times_s
        t = times.get(num_steps)
        if t is None:
            t = self.run_time_s(step.run_args, num_steps)
            times[num_steps] = t
        return t

    def boundary_after(self, step: StepInFlight, now_s: float) -> tuple[int, float]:
        """The next step boundary of a decode run at `now_s`, where new work joins: the
        steps done by then (counting the one in progress) and when they end."""
        done = self.steps_done_by(step, now_s)
        return done, step.start_s + self.run_time_of(step, done)

    def steps_done_by(self, step: StepInFlight, now_s: float) -> int:
        """Steps of a decode run complete by `now_s`, counting the one in progress (new
        work joins at the next step boundary): the fewest steps whose run time reaches
        the time elapsed. Run times grow with every step, so the search may guess where
        that step is from the run times it knows and check the guess and its neighbour
        (about three questions to the cost model instead of log2(steps))."""
        elapsed = now_s - step.start_s
        if elapsed <= 0:
            return 1
        lo, hi = 0, step.num_steps  # run_time(lo) < elapsed <= run_time(hi)
        t_lo, t_hi = 0.0, step.run_times_s.get(hi)
        neighbour = 0
        guesses = 0
        while hi - lo > 1:
            exact_guess = False
            if lo < neighbour < hi:
                mid = neighbour
            elif guesses < 3 and t_hi is not None:
                guesses += 1
                exact_guess = lo > 0
                mid = min(max(math.ceil(_steps_for(elapsed, lo, t_lo, hi, t_hi)), lo + 1), hi - 1)
            else:
                mid = (lo + hi) // 2
            neighbour = 0
            t = self.run_time_of(step, mid)
            if t >= elapsed:
                hi, t_hi = mid, t
                if exact_guess:
                    neighbour = mid - 1
            else:
                lo, t_lo = mid, t
                if exact_guess:
                    neighbour = mid + 1
        return max(hi, 1)


def _steps_for(elapsed: float, lo: int, t_lo: float, hi: int, t_hi: float) -> float:
    """Where a run's time reaches `elapsed`, modelling the mean step time of the first n
    steps as linear in n through the known points (exact when each step takes a fixed
    amount longer than the one before, as a decode step does as contexts grow)."""
    mean_hi = t_hi / hi
    if lo == 0:
        return elapsed / mean_hi if mean_hi > 0 else (lo + hi) / 2
    mean_lo = t_lo / lo
    slope = (mean_hi - mean_lo) / (hi - lo)
    base = mean_lo - slope * lo
    disc = base * base + 4 * slope * elapsed
    if disc < 0 or base + math.sqrt(disc) <= 0:
        return (lo + hi) / 2
    # the root of slope n^2 + base n = elapsed, in the form that stays exact as slope -> 0
    return 2 * elapsed / (base + math.sqrt(disc))
