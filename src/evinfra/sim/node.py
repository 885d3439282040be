"""A simulated node: the core scheduler, a cost model, and the step in flight."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

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

    def steps_done_by(self, step: StepInFlight, now_s: float) -> int:
        """Steps of a decode run complete by `now_s`, counting the one in progress (new
        work joins at the next step boundary)."""
        elapsed = now_s - step.start_s
        lo, hi = 0, step.num_steps  # run_time(lo) < elapsed <= run_time(hi)
        if elapsed <= 0:
            return 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.run_time_s(step.run_args, mid) >= elapsed:
                hi = mid
            else:
                lo = mid
        return max(hi, 1)
