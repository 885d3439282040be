"""benchmarks/split_ttft_scan.py: a tick counts only under a split and past the target."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import load_script


def _run(tmp_path: Path, slow_from_s: float, split_from_s: float) -> Path:
    """Ten calls a second for 200 s, 0.1 s to first token, 3 s from `slow_from_s` on;
    every node mixed until `split_from_s`, then 3 prefill / 1 decode."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    arrival = np.arange(0.0, 200.0, 0.1)
    ttft = np.where(arrival >= slow_from_s, 3.0, 0.1)
    np.savez(run / "records.npz", arrival_s=arrival, ttft_s=ttft, e2e_s=ttft + 1.0)
    samples = [
        {
            "time_s": t,
            "num_prefill_nodes": 3 if t >= split_from_s else 0,
            "num_decode_nodes": 1 if t >= split_from_s else 0,
            "num_mixed_nodes": 0 if t >= split_from_s else 4,
        }
        for t in range(0, 210, 10)
    ]
    (run / "timeseries.json").write_text(json.dumps(samples))
    return run


@pytest.mark.parametrize(
    ("slow_from_s", "split_from_s", "past"),
    [
        (100.0, 50.0, True),  # slow under a split: the rule would fire
        (100.0, 500.0, False),  # slow while mixed: it would not
        (500.0, 50.0, False),  # split but fast: it would not
    ],
)
def test_a_tick_counts_only_under_a_split_past_the_target(
    tmp_path: Path, slow_from_s: float, split_from_s: float, past: bool
) -> None:
    script = load_script("benchmarks/split_ttft_scan.py", "split_ttft_scan")
    scan = script.scan_run(_run(tmp_path, slow_from_s, split_from_s))
    assert (scan.num_ticks_past > 0) is past
    if past:
        # slow calls finish from 104 s: at the tick at 105 s 10 of the window's 300 calls
        # (3%) are slow, at 110 s 60 (20%), past the 5% the 95th percentile allows
        assert scan.worst_p95_ttft_s == 3.0
        assert scan.first_tick_past_s == 110.0
    assert script.scan_run(_run(tmp_path / "x", slow_from_s, split_from_s), 4.0).num_ticks_past == 0


def test_the_cli_prints_a_table_and_skips_a_run_without_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = load_script("benchmarks/split_ttft_scan.py", "split_ttft_scan")
    run = _run(tmp_path, 100.0, 50.0)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert script.main([str(run), str(empty)]) == 0
    out = capsys.readouterr()
    assert "| run | worst split-window P95 TTFT (s)" in out.out
    assert "1 of 1 runs have a tick past the target" in out.out
    assert f"skipped {empty}" in out.err
    with pytest.raises(SystemExit):
        script.main([str(run), "--window-s", "0"])
