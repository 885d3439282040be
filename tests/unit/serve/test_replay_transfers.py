"""`evinfra replay` sums the KV bytes a server reports per call (evinfra's
`usage.kv_transfer_details`), and says "unknown" (NaN), not 0, for a server that reports
none (Dynamo's frontend)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping

from evinfra.serve.openai_api import usage
from evinfra.serve.replay import Replayer, ReplaySettings, Trace
from evinfra.sim.metrics import KV_BYTES_KEYS
from evinfra.workloads.factory import make_workload


def _replayer() -> Replayer:
    workload = make_workload("coding", seed=0, concurrency=1, num_sessions=1)
    r = Replayer(ReplaySettings(url="http://127.0.0.1:9", model="m"), workload)
    r._t0 = time.monotonic()
    return r


def _served(r: Replayer, rid: int, use: Mapping[str, object]) -> Trace:
    """One call streamed as evinfra streams it: two tokens, then the usage chunk."""
    trace = Trace(rid, "s0", r.now_s(), 100, 2)
    r.traces.append(trace)
    lines = (
        {"choices": [{"text": "a", "finish_reason": None}]},
        {"choices": [{"text": "b", "finish_reason": "length"}]},
        {"choices": [], "usage": use},
    )
    for line in lines:
        r._on_line(trace, "data: " + json.dumps(line))
    trace.finish_s = r.now_s()
    return trace


def test_replay_sums_the_servers_hand_offs_and_pulls() -> None:
    r = _replayer()
    a = _served(r, 0, usage(100, 2, 64, num_transfer_bytes=5_000, num_pulled_bytes=0))
    b = _served(r, 1, usage(100, 2, 64, num_transfer_bytes=9_000, num_pulled_bytes=3_000))
    assert (a.num_handed_off_bytes, a.num_pulled_bytes) == (5_000, 0)
    assert (b.num_handed_off_bytes, b.num_pulled_bytes) == (6_000, 3_000)
    summary = r._summary(r.now_s() + 1.0)
    assert summary["kv_bytes_moved"] == 14_000
    assert summary["kv_bytes_handed_off"] == 11_000
    assert summary["kv_bytes_pulled"] == 3_000
    assert summary["kv_bytes_migrated"] == 0
    assert b.to_json()["num_pulled_bytes"] == 3_000


def test_a_server_that_reports_no_transfers_gives_unknown_not_zero() -> None:
    r = _replayer()
    plain = {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}
    t = _served(r, 0, plain)
    assert t.num_handed_off_bytes is None and t.num_pulled_bytes is None
    summary = r._summary(r.now_s() + 1.0)
    assert summary["num_requests"] == 1
    assert all(math.isnan(summary[k]) for k in KV_BYTES_KEYS)


def test_malformed_usage_fails_the_call_with_a_message_not_the_replay() -> None:
    r = _replayer()
    bad = {"completion_tokens": 2, "kv_transfer_details": {"handed_off_bytes": "lots"}}
    t = _served(r, 0, bad)
    assert t.error is not None and "malformed usage" in t.error and "lots" in t.error
    assert _served(r, 1, {"completion_tokens": 2, "kv_transfer_details": [1]}).error
    odd = Trace(2, "s0", r.now_s(), 100, 2)
    r.traces.append(odd)
    assert r._on_line(odd, "data: [1, 2]") and odd.error is not None
    assert r._summary(r.now_s() + 1.0)["num_errors"] == 3
