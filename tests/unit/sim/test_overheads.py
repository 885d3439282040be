"""The simulator's fixed per-request costs: `api_overhead_s` on every request's way in,
`handoff_overhead_s` on every disaggregated hand-off; both 0 by default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evinfra.sim.config import ConfigError, load_config
from evinfra.sim.metrics import RequestRecord
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation
from evinfra.workloads.types import SessionArrival
from tests.sim.toy import make_session, make_sim


def _run(disaggregated: bool, api_s: float = 0.0, handoff_s: float = 0.0) -> Simulation:
    """Two sessions of three calls each, far apart, so no request queues behind another."""
    sessions = [
        SessionArrival(0.0, make_session("a", 3, 200, 20, think_s=2.0)),
        SessionArrival(30.0, make_session("b", 3, 300, 10, think_s=2.0)),
    ]
    sim = make_sim(sessions, disaggregated=disaggregated, horizon_s=60.0)
    sim.settings = replace(sim.settings, api_overhead_s=api_s, handoff_overhead_s=handoff_s)
    sim.run()
    return sim


def _records(sim: Simulation) -> list[RequestRecord]:
    records = sorted(sim.metrics.records.values(), key=lambda r: r.request_id)
    assert len(records) == 6 and all(r.finish_s is not None for r in records)
    return records


def _ttft(r: RequestRecord) -> float:
    assert r.ttft_s is not None
    return r.ttft_s


def _e2e(r: RequestRecord) -> float:
    assert r.e2e_s is not None
    return r.e2e_s


@pytest.mark.parametrize("disaggregated", [False, True])
def test_api_overhead_adds_to_every_ttft_and_e2e(disaggregated: bool) -> None:
    base = _records(_run(disaggregated))
    slow = _records(_run(disaggregated, api_s=0.025))
    for b, s in zip(base, slow, strict=True):
        assert _ttft(s) - _ttft(b) == pytest.approx(0.025, abs=1e-9)
        assert _e2e(s) - _e2e(b) == pytest.approx(0.025, abs=1e-9)
    # closed loop: each later call is sent 25 ms later per call before it in its session
    assert slow[1].arrival_s - base[1].arrival_s == pytest.approx(0.025, abs=1e-9)
    assert slow[2].arrival_s - base[2].arrival_s == pytest.approx(0.050, abs=1e-9)


def test_handoff_overhead_adds_to_disaggregated_ttft_only() -> None:
    base = _records(_run(True))
    slow = _records(_run(True, handoff_s=0.030))
    for b, s in zip(base, slow, strict=True):
        assert _ttft(s) - _ttft(b) == pytest.approx(0.030, abs=1e-9)
        assert _e2e(s) - _e2e(b) == pytest.approx(0.030, abs=1e-9)
    # no hand-off in an aggregated run: nothing changes
    agg = _records(_run(False))
    agg_slow = _records(_run(False, handoff_s=0.030))
    assert [_ttft(r) for r in agg] == [_ttft(r) for r in agg_slow]


def test_a_call_inside_its_api_overhead_at_the_horizon_is_not_lost() -> None:
    # the second call is sent before the 10 s horizon and reaches the system after it,
    # across the KV tick at 10 s, where an idle simulation past its horizon stops
    sessions = [SessionArrival(0.0, make_session("a", 2, 100, 4, think_s=9.0))]
    sim = make_sim(sessions, horizon_s=10.0)
    sim.settings = replace(sim.settings, api_overhead_s=0.5)
    sim.run()
    records = sorted(sim.metrics.records.values(), key=lambda r: r.request_id)
    assert len(records) == 2
    assert records[1].arrival_s < 10.0 < records[1].arrival_s + 0.5
    assert records[1].finish_s is not None


def test_config_defaults_to_zero_and_rejects_negative() -> None:
    cfg = load_config(None, {})
    assert cfg.api_overhead_s == 0.0 and cfg.handoff_overhead_s == 0.0
    with pytest.raises(ConfigError, match="api_overhead_s"):
        load_config(None, {"api_overhead_s": -0.1})
    with pytest.raises(ConfigError, match="handoff_overhead_s"):
        load_config(None, {"handoff_overhead_s": -0.1})


def test_run_sim_passes_the_overheads_through() -> None:
    small = {
        "workload": "coding", "model": "tiny", "gpu": "h200", "num_gpus": 2,
        "gpus_per_node": 1, "block_size": 16, "cost_model": "dynamo-polynomial",
        "concurrency": 4, "duration_s": 10.0, "warmup_s": 0.0, "drain_s": 20.0,
        "system": "aggregated",
    }  # fmt: skip
    base = run_sim(load_config(None, small)).summary
    slow = run_sim(load_config(None, {**small, "api_overhead_s": 0.02})).summary
    assert slow["p50_ttft_s"] - base["p50_ttft_s"] == pytest.approx(0.02, abs=0.01)


def test_first_token_on_decode_step_waits_for_the_decode_pass() -> None:
    base = _records(_run(True))
    sim = _run_decode_step()
    later = _records(sim)
    for b, s in zip(base, later, strict=True):
        assert _ttft(s) > _ttft(b)
        # one decode pass of this toy model: 10 ms plus 0.01 ms per context token
        assert _ttft(s) - _ttft(b) == pytest.approx(
            0.010 + 1e-5 * (s.num_prompt_tokens + 1), abs=2e-3
        )
    assert not sim._awaiting_decode_step


def _run_decode_step() -> Simulation:
    sessions = [
        SessionArrival(0.0, make_session("a", 3, 200, 20, think_s=2.0)),
        SessionArrival(30.0, make_session("b", 3, 300, 10, think_s=2.0)),
    ]
    sim = make_sim(sessions, disaggregated=True, horizon_s=60.0)
    sim.settings = replace(sim.settings, first_token_on_decode_step=True)
    sim.run()
    return sim


def test_first_token_on_decode_step_inside_a_decode_run() -> None:
    # b's hand-off lands while a decodes a long run: b's first token is at the end of the
    # first pass it joins, never after its finish and never before its KV arrived
    sessions = [
        SessionArrival(0.0, make_session("a", 1, 100, 400, think_s=0.0)),
        SessionArrival(0.5, make_session("b", 1, 100, 50, think_s=0.0)),
    ]
    first_token_s = []
    for flag in (False, True):
        sim = make_sim(sessions, disaggregated=True, horizon_s=30.0)
        sim.settings = replace(sim.settings, first_token_on_decode_step=flag)
        sim.run()
        b = sim.metrics.records[1]
        assert b.first_token_s is not None and b.finish_s is not None
        assert b.first_token_s < b.finish_s - 0.1  # 49 more passes follow
        first_token_s.append(b.first_token_s)
    # the KV lands mid-pass: b waits for that pass to end, then runs one of its own
    assert 0.010 < first_token_s[1] - first_token_s[0] < 0.025
