"""Trace loaders: formats, rate scaling, malformed rows, the shared traces."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from evinfra.core.blocks import common_prefix_len
from evinfra.workloads.factory import detect_format, load_trace, make_workload
from evinfra.workloads.requests import make_request
from evinfra.workloads.session_jsonl import write_session_jsonl
from evinfra.workloads.stats import workload_stats


def write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def mooncake_row(ts: int, n: int, ids: list[int], out: int = 10) -> dict[str, object]:
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids}


def test_mooncake_rows_are_open_loop_calls_sharing_blocks(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        [
            mooncake_row(0, 1_200, [0, 1, 2]),
            mooncake_row(500, 1_500, [0, 1, 3]),
            mooncake_row(2_000, 700, [4, 5]),
        ],
    )
    w = load_trace(path, rate_scale=2.0)
    arrivals = list(w.arrivals())
    assert [a.start_s for a in arrivals] == [0.0, 0.25, 1.0]
    assert all(len(a.plan.calls) == 1 for a in arrivals)
    r0, r1, r2 = (make_request(i, a.plan, 0, 512, True) for i, a in enumerate(arrivals))
    assert len(r0.prompt_hashes) == 2 and r0.num_prompt_tokens == 1_200
    assert common_prefix_len(r0.prompt_hashes, r1.prompt_hashes) == 2
    assert common_prefix_len(r0.prompt_hashes, r2.prompt_hashes) == 0
    # At a finer block size the shared blocks still hit, the partial one partly.
    f0, f1 = (make_request(9, a.plan, 0, 64, False) for a in arrivals[:2])
    assert common_prefix_len(f0.prompt_hashes, f1.prompt_hashes) == 16


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ({"timestamp": 1, "input_length": 10, "output_length": 1}, "line 2: field 'hash_ids'"),
        (mooncake_row(1, 600, [0]), "line 2: field 'hash_ids' has 1 ids"),
        ({**mooncake_row(1, 10, [0]), "timestamp": "x"}, "line 2: field 'timestamp'"),
        ({**mooncake_row(1, 10, [0]), "input_length": 0}, "line 2: field 'input_length'"),
        ({**mooncake_row(1, 10, [0]), "output_length": -3}, "line 2: field 'output_length'"),
        ([1, 2], "line 2: a row must be a JSON object"),
    ],
)
def test_mooncake_rejects_malformed_rows(tmp_path: Path, row: object, message: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [mooncake_row(0, 10, [0]), row])
    with pytest.raises(ValueError, match=message):
        load_trace(path, fmt="mooncake")


def test_azure_csv(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:05.9799600,300,0\n"
    )
    arrivals = list(load_trace(path).arrivals())
    assert [round(a.start_s, 6) for a in arrivals] == [0.0, 2.0]
    assert arrivals[0].plan.calls[0].num_prompt_tokens == 4_808
    assert arrivals[1].plan.calls[0].num_output_tokens == 1
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,12,3\n"
        "2023-11-16 18:17:04,twelve,3\n"
    )
    with pytest.raises(ValueError, match=r"a\.csv line 3: field 'ContextTokens'"):
        load_trace(path)
    path.write_text("time,in,out\n")
    with pytest.raises(ValueError, match=r"a\.csv line 1: expected the header"):
        load_trace(path)


def test_session_jsonl_hash_id_rows_replay_closed_loop(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "s.jsonl",
        [
            {**mooncake_row(1_000, 600, [0, 1]), "session_id": "a", "turn": 0},
            {**mooncake_row(1_500, 700, [2, 3]), "session_id": "b"},
            {**mooncake_row(9_000, 1_100, [0, 1, 4]), "session_id": "a", "tool_s": 2.5},
            {**mooncake_row(12_000, 1_200, [0, 1, 4]), "session_id": "a"},
        ],
    )
    assert detect_format(path) == "session"
    w = load_trace(path, rate_scale=0.5)
    a, b = list(w.arrivals())
    assert (a.start_s, b.start_s) == (2.0, 3.0)
    assert [c.think_s for c in a.plan.calls] == [0.0, 2.5, 3.0]
    open_loop = list(load_trace(path, closed_loop=False).arrivals())
    assert [x.plan.session_id for x in open_loop] == ["a@0", "b@0", "a@1", "a@2"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({**mooncake_row(1, 10, [0]), "session_id": "a", "turn": 3}, "line 2: field 'turn'"),
        ({**mooncake_row(1, 10, [0]), "session_id": None}, "line 2: field 'session_id'"),
        (
            {**mooncake_row(1, 10, [0]), "session_id": "a", "context_event": "zap"},
            "line 2: field 'context_event'",
        ),
        (
            {**mooncake_row(1, 10, [0]), "session_id": "a", "segments": [[1, 10]]},
            "line 2: field 'output_id'",
        ),
        (
            {**mooncake_row(1, 10, [0]), "session_id": "a", "segments": [[1, 9]], "output_id": 1},
            "line 2: segments hold 9 tokens",
        ),
        (
            {
                **mooncake_row(1, 10, [0]),
                "session_id": "a",
                "segments": [],
                "output_id": 1,
                "prefix_segments": 40,
            },
            "line 2: field 'prefix_segments' is 40",
        ),
        ({**mooncake_row(1, 10, [0]), "session_id": "a", "tool_s": -1}, "line 2: field 'tool_s'"),
    ],
)
def test_session_jsonl_rejects_malformed_rows(tmp_path: Path, row: object, message: str) -> None:
    first = {**mooncake_row(0, 10, [0]), "session_id": "a"}
    path = write_lines(tmp_path / "bad.jsonl", [first, row])
    with pytest.raises(ValueError, match=message):
        load_trace(path)


def test_generated_sessions_round_trip_exactly(tmp_path: Path) -> None:
    w = make_workload(
        "mixed",
        seed=5,
        session_rate_per_s=1.0,
        num_sessions=40,
        params={
            "coding.interactive_share": 1.0,
            "coding.tl_max_turns": 3,
            "coding.tl_fork_prob_per_call": 0.2,
            "phase_s": 10,
        },
    )
    buf = io.StringIO()
    write_session_jsonl(w.arrivals(), buf)
    path = tmp_path / "gen.jsonl"
    path.write_text(buf.getvalue())
    original = list(w.arrivals())
    loaded = list(load_trace(path).arrivals())
    assert [a.plan for a in loaded] == [a.plan for a in original]
    assert any(c.forks for a in loaded for c in a.plan.calls)
    for x, y in zip(original, loaded, strict=True):
        assert abs(x.start_s - y.start_s) < 1e-3


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace file not found"):
        load_trace(tmp_path / "none.jsonl")
    path = write_lines(tmp_path / "t.jsonl", [mooncake_row(0, 10, [0])])
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(path, fmt="parquet")
    with pytest.raises(ValueError, match="rate_scale"):
        load_trace(path, rate_scale=0.0)


def test_shared_mooncake_traces_load(shared_traces: Path) -> None:
    conv = load_trace(shared_traces / "mooncake_fast25" / "conversation_trace.jsonl")
    s = workload_stats(conv.arrivals(), block_size=512)
    # WORKLOADS.md: 12,031 requests over 3,537 s, input mean 12k, output mean 343, 37% reuse.
    assert s.num_calls == 12_031
    assert abs(s.input_tokens.mean - 12_035) < 50 and abs(s.output_tokens.mean - 343) < 2
    assert abs(s.global_reuse_ratio - 0.37) < 0.02
    fast = load_trace(
        shared_traces / "mooncake_fast25" / "conversation_trace.jsonl", rate_scale=2.0
    )
    assert abs(max(a.start_s for a in fast.arrivals()) - 3_537 / 2) < 1
    synth = load_trace(shared_traces / "mooncake_fast25" / "synthetic_trace.jsonl")
    s = workload_stats(synth.arrivals(), block_size=512)
    assert s.num_calls == 3_993 and abs(s.global_reuse_ratio - 0.64) < 0.02


def test_shared_azure_traces_load(shared_traces: Path) -> None:
    for name, rows in (
        ("AzureLLMInferenceTrace_code.csv", 8_819),
        ("AzureLLMInferenceTrace_conv.csv", 19_366),
    ):
        arrivals = list(load_trace(shared_traces / "azure_llm_2023" / name).arrivals())
        assert len(arrivals) == rows
        assert 3_000 < arrivals[-1].start_s < 4_000
