"""Closed-loop replay: no call before its predecessor (and its sub-agents) finished."""

from __future__ import annotations

import random

import pytest

from evinfra.workloads.factory import make_workload
from evinfra.workloads.replay import CallRef, ClosedLoopTracker, ReplayedCall, replay_with_latency
from evinfra.workloads.types import SessionPlan


def forking_workload(concurrency: int | None = None):  # type: ignore[no-untyped-def]
    params = {
        "profile": "tracelab",
        "tl_max_turns": 3,
        "tl_max_steps": 12,
        "tl_fork_prob_per_call": 0.3,
        "compact_at_tokens": 40_000,
        "context_window_tokens": 60_000,
    }
    if concurrency is None:
        return make_workload(
            "coding", seed=4, session_rate_per_s=0.5, num_sessions=60, params=params
        )
    return make_workload("coding", seed=4, concurrency=concurrency, num_sessions=60, params=params)


def random_latency(seed: int, scale: float):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    return lambda ref, now_s: scale * rng.uniform(0.05, 3.0)


def check_order(log: list[ReplayedCall]) -> None:
    by_call = {(r.ref.session_id, r.ref.call_index): r for r in log}
    assert len(by_call) == len(log), "a call was sent twice"
    plans: dict[str, SessionPlan] = {r.ref.session_id: r.ref.plan for r in log}

    def done_s(plan: SessionPlan, index: int) -> float:
        """When call `index` and everything it forked had finished."""
        t = by_call[(plan.session_id, index)].finish_s
        for child in plan.calls[index].forks:
            t = max(t, done_s(child, len(child.calls) - 1))
        return t

    for plan in plans.values():
        for k in range(len(plan.calls)):
            assert (plan.session_id, k) in by_call, "a call was never sent"
            sent = by_call[(plan.session_id, k)].send_s
            call = plan.calls[k]
            if k > 0:
                assert sent >= done_s(plan, k - 1) + call.think_s - 1e-9
                assert sent == pytest.approx(done_s(plan, k - 1) + call.think_s)
            for child in call.forks:
                child_sent = by_call[(child.session_id, 0)].send_s
                assert child_sent >= by_call[(plan.session_id, k)].finish_s - 1e-9


def test_closed_loop_never_sends_before_predecessor_finished() -> None:
    w = forking_workload()
    log = replay_with_latency(w, random_latency(1, 1.0), max_sessions=60)
    assert any(r.ref.plan.parent_session_id for r in log), "no sub-agents exercised"
    check_order(log)


def test_faster_server_finishes_sessions_sooner() -> None:
    w = forking_workload()

    def session_end(scale: float) -> dict[str, float]:
        ends: dict[str, float] = {}
        for r in replay_with_latency(w, lambda ref, now: scale, max_sessions=60):
            root = r.ref.session_id.split(".")[0]
            ends[root] = max(ends.get(root, 0.0), r.finish_s)
        return ends

    slow, fast = session_end(2.0), session_end(0.2)
    assert all(fast[s] < slow[s] for s in slow)


def test_concurrency_keeps_at_most_c_sessions_running() -> None:
    w = forking_workload(concurrency=5)
    log = replay_with_latency(w, random_latency(2, 1.0), max_sessions=60)
    check_order(log)
    spans: dict[str, list[float]] = {}
    for r in log:
        root = r.ref.session_id.split(".")[0]
        lo, hi = spans.get(root, [r.send_s, r.finish_s])
        spans[root] = [min(lo, r.send_s), max(hi, r.finish_s)]
    assert len(spans) == 60
    for t in sorted(lo for lo, _ in spans.values()):
        running = sum(1 for lo, hi in spans.values() if lo <= t < hi)
        assert running <= 5


def test_tracker_rejects_unknown_finish() -> None:
    w = forking_workload()
    plan = next(w.arrivals()).plan
    tracker = ClosedLoopTracker()
    first = tracker.start(plan, 10.0)
    assert first.send_at_s == 10.0 + plan.calls[0].think_s
    with pytest.raises(ValueError, match="not scheduled"):
        tracker.on_finished(CallRef(plan, 1), 11.0)
    progress = tracker.on_finished(first.ref, 12.0)
    if len(plan.calls) == 1:
        assert progress.finished_sessions == (plan.session_id,)
    with pytest.raises(ValueError, match="already finished"):
        tracker.on_finished(first.ref, 13.0)
