import random

import pytest

from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig, StepPlan
from evinfra.core.types import Role
from evinfra.sim.node import SimNode, StepInFlight
from evinfra.sim.simulation import SimView


class RampCost:
    """Decode step i of a run takes first + ramp * i, or at least floor_s (a roofline
    switching from memory- to compute-bound), counting the questions asked."""

    def __init__(self, first_s: float, ramp_s: float, floor_s: float = 0.0) -> None:
        self.first_s, self.ramp_s, self.floor_s = first_s, ramp_s, floor_s
        self.num_calls = 0

    def decode_run_time_s(self, num_seqs: int, ctx: int, kv: int, num_steps: int) -> float:
        self.num_calls += 1
        return sum(max(self.first_s + self.ramp_s * i, self.floor_s) for i in range(num_steps))


def make_node(cost: RampCost) -> SimNode:
    sched = NodeScheduler(0, KVPool(8), SchedulerConfig(4), Role.DECODE)
    return SimNode(sched, cost, 1e9)  # type: ignore[arg-type]


def bisect_steps(node: SimNode, step: StepInFlight, now_s: float) -> int:
    """The plain binary search the guided one must agree with."""
    elapsed = now_s - step.start_s
    if elapsed <= 0:
        return 1
    lo, hi = 0, step.num_steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if node.run_time_s(step.run_args, mid) >= elapsed:
            hi = mid
        else:
            lo = mid
    return max(hi, 1)


@pytest.mark.parametrize(
    ("ramp_s", "floor_s"), [(0.0, 0.0), (2e-5, 0.0), (1e-5, 0.02), (-1e-6, 0.005)]
)
def test_steps_done_by_agrees_with_bisection(ramp_s: float, floor_s: float) -> None:
    rng = random.Random(7)
    num_calls = 0
    for _ in range(300):
        cost = RampCost(rng.uniform(0.005, 0.03), ramp_s, floor_s)
        node = make_node(cost)
        k = rng.randint(2, 500)
        dur = node.run_time_s((1, 1, 1), k)
        known = {k: dur} if rng.random() < 0.9 else {}
        step = StepInFlight(None, 5.0, 5.0 + dur, k, (1, 1, 1), known)
        now = 5.0 + rng.uniform(-0.01, dur * 1.02)
        if rng.random() < 0.2:  # exactly on a step boundary
            now = 5.0 + node.run_time_s((1, 1, 1), rng.randint(1, k))
        want = bisect_steps(node, step, now)
        cost.num_calls = 0
        assert node.steps_done_by(step, now) == want
        num_calls += cost.num_calls
        # the end time of the run cut there is the cost model's, asked once
        assert node.run_time_of(step, want) == node.run_time_s((1, 1, 1), want)
    assert num_calls / 300 < 5  # bisection asks about log2(k), ~8 here


def test_view_reports_the_time_left_in_the_step_in_flight() -> None:
    """Idle: 0. One planned step: until its end. Within a decode run of 10 steps of 10,
    11, 12, ... ms: until the end of the step in progress, where new work joins."""
    node = make_node(RampCost(0.010, 0.001))
    view = SimView([node], GlobalBlockIndex(1))
    assert view.step_remaining_s(0, 3.0) == 0.0
    node.step = StepInFlight(None, 3.0, 3.05, 1)
    assert view.step_remaining_s(0, 3.01) == pytest.approx(0.04)
    assert view.step_remaining_s(0, 3.2) == 0.0
    dur = node.run_time_s((1, 1, 1), 10)
    node.step = StepInFlight(StepPlan((), (), 0), 5.0, 5.0 + dur, 10, (1, 1, 1), {10: dur})
    # steps end at 5.010, 5.021, 5.033: 5.025 is inside the third
    assert view.step_remaining_s(0, 5.025) == pytest.approx(0.008)
    assert view.step_remaining_s(0, 5.021) == pytest.approx(0.0)
    assert view.step_remaining_s(0, 4.9) == pytest.approx(0.110)  # not started: its first
