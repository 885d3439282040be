"""`evinfra replay` against a live server (timed executor: no model work, fast start):
closed-loop agent sessions bounded in requests and time, per-request TTFT/ITL/e2e, and the
simulator's summary keys."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from evinfra.serve.cli import main as serve_cli
from evinfra.serve.replay import ReplaySettings, run_replay
from evinfra.serve.testing import ServerProcess
from evinfra.sim.metrics import Metrics, summarize
from evinfra.workloads.factory import make_workload

SIM_KEYS = set(summarize(Metrics(), warmup_s=0.0, end_s=1.0, num_gpus=1))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    args = ["--executor", "timed", "--model", "tiny", "--num-nodes", "2", "--num-blocks", "512"]
    with ServerProcess([*args, "--system", "least-loaded"]) as srv:
        yield srv


def test_closed_loop_replay_summarises_with_the_sim_keys(server: ServerProcess) -> None:
    workload = make_workload("coding", seed=1, concurrency=3, num_sessions=4)
    settings = ReplaySettings(
        url=server.url, max_requests=12, max_duration_s=30.0, token_scale=0.05, label="local"
    )
    result = run_replay(settings, workload)
    summary = result.summary
    assert set(summary) >= SIM_KEYS
    assert summary["system"] == "local"
    assert summary["num_requests"] == 12 and summary["num_unfinished"] == 0
    assert summary["num_errors"] == 0
    assert 0 < summary["p50_ttft_s"] <= summary["p95_ttft_s"] < 5
    assert summary["mean_e2e_s"] >= summary["mean_ttft_s"]
    assert not math.isnan(summary["p95_itl_s"])
    # later calls of a session resend its history: the server's cache serves part of it
    assert summary["kv_hit_rate"] > 0.2
    # the server reports what it moved (here nothing: least-loaded keeps a call on one
    # node), so the sum is a known 0, not unknown
    assert summary["kv_bytes_moved"] == 0 == summary["kv_bytes_pulled"]
    traces = result.traces
    assert len(traces) == 12
    for t in traces:
        assert t.error is None and t.finish_s is not None
        assert t.num_output_tokens == t.max_tokens  # ignore_eos: exact output lengths
        assert len(t.chunk_s) >= 1
    # closed loop: a session's calls never overlap
    by_session: dict[str, list[tuple[float, float]]] = {}
    for t in traces:
        assert t.finish_s is not None
        by_session.setdefault(t.session_id, []).append((t.send_s, t.finish_s))
    for spans in by_session.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end


def test_replay_stops_at_its_time_bound(server: ServerProcess) -> None:
    workload = make_workload("coding", seed=2, concurrency=2)
    settings = ReplaySettings(
        url=server.url, max_requests=10_000, max_duration_s=1.5, drain_s=5.0, token_scale=0.05
    )
    result = run_replay(settings, workload)
    assert result.summary["wall_s"] < 1.5 + 5.0 + 1.0
    assert all(t.send_s < 1.5 for t in result.traces)


def test_replay_cli_writes_summary_and_requests(server: ServerProcess, tmp_path: Path) -> None:
    code = serve_cli(
        [
            "replay", "--url", server.url, "--workload", "math", "--concurrency", "2",
            "--max-requests", "5", "--max-duration-s", "30", "--token-scale", "0.05",
            "--no-hints", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) >= SIM_KEYS and summary["num_requests"] == 5
    rows = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all(r["ttft_s"] is not None for r in rows)


def test_replay_cuts_every_call_to_its_context_limit(server: ServerProcess) -> None:
    """`--max-context-tokens` below what the server lists (its KV, 8,192 tokens): every
    call is sent cut to the limit and served."""
    workload = make_workload("coding", seed=2, concurrency=2, num_sessions=2)
    settings = ReplaySettings(url=server.url, max_requests=4, max_duration_s=30.0,
                              token_scale=0.1, max_context_tokens=300)  # fmt: skip
    result = run_replay(settings, workload)
    assert result.summary["server_max_model_len"] == 512 * 16
    assert result.summary["max_context_tokens"] == 300
    assert result.summary["num_cut_calls"] >= 1 and result.summary["num_errors"] == 0
    for t in result.traces:
        assert t.num_prompt_tokens + t.max_tokens <= 300
        assert t.num_output_tokens == t.max_tokens


def test_timed_server_streams_visible_text_with_every_token(server: ServerProcess) -> None:
    """Each pseudo-token prints on its own, so a client that times the first token by the
    first text (aiperf) sees it when the server sends it, and one chunk per token after."""
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "w" * 200}],
        "max_tokens": 48, "stream": True, "ignore_eos": True,
    }  # fmt: skip
    contents: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[len("data: ") :])["choices"]:
                if (content := choice["delta"].get("content")) is not None:
                    contents.append(content)
    text = [c for c in contents if c]
    assert len(text) == 48 and all(len(c) == 1 and c.isprintable() for c in text)


def _counter(server: ServerProcess, name: str) -> int:
    for line in server.get("/metrics").text.splitlines():
        if line.startswith(f"evinfra_{name} "):
            return int(line.split()[1])
    raise AssertionError(f"no evinfra_{name}")


def test_replay_sums_the_kv_a_disaggregated_server_moves() -> None:
    """Prefill on node 0, decode on node 1: every call's KV is handed off, the server says
    how many bytes in each response's usage, and the replay's summary adds up to the
    server's own counter."""
    args = [
        "--executor", "timed", "--model", "tiny", "--num-nodes", "2", "--num-blocks", "512",
        "--system", "dynamo", "--system-option", "num_prefill_nodes=1",
        "--system-option", "conditional_disagg=false", "--system-option", "planner=none",
    ]  # fmt: skip
    with ServerProcess(args) as srv:
        before = _counter(srv, "kv_transfer_bytes_total")
        workload = make_workload("coding", seed=3, concurrency=2, num_sessions=3)
        settings = ReplaySettings(url=srv.url, max_requests=6, max_duration_s=30.0,
                                  token_scale=0.05)  # fmt: skip
        result = run_replay(settings, workload)
        moved = _counter(srv, "kv_transfer_bytes_total") - before
        assert _counter(srv, "kv_pulled_bytes_total") == 0
    summary = result.summary
    assert summary["num_requests"] == 6 and summary["num_errors"] == 0
    assert summary["kv_bytes_moved"] == moved > 0
    assert summary["kv_bytes_handed_off"] == moved and summary["kv_bytes_pulled"] == 0
    # each call says (0 where the decode node held every full block of it already)
    assert all(t.num_handed_off_bytes is not None for t in result.traces)
    assert sum(t.num_handed_off_bytes or 0 for t in result.traces) == moved


def test_usage_of_a_response_cut_by_a_stop_string_counts_its_cached_prompt() -> None:
    """A stop string ends the response while the server still runs the request: its usage
    still reports the prompt tokens served from cache (set as the prefill reports them,
    not when the request finishes). One node, so the second call finds the first's KV."""
    ids = [5 + (i * 31) % 200 for i in range(100)]
    body: dict[str, object] = {"model": "tiny", "prompt": ids, "max_tokens": 200,
                               "temperature": 0.0, "ignore_eos": True}  # fmt: skip
    args = ["--executor", "timed", "--model", "tiny", "--num-nodes", "1", "--num-blocks", "64"]
    with ServerProcess(args) as srv:
        first = srv.post("/v1/completions", json=body).json()
        text = first["choices"][0]["text"]
        stop = text[3:6]
        assert len(text) == 200 and text.index(stop) == 3
        cut = srv.post("/v1/completions", json=body | {"stop": [stop]}).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == text[:3]
    assert cut["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # 6 blocks of 16
