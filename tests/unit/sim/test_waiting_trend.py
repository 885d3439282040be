"""The summary's waiting-queue trend: `num_waiting_end` and `waiting_growth_s`, the rise of the
least-squares line through the window's samples of waiting calls, in seconds of the
window's finished calls."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evinfra.bench.store import read_summary
from evinfra.sim.config import load_config
from evinfra.sim.metrics import QUEUE_KEYS, waiting_growth_s, waiting_trend
from evinfra.sim.runner import run_sim


def test_a_steady_queue_rises_by_nothing_however_long() -> None:
    end, rise = waiting_trend([0, 10, 20, 30, 40], [500] * 5, warmup_s=0.0, end_s=40.0)
    assert end == 500 and rise == pytest.approx(0.0, abs=1e-9)


def test_a_queue_growing_all_window_rises_by_its_growth() -> None:
    # 2 calls a second over the 100 s window [50, 150]; samples outside it do not count
    times = [0, 25, 50, 75, 100, 125, 150, 175]
    waiting = [999, 0, 10, 60, 110, 160, 210, 0]
    end, rise = waiting_trend(times, waiting, warmup_s=50.0, end_s=150.0)
    assert end == 210 and rise == pytest.approx(200.0)
    # 1,000 calls finished in the 100 s: 10 a second, so 200 calls are 20 s of them
    assert waiting_growth_s(rise, 1000, 100.0) == pytest.approx(20.0)


def test_too_few_samples_or_calls_give_nan() -> None:
    assert all(math.isnan(x) for x in waiting_trend([5.0], [3], warmup_s=0.0, end_s=10.0))
    assert math.isnan(waiting_trend([5.0, 5.0], [3, 4], warmup_s=0.0, end_s=10.0)[1])
    assert math.isnan(waiting_growth_s(10.0, 0, 100.0))
    assert math.isnan(waiting_growth_s(math.nan, 10, 100.0))


def _summary(session_rate: float, **extra: float) -> dict[str, float]:
    cfg = load_config(
        None,
        {
            "workload": "coding", "model": "tiny", "gpu": "h200", "num_gpus": 1,
            "gpus_per_node": 1, "block_size": 16, "cost_model": "dynamo-polynomial",
            "session_rate": session_rate, "duration_s": 80.0, "warmup_s": 20.0,
            "drain_s": 30.0, "sample_interval_s": 5.0, "system": "aggregated",
        } | extra,
    )  # fmt: skip
    return run_sim(cfg).summary


def test_an_overloaded_node_reports_its_queue_growing_and_a_light_one_does_not() -> None:
    # one node: 1 session/s leaves nothing waiting, 12 queue hundreds of calls and add
    # seconds of wait over the window (its P95 TTFT about as many)
    light, heavy = _summary(1.0), _summary(12.0)
    assert light["waiting_growth_s"] == pytest.approx(0.0, abs=0.5)
    assert heavy["num_waiting_end"] > 200
    assert heavy["waiting_growth_s"] > 4.0


def test_a_run_stopped_early_has_no_trend() -> None:
    """Its samples end at the stop: a line through them says nothing of the window."""
    stopped = _summary(8.0, stop_past_ttft_p95_s=2.0)
    assert stopped["stopped_s"] is not None
    assert math.isnan(stopped["num_waiting_end"]) and math.isnan(stopped["waiting_growth_s"])


def test_a_stored_run_gets_its_trend_from_its_timeseries_unless_stopped(tmp_path: Path) -> None:
    """Runs stored before the summary had the trend: bench --resume and goodput_points
    read it from timeseries.json, over the same window."""
    samples = [{"time_s": float(t), "num_waiting_requests": 3 * t} for t in range(0, 130, 10)]
    (tmp_path / "timeseries.json").write_text(json.dumps(samples))
    summary = {"warmup_s": 20.0, "window_s": 100.0, "num_requests": 600}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    got = read_summary(tmp_path)
    # 3 calls a second over 100 s, 6 calls finished a second: 50 s
    assert got["num_waiting_end"] == 360
    assert got["waiting_growth_s"] == pytest.approx(50.0)
    (tmp_path / "summary.json").write_text(json.dumps(summary | {"stopped_s": 70.0}))
    assert all(math.isnan(read_summary(tmp_path)[k]) for k in QUEUE_KEYS)
