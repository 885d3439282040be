"""Generated statistics land within stated tolerances of their cited targets."""

from __future__ import annotations

import itertools
import statistics

import pytest

from evinfra.core.types import ContextEvent
from evinfra.workloads.arrivals import GeneratedWorkload
from evinfra.workloads.factory import make_workload
from evinfra.workloads.stats import WorkloadStats, workload_stats
from evinfra.workloads.types import SessionPlan


def within(value: float, target: float, rel: float) -> bool:
    return abs(value - target) <= rel * target


def stats_of(workload: GeneratedWorkload) -> WorkloadStats:
    return workload_stats(workload.arrivals(), block_size=64)


def plans(workload: GeneratedWorkload) -> list[SessionPlan]:
    return [a.plan for a in workload.arrivals()]


@pytest.fixture(scope="module")
def swe() -> WorkloadStats:
    return stats_of(make_workload("coding", seed=1, num_sessions=300, params={"profile": "swe"}))


def test_coding_swe_profile_matches_swe_bench_run(swe: WorkloadStats) -> None:
    # One SWE-bench Verified run (WORKLOADS.md): calls mean 40, median 36; input mean
    # 16.5k, median 14k, p95 38k; output mean 276, median 90, p95 1,038.
    assert within(swe.calls_per_session.mean, 40, 0.12)
    assert within(swe.calls_per_session.p50, 36, 0.12)
    assert within(swe.input_tokens.mean, 16_500, 0.12)
    assert within(swe.input_tokens.p50, 14_000, 0.15)
    assert within(swe.input_tokens.p95, 38_000, 0.2)
    assert within(swe.output_tokens.mean, 276, 0.2)
    assert within(swe.output_tokens.p50, 90, 0.15)
    assert within(swe.output_tokens.p95, 1_038, 0.25)
    # TraceLab tool latency: median 0.3 s, p90 13.6 s (lognormal mu -1.20, sigma 2.98).
    assert within(swe.gap_s.p50, 0.3, 0.25)
    assert within(swe.gap_s.p90, 13.6, 0.3)
    assert swe.gap_s.max <= 600.0
    assert swe.num_compactions == 0 and swe.num_forks == 0


def test_coding_tracelab_profile_is_heavier_and_compacts() -> None:
    s = stats_of(make_workload("coding", seed=2, num_sessions=100, params={"profile": "tracelab"}))
    # TraceLab: mean output ~520 per step; compaction in a share of sessions at ~167k.
    assert within(s.output_tokens.mean, 520, 0.25)
    assert 0.03 <= s.compacting_session_share <= 0.35
    assert s.input_tokens.max <= 200_000
    assert s.input_tokens.mean > 3 * 16_500
    assert s.num_forks > 0
    # Human pauses exist: some gaps are far longer than any tool run's median.
    assert s.gap_s.p99 > 300


def test_coding_default_mixes_interactive_sessions() -> None:
    ps = plans(make_workload("coding", seed=3, num_sessions=400))
    interactive = [p for p in ps if p.calls[0].segments[0].num_tokens == 12_000]
    assert 0.02 <= len(interactive) / len(ps) <= 0.09
    # The shared system prompt and tool definitions are one content for all sessions,
    # the task is each session's own.
    first = {p.calls[0].segments[:2] for p in ps if p not in interactive}
    assert len(first) == 1
    tasks = {p.calls[0].segments[2].content_id for p in ps}
    assert len(tasks) == len(ps)


def test_math_matches_retool_profile() -> None:
    ps = plans(make_workload("math", seed=4, num_sessions=400))
    turns = [len(p.calls) for p in ps]
    assert min(turns) == 1 and max(turns) == 5
    responses = [sum(c.num_output_tokens for c in p.calls) for p in ps]
    # ReTool: responses of about 6-10k tokens, tails to 32k.
    assert 6_000 <= statistics.median(responses) <= 10_000
    assert max(responses) <= 32_768
    prompts = [c.num_prompt_tokens for p in ps for c in p.calls]
    assert statistics.median(prompts) < statistics.median(responses)
    gaps = [c.think_s for p in ps for c in p.calls[1:]]
    assert all(0.1 <= g <= 2.0 for g in gaps)


def test_computer_use_screenshots_steps_and_truncation() -> None:
    w = make_workload("computer-use", seed=5, num_sessions=200)
    ps = plans(w)
    steps = [len(p.calls) for p in ps]
    assert min(steps) >= 15 and max(steps) <= 50
    gaps = [c.think_s for p in ps for c in p.calls[1:]]
    assert all(1.0 <= g <= 5.0 for g in gaps)
    for p in ps[:20]:
        shot = p.calls[0].segments[-1].num_tokens
        assert 1_000 <= shot <= 3_000
        kept = [sum(1 for s in c.segments if s.num_tokens == shot) for c in p.calls]
        assert max(kept) <= 3 + 1  # the last three, plus at most an output of equal size
        assert sum(c.context_event is ContextEvent.TRUNCATE for c in p.calls) == len(p.calls) - 3
    s = stats_of(w)
    assert s.output_tokens.p50 < 300


