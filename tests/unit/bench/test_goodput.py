from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.bench.goodput import (
    Bisection,
    Bound,
    PointVerdict,
    goodput_ratio,
    judge,
)
from evinfra.bench.scenario import GoodputSpec


def make_spec(**kw: Any) -> GoodputSpec:
    values: dict[str, Any] = {
        "ttft_p95_s": 1.0,
        "tpot_mean_s": 0.05,
        "rate_lo": 1.0,
        "rate_hi": 9.0,
        "iterations": 3,
    }
    values.update(kw)
    return GoodputSpec(**values)


def make_summary(
    ttft: float = 0.5, tpot: float = 0.02, done: int = 100, left: int = 0
) -> dict[str, float]:
    return {"p95_ttft_s": ttft, "mean_tpot_s": tpot, "num_requests": done, "num_unfinished": left}


def test_judge_checks_each_target() -> None:
    spec = make_spec()
    assert judge(1.0, [make_summary()], spec).passed
    assert "TTFT" in judge(1.0, [make_summary(ttft=1.5)], spec).reason
    assert "TPOT" in judge(1.0, [make_summary(tpot=0.06)], spec).reason
    assert "unfinished" in judge(1.0, [make_summary(done=90, left=10)], spec).reason
    assert not judge(1.0, [make_summary(), None], spec).passed
    assert not judge(1.0, [make_summary(ttft=float("nan"))], spec).passed
    assert not judge(1.0, [make_summary(done=0)], spec).passed


def test_judge_uses_the_mean_over_seeds() -> None:
    spec = make_spec()
    # one seed over the target, the mean under it
    assert judge(1.0, [make_summary(ttft=1.2), make_summary(ttft=0.6)], spec).passed
    assert not judge(1.0, [make_summary(ttft=1.6), make_summary(ttft=0.6)], spec).passed


def test_the_queue_rule_fails_a_growing_queue_only_when_set() -> None:
    growing = make_summary() | {"waiting_growth_s": 3.0}
    steady = make_summary() | {"waiting_growth_s": 0.2}
    off = make_spec()
    assert judge(1.0, [growing], off).passed
    assert "queue +3.00s" in judge(1.0, [growing], off).reason
    on = make_spec(max_waiting_growth_s=2.0)
    assert judge(1.0, [steady], on).passed
    assert judge(1.0, [growing], on).reason == "queue grew 3.00s > 2.0s"
    # the mean over seeds, as for the other targets
    assert judge(1.0, [growing, steady], on).passed
    # a summary without the trend cannot be judged by the rule
    assert not judge(1.0, [make_summary()], on).passed
    assert judge(1.0, [make_summary()], off).passed
    with pytest.raises(ValueError, match="max_waiting_growth_s"):
        make_spec(max_waiting_growth_s=0.0)


def run_search(b: Bisection, threshold: float) -> list[list[float]]:
    """Drive the search against 'passes iff rate <= threshold'; returns each round's loads."""
    rounds = []
    while values := b.next_values():
        rounds.append(values)
        for v in values:
            b.record(PointVerdict(v, v <= threshold, ""))
    return rounds


def test_bisection_order_ends_then_midpoints() -> None:
    b = Bisection(make_spec())
    rounds = run_search(b, threshold=3.0)
    assert rounds == [[1.0, 9.0], [5.0], [3.0], [4.0]]
    r = b.result()
    assert r.bound is Bound.EXACT
    assert (r.rate, r.upper) == (3.0, 4.0)


def test_all_pass_and_all_fail() -> None:
    b = Bisection(make_spec())
    run_search(b, threshold=100.0)
    assert b.result().bound is Bound.AT_LEAST
    assert b.result().rate == 9.0
    b = Bisection(make_spec())
    run_search(b, threshold=0.5)
    r = b.result()
    assert r.bound is Bound.BELOW
    assert (r.rate, r.upper) == (0.0, 1.0)


def test_known_points_narrow_the_bracket() -> None:
    b = Bisection(make_spec(iterations=1))
    for v, ok in ((1.0, True), (3.0, True), (5.0, False), (9.0, False)):
        b.record(PointVerdict(v, ok, ""))
    assert b.next_values() == [4.0]


def test_non_monotone_points_take_the_lowest_failure() -> None:
    b = Bisection(make_spec(iterations=0))
    for v, ok in ((1.0, True), (3.0, False), (5.0, True), (9.0, False)):
        b.record(PointVerdict(v, ok, ""))
    r = b.result()
    assert (r.rate, r.upper) == (1.0, 3.0)


def test_limit_bisections() -> None:
    b = Bisection(make_spec(iterations=5))
    b.limit_bisections(1)
    rounds = run_search(b, threshold=3.0)
    assert len(rounds) == 2


@settings(max_examples=60, deadline=None)
@given(
    threshold=st.floats(min_value=1.0, max_value=8.99),
    iterations=st.integers(min_value=0, max_value=8),
)
def test_bisection_brackets_the_threshold(threshold: float, iterations: int) -> None:
    spec = make_spec(iterations=iterations)
    b = Bisection(spec)
    run_search(b, threshold)
    r = b.result()
    assert r.bound is Bound.EXACT
    assert r.upper is not None
    assert r.rate <= threshold < r.upper
    # each bisection halves the bracket (up to the 4-digit rounding of midpoints)
    width = (spec.rate_hi - spec.rate_lo) / 2**iterations
    assert r.upper - r.rate <= width * 1.01 + 1e-3


def test_rate_max_steps_up_until_a_load_fails_then_bisects() -> None:
    b = Bisection(make_spec(rate_max=30.0, iterations=2))
    rounds = run_search(b, threshold=15.0)
    # 9 passes: x1.5 to 13.5 (passes), 20.25 (fails); then two midpoints of [13.5, 20.25]
    assert rounds == [[1.0, 9.0], [13.5], [20.25], [16.88], [15.19]]
    r = b.result()
    assert r.bound is Bound.EXACT
    assert (r.rate, r.upper) == (13.5, 15.19)
    assert b.num_bisections == 2


def test_rate_max_caps_the_steps() -> None:
    b = Bisection(make_spec(rate_max=12.0))
    rounds = run_search(b, threshold=100.0)
    assert rounds == [[1.0, 9.0], [12.0]]
    r = b.result()
    assert r.bound is Bound.AT_LEAST
    assert r.rate == 12.0
    # without rate_max the search stops at rate_hi
    b = Bisection(make_spec())
    assert run_search(b, threshold=100.0) == [[1.0, 9.0]]


def test_rate_max_does_not_step_when_a_load_fails() -> None:
    b = Bisection(make_spec(rate_max=30.0, iterations=1))
    assert run_search(b, threshold=3.0) == [[1.0, 9.0], [5.0]]


def test_rate_max_must_be_above_rate_hi() -> None:
    with pytest.raises(ValueError, match="rate_max"):
        make_spec(rate_max=9.0)


def test_goodput_ratio() -> None:
    b1 = Bisection(make_spec(iterations=0))
    run_search(b1, threshold=100)
    b0 = Bisection(make_spec(iterations=2))
    run_search(b0, threshold=4.0)
    assert b0.result().rate == 3.0
    assert goodput_ratio(b1.result(), b0.result()) == pytest.approx(3.0)
    below = Bisection(make_spec())
    run_search(below, threshold=0.1)
    assert goodput_ratio(b1.result(), below.result()) is None
