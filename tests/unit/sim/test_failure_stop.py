"""Stopping a run once it is certain to fail its P95 TTFT target (`stop_past_ttft_p95_s`):
the rule's arithmetic, its soundness against the judge of the whole run, and whole runs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.bench.goodput import judge
from evinfra.bench.scenario import GoodputSpec
from evinfra.sim.config import ConfigError, SimConfig, load_config
from evinfra.sim.failure_stop import FailureStop, num_calls_before, num_calls_by
from evinfra.sim.metrics import Metrics, RequestRecord, summarize
from evinfra.sim.runner import build_workload, run_sim
from evinfra.workloads.types import Call, SessionArrival, SessionPlan

TARGET_S = 1.0


def _stop(num_calls_total: int, *, frac: float = 0.01) -> FailureStop:
    return FailureStop(
        ttft_p95_s=TARGET_S,
        max_unfinished_frac=frac,
        warmup_s=10.0,
        horizon_s=100.0,
        count_calls=lambda: num_calls_total,
    )


def _record(rid: int, arrival_s: float, ttft_s: float | None, done: bool = True) -> RequestRecord:
    rec = RequestRecord(rid, f"s{rid}", "toy", arrival_s, 100, 10)
    if ttft_s is not None:
        rec.first_token_s = arrival_s + ttft_s
        if done:
            rec.finish_s = rec.first_token_s + 1.0
    return rec


def test_counts_the_calls_a_session_can_send_before_the_horizon() -> None:
    # a call goes out its think time after its predecessor at the earliest; a forked
    # session starts when its parent call goes out at the earliest
    leaf = SessionPlan("c", "toy", (Call((), 1, 1, 1.0), Call((), 1, 2, 3.0)))
    root = SessionPlan("r", "toy", (Call((), 1, 3, 0.0, forks=(leaf, leaf)), Call((), 1, 4, 2.0)))
    assert num_calls_by(leaf, 0.0, 100.0) == 2 and num_calls_by(root, 0.0, 100.0) == 6
    # at 3.5 the leaves' second calls (4 s in) and nothing after 2 s of the root are out
    assert num_calls_by(root, 0.0, 3.5) == 4
    assert num_calls_by(root, 0.0, 2.0) == 3
    arrivals = [SessionArrival(0.0, root), SessionArrival(5.0, leaf), SessionArrival(9.0, root)]
    assert num_calls_before(iter(arrivals), 9.0) == 6 + 1  # the leaf at 5: its 2nd at 9
    assert num_calls_before(iter(arrivals), 9.5) == 6 + 2 + 1


def test_stops_at_the_bound_and_not_before() -> None:
    # 100 window calls so far, 100 more could come: at most 200, so (with no unfinished
    # calls allowed) 0.05 x 200 + 2 = 12 late calls stop the run
    records = {i: _record(i, 10.0 + i * 0.1, 2.0 if i < 11 else 0.5) for i in range(100)}
    assert _stop(num_calls_total=200, frac=0.0).check(records, 100, 50.0, ()) is None
    records[11] = _record(11, records[11].arrival_s, 2.0)
    why = _stop(num_calls_total=200, frac=0.0).check(records, 100, 50.0, ())
    assert why is not None and "12 calls past the 1 s TTFT target of at most 200" in why


def test_a_call_waiting_past_the_target_counts_unless_its_first_token_may_be_stamped_earlier() -> (
    None
):
    # the call before the warm-up is not in the window: 19 calls, 202 more may come, so at
    # most 221 and 0.06 x 221 + 2 = 15.26 late calls stop the run
    records = {i: _record(i, 20.0, None) for i in range(1, 20)}
    records[0] = _record(0, 5.0, 9.0)
    assert _stop(num_calls_total=223).check(records, 21, 22.0, ()) is not None
    stop = _stop(num_calls_total=223)
    assert stop.check(records, 21, 20.5, ()) is None  # nobody has waited a second yet
    # at 22 all 19 have waited 2 s, but 6 are handed off and wait for a first decode step
    # whose token may be stamped back in time
    awaiting = set(range(1, 7))
    assert stop.check(records, 21, 22.0, awaiting) is None
    assert stop.num_window == 19 and stop.num_late == 13
    # their first tokens come in on time: still 13 late
    for i in awaiting:
        records[i] = _record(i, 20.0, 0.9, done=False)
    assert stop.check(records, 21, 23.0, ()) is None
    assert stop.num_late == 13


def test_past_the_horizon_the_window_is_the_bound() -> None:
    # before the horizon 1,000 calls could still come; after it, only the 40 sent count
    records = {i: _record(i, 50.0 + i, 5.0 if i < 5 else 0.1) for i in range(40)}
    assert _stop(num_calls_total=1_040).check(records, 40, 99.0, ()) is None
    assert _stop(num_calls_total=1_040).check(records, 40, 100.0, ()) is not None


def _stops_at_the_end(records: dict[int, RequestRecord], frac: float) -> bool:
    """The rule, checking once every call is in (after the horizon)."""
    return _stop(len(records), frac=frac).check(records, len(records), 100.0, ()) is not None


def _fails(records: dict[int, RequestRecord], frac: float) -> bool:
    summary = summarize(Metrics(records=records), warmup_s=10.0, end_s=100.0, num_gpus=1)
    spec = GoodputSpec(
        ttft_p95_s=TARGET_S, tpot_mean_s=10.0, rate_lo=1, rate_hi=2, max_unfinished_frac=frac
    )
    return not judge(1.0, [summary], spec).passed


@settings(max_examples=300, deadline=None)
@given(
    num_on_time=st.integers(0, 200),
    num_cut=st.integers(0, 3),
    num_waiting=st.integers(0, 3),
    frac=st.sampled_from([0.0, 0.01, 0.03]),
    check_at=st.one_of(st.just(1.0), st.floats(0.0, 1.0)),
    data=st.data(),
)
def test_a_stop_means_the_whole_run_fails(
    num_on_time: int,
    num_cut: int,
    num_waiting: int,
    frac: float,
    check_at: float,
    data: st.DataObject,
) -> None:
    """Whatever the rest of the run does, a run the rule stops fails the judge: the run
    ends with calls finished on time and late, calls with a first token left unfinished
    (cut) and calls with none (waiting), in any order; the rule checks once, at any time
    in the window, seeing the calls sent and the first tokens stamped by then. The late
    calls are drawn near 5% of the run, where the judge's verdict turns."""
    num_late = data.draw(st.integers(num_on_time // 40, num_on_time // 14 + 3))
    kinds = ["on"] * num_on_time + ["late"] * num_late + ["cut"] * num_cut
    kinds += ["waiting"] * num_waiting
    if not kinds:
        return
    kinds = data.draw(st.permutations(kinds))
    n = len(kinds)
    end: dict[int, RequestRecord] = {}
    for i, kind in enumerate(kinds):
        arrival = 10.0 + 80.0 * i / n
        if kind == "on":
            end[i] = _record(i, arrival, data.draw(st.floats(0.0, TARGET_S)))
        elif kind == "late":
            ttft = data.draw(st.floats(TARGET_S, 3.0, exclude_min=True))
            end[i] = _record(i, arrival, ttft)
        elif kind == "cut":
            end[i] = _record(i, arrival, data.draw(st.floats(0.0, 3.0)), done=False)
        else:
            end[i] = _record(i, arrival, None)
    now = 10.0 + 92.0 * check_at
    seen = {}
    for i, rec in end.items():
        if rec.arrival_s <= now:
            early = _record(i, rec.arrival_s, None)
            if rec.first_token_s is not None and rec.first_token_s <= now:
                early.first_token_s = rec.first_token_s
            seen[i] = early
    if _stop(n, frac=frac).check(seen, len(seen), now, ()) is not None:
        assert _fails(end, frac)


def _run_of(num_on: int, num_late: int, num_cut: int) -> dict[int, RequestRecord]:
    """On-time calls at 0 s, late ones just past the target, then unfinished late ones:
    the worst case for the rule, as P95 TTFT, interpolated, stays within the target until
    a late call reaches its index."""
    late_s = TARGET_S * (1 + 1e-9)
    ttfts = [0.0] * num_on + [late_s] * num_late
    records = {i: _record(i, 20.0, t) for i, t in enumerate(ttfts)}
    for i in range(len(ttfts), len(ttfts) + num_cut):
        records[i] = _record(i, 20.0, late_s, done=False)
    return records


def test_the_bound_is_sound_where_the_judge_turns() -> None:
    """Every run of up to 120 calls with up to 12 late and up to 3 unfinished: the rule
    never stops a run the judge passes."""
    for n in range(1, 121):
        for num_cut in range(4):
            for num_late in range(min(13, n - num_cut + 1)):
                records = _run_of(n - num_cut - num_late, num_late, num_cut)
                for frac in (0.0, 0.01, 0.03):
                    if _stops_at_the_end(records, frac):
                        assert _fails(records, frac), (n, num_cut, num_late, frac)
    # and it stops within about a call of where the judge turns: 100 calls, 6 late fail
    assert _fails(_run_of(94, 6, 0), 0.0) and not _fails(_run_of(95, 5, 0), 0.0)
    assert _stops_at_the_end(_run_of(93, 7, 0), 0.0)
    assert not _stops_at_the_end(_run_of(94, 6, 0), 0.0)


def _tiny(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {
        "workload": "coding",
        "model": "llama-3-70b",
        "gpu": "gb300",
        "num_gpus": 2,
        "gpus_per_node": 1,
        "duration_s": 30,
        "warmup_s": 3,
        "drain_s": 30,
        "system": "dynamo",
    }
    return SimConfig(**{**base, **kw})


def test_an_overloaded_run_stops_early_and_fails_as_the_whole_run_does() -> None:
    spec = GoodputSpec(ttft_p95_s=0.4, tpot_mean_s=10.0, rate_lo=1, rate_hi=2)
    full_run = run_sim(_tiny(session_rate=4.0))
    full = full_run.summary
    # the bound holds: no more calls went out than the think times allow
    sent = len(full_run.metrics.records) + full["num_rejected"]
    assert sent <= num_calls_before(build_workload(full_run.config).arrivals(), 30.0)
    cut = run_sim(_tiny(session_rate=4.0, stop_past_ttft_p95_s=0.4)).summary
    assert "stopped_s" not in full
    assert not judge(4.0, [full], spec).passed
    assert cut["stopped_s"] is not None and cut["stopped_s"] < full["sim_end_s"]
    assert cut["sim_events"] < full["sim_events"]
    verdict = judge(4.0, [cut], spec)
    assert not verdict.passed and verdict.reason.startswith("stopped at")


def test_a_run_that_is_not_stopped_is_the_same_run() -> None:
    plain = run_sim(_tiny(session_rate=0.25)).summary
    watched = run_sim(_tiny(session_rate=0.25, stop_past_ttft_p95_s=0.4)).summary
    assert watched.pop("stopped_s") is None and watched.pop("stopped_reason") is None
    skip = {"wall_s", "events_per_s", "sim_s_per_wall_s"}
    assert {k: v for k, v in watched.items() if k not in skip} == pytest.approx(
        {k: v for k, v in plain.items() if k not in skip}, nan_ok=True
    )


def test_needs_countable_calls() -> None:
    with pytest.raises(ConfigError, match="stop_past_ttft_p95_s needs"):
        load_config(None, {"concurrency": 4, "stop_past_ttft_p95_s": 2.0})