def test_mixed_shares_shift_by_phase() -> None:
    w = make_workload(
        "mixed", seed=6, session_rate_per_s=2.0, num_sessions=1_200, params={"phase_s": 200}
    )
    counts: dict[int, dict[str, int]] = {}
    for a in w.arrivals():
        phase = int(a.start_s // 200) % 3
        counts.setdefault(phase, {}).setdefault(a.plan.kind, 0)
        counts[phase][a.plan.kind] += 1
    for phase, kind in enumerate(("coding", "math", "computer-use")):
        total = sum(counts[phase].values())
        assert within(counts[phase][kind] / total, 0.7, 0.12)


def test_mixed_by_session_count_under_concurrency() -> None:
    w = make_workload(
        "mixed",
        seed=6,
        concurrency=8,
        num_sessions=300,
        params={"phase_sessions": 100, "phases": "1/0/0,0/1/0,0/0/1"},
    )
    kinds = [a.plan.kind for a in w.arrivals()]
    assert set(kinds[:100]) == {"coding"} and set(kinds[100:200]) == {"math"}
    assert set(kinds[200:]) == {"computer-use"}
    assert w.concurrency == 8


def test_same_seed_same_sessions_and_distinct_seeds_differ() -> None:
    a = plans(make_workload("mixed", seed=7, num_sessions=30))
    b = plans(make_workload("mixed", seed=7, num_sessions=30))
    c = plans(make_workload("mixed", seed=8, num_sessions=30))
    assert a == b
    assert a != c


def test_poisson_and_bursty_rates() -> None:
    poisson = make_workload("math", seed=9, session_rate_per_s=4.0, num_sessions=3_000)
    starts = [a.start_s for a in poisson.arrivals()]
    gaps = [y - x for x, y in itertools.pairwise(starts)]
    assert within(statistics.mean(gaps), 0.25, 0.08)
    assert within(statistics.stdev(gaps) / statistics.mean(gaps), 1.0, 0.1)
    bursty = make_workload(
        "math",
        seed=9,
        session_rate_per_s=4.0,
        num_sessions=3_000,
        params={"arrival": "bursty", "burstiness": 3.0},
    )
    starts = [a.start_s for a in bursty.arrivals()]
    gaps = [y - x for x, y in itertools.pairwise(starts)]
    assert within(statistics.mean(gaps), 0.25, 0.25)
    assert statistics.stdev(gaps) / statistics.mean(gaps) > 2.0


def test_duration_and_concurrency_limits() -> None:
    w = make_workload("math", seed=1, session_rate_per_s=10.0, duration_s=5.0)
    starts = [a.start_s for a in w.arrivals()]
    assert starts == sorted(starts) and starts[-1] <= 5.0 and 30 < len(starts) < 80
    pool = make_workload("math", seed=1, concurrency=4, num_sessions=10)
    assert [a.start_s for a in pool.arrivals()] == [0.0] * 10


@pytest.mark.parametrize(
    ("kind", "kwargs", "match"),
    [
        ("chat", {}, "unknown workload kind 'chat'"),
        ("coding", {"params": {"nope": 1}}, "unknown parameter 'nope' for coding"),
        ("coding", {"params": {"profile": "huge"}}, "unknown coding profile 'huge'"),
        ("math", {"params": {"max_turns": "many"}}, "parameter 'max_turns' for math"),
        ("math", {"session_rate_per_s": 1.0, "concurrency": 2}, "not both"),
        ("math", {"params": {"arrival": "wave"}}, "unknown arrival process 'wave'"),
        ("mixed", {"params": {"phases": "1/2"}}, "phases"),
    ],
)
def test_factory_rejects_bad_input(kind: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_workload(kind, seed=0, **kwargs)  # type: ignore[arg-type]


def test_human_pause_matches_tracelab_quantiles() -> None:
    # TraceLab think time: median 1.4 min, p90 20.6 min, p99 13.9 h.
    import random

    from evinfra.workloads.dists import LogNormalParetoTail
    from evinfra.workloads.stats import quantile

    dist = LogNormalParetoTail(4.43, 2.10, 0.95, 0.55)
    rng = random.Random(1)
    xs = sorted(dist.draw(rng) for _ in range(100_000))
    assert within(quantile(xs, 0.5), 84, 0.08)
    assert within(quantile(xs, 0.9), 1_236, 0.1)
    assert within(quantile(xs, 0.99), 50_040, 0.2)
