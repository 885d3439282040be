"""benchmarks/dynamo/decode_probe.py: what the mocker's decode time counts as active KV."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

CAPACITY = 2048 * 16


def load() -> ModuleType:
    return load_script("benchmarks/dynamo/decode_probe.py", "dynamo_decode_probe")


def test_trace_shares_a_prefix_within_a_case_only(tmp_path: Path) -> None:
    dp = load()
    case = dp.DecodeCase(num_requests=3, shared_blocks=2, unique_blocks=1)
    trace = dp.DecodeProbeTrace(cases=(case, case), output_tokens=8, spacing_ms=1000)
    trace.write(tmp_path / "t.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["timestamp"] for r in rows] == [0, 0, 0, 1000, 1000, 1000]
    assert all(r["input_length"] == 3 * 512 and r["output_length"] == 8 for r in rows)
    first, second = rows[:3], rows[3:]
    assert {tuple(r["hash_ids"][:2]) for r in first} == {(0, 1)}
    assert len({r["hash_ids"][2] for r in first}) == 3  # each its own last block
    assert not set(first[0]["hash_ids"]) & set(second[0]["hash_ids"])


def test_readings_agree_without_sharing_and_part_with_it() -> None:
    dp = load()
    alone = dp.predicted_ms(dp.DecodeCase(4, 0, 4), CAPACITY, 96)
    assert alone["per_sequence"] == alone["distinct"] == alone["capped"]
    shared = dp.predicted_ms(dp.DecodeCase(8, 20, 1), CAPACITY, 96)
    # 8 x 10,800 tokens = u 2.6: the polynomial's floor; capped at u = 1: its 34.01 ms;
    # distinct (10,240 + 8 x 560 tokens, u 0.45)
    assert shared["per_sequence"] == pytest.approx(1.0)
    assert shared["capped"] == pytest.approx(34.01)
    assert 20 < shared["distinct"] < 30


def test_results_name_the_reading_each_measurement_follows(tmp_path: Path) -> None:
    dp = load()
    cases = (dp.DecodeCase(1, 0, 2), dp.DecodeCase(8, 20, 1))
    trace = dp.DecodeProbeTrace(cases=cases, output_tokens=9)
    run = tmp_path / "run"
    run.mkdir()
    rows = []
    for i, gap_s in enumerate([0.0075] + [0.034] * 8):
        rows.append({"send_s": float(i), "ttft_s": 0.1, "e2e_s": 1.0, "num_output_tokens": 9,
                     "itl_s": [gap_s] * 8})  # fmt: skip
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured = dp.measured_gaps_ms(run, trace, leading_extra=False)
    assert measured == pytest.approx([7.5, 34.0])
    out = dp.results(trace, CAPACITY, {"engine": measured, "missing": [None, None]})
    assert out[1]["closest"] == {"engine": "capped", "missing": None}
    text = dp.table(out)
    assert "34.0 (capped)" in text and "n/a" in text
