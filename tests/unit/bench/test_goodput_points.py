"""benchmarks/goodput_points.py: a goodput search put together from runs made apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evinfra.bench.scenario import load_scenario, make_run
from tests.scripts import load_script

SCENARIO = """
name: gp-test
base: {workload: coding, model: tiny, gpu: h100, num_gpus: 8, duration_s: 60, warmup_s: 10}
systems: [evolving, dynamo]
seeds: [0]
goodput: {ttft_p95_s: 2.0, tpot_mean_s: 0.05, rate_lo: 2, rate_hi: 8, iterations: 2,
          stop_failing_runs: true}
"""


def _run(root: Path, name: str, config: dict[str, Any], **summary: Any) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    figures = {"mean_e2e_s": 5.0, "p95_ttft_s": 0.5, "mean_tpot_s": 0.02, "num_requests": 100,
               "num_unfinished": 0, "role_switches": 3}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(figures | summary))
    return d


def _config(
    scenario: Any, entry: Any, rate: float | None, extra: dict[str, Any] | None = None
) -> Any:
    """The resolved config the bench runs for `entry` at `rate` (None: the scenario's own)."""
    point = None if rate is None else ("session_rate", rate)
    return json.loads(make_run(scenario, entry, 0, point, extra=extra).config.model_dump_json())


def _script_and_scenario(tmp_path: Path) -> tuple[Any, Path]:
    path = tmp_path / "gp.yaml"
    path.write_text(SCENARIO)
    return load_script("benchmarks/goodput_points.py", "goodput_points"), path


def _search_parts(tmp_path: Path) -> tuple[Any, Path, Any, Any, Any]:
    """The script, the scenario file, the scenario and its two entries (evolving, dynamo)."""
    script, path = _script_and_scenario(tmp_path)
    scenario = load_scenario(path)
    evolving, dynamo = scenario.entries
    return script, path, scenario, evolving, dynamo


def test_points_from_separate_runs_give_each_goodput_and_the_ratio(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, path, scenario, evolving, dynamo = _search_parts(tmp_path)
    stop = {"stop_past_ttft_p95_s": 2.0, "stop_max_unfinished_frac": 0.01}

    runs = [
        _run(tmp_path, "e4", _config(scenario, evolving, 4)),
        _run(tmp_path, "e6", _config(scenario, evolving, 6, stop), p95_ttft_s=2.5),
        _run(tmp_path, "d2", _config(scenario, dynamo, 2, stop)),
        _run(
            tmp_path,
            "d4",
            _config(scenario, dynamo, 4, stop),
            p95_ttft_s=9.0,
            stopped_s=30.0,
            stopped_reason="certain to fail",
        ),
        _run(tmp_path, "main", _config(scenario, dynamo, None)),
        _run(tmp_path, "other", _config(scenario, evolving, 5) | {"num_gpus": 16}),
    ]
    plot = tmp_path / "gp.png"
    assert script.main([str(path), *map(str, runs), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 5.00 s / 0.500 s / 20.0 ms / 3 / -: passes | stopped at 30 s" in out
    assert "| 6 | 5.00 s / 2.500 s / 20.0 ms / 3 / -: **fails** |  |" in out
    assert "- evolving: **4** (fails at 6: p95 TTFT 2.500s > 2.0s)" in out
    # the bench's walk from 2 and 8: 2 passes and 8 fails by the runs, its midpoint 5 is
    # not run (the run at 5 is of another cluster)
    assert (
        "not run, implied by the runs: passes 2; fails 8; the full search would still run 5" in out
    )
    assert "- dynamo: **2** (fails at 4: certain to fail)" in out
    assert "- evolving against dynamo: **2.00x (1.00x-3.00x from the brackets)**" in out
    assert "skipped " + str(tmp_path / "main") in out
    assert "not a run of this search (differs in num_gpus)" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    # without evolving's failing run its goodput is 4 or more
    assert script.main([str(path), *map(str, runs[:1] + runs[2:4])]) == 0
    out = capsys.readouterr().out
    assert "- evolving: **4** (passed every load run)" in out
    assert "- evolving against dynamo: **at least 2.00x**" in out


def test_the_queue_rule_rejudges_runs_and_old_runs_get_their_trend_from_the_timeseries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, path, scenario, evolving, dynamo = _search_parts(tmp_path)
    # dynamo at 4: stored before the summary had the queue's trend; its timeseries has the
    # waiting calls rising by 10 a second over the 50 s window (10 to 60 s), 100 calls
    # finished in it, 2 a second: the queue grew by 500 calls, 250 s of them
    d4 = _run(tmp_path, "d4", _config(scenario, dynamo, 4), warmup_s=10.0, window_s=50.0)
    samples = [{"time_s": float(t), "num_waiting_requests": 10 * t} for t in range(0, 70, 5)]
    (d4 / "timeseries.json").write_text(json.dumps(samples))
    runs = [
        _run(tmp_path, "e4", _config(scenario, evolving, 4), waiting_growth_s=0.1),
        _run(tmp_path, "e6", _config(scenario, evolving, 6), waiting_growth_s=3.0),
        _run(tmp_path, "d2", _config(scenario, dynamo, 2), waiting_growth_s=0.0),
        d4,
    ]
    assert script.main([str(path), *map(str, runs)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 5.00 s / 0.500 s / 20.0 ms / 3 / +0.10 s: passes" in out
    assert "5.00 s / 0.500 s / 20.0 ms / 3 / +250.00 s: passes |" in out
    assert "- evolving: **6**" in out and "- dynamo: **4**" in out
    assert script.main([str(path), *map(str, runs), "--max-waiting-growth-s", "2"]) == 0
    out = capsys.readouterr().out
    assert "- evolving: **4** (fails at 6: queue grew 3.00s > 2.0s)" in out
    assert "- dynamo: **2** (fails at 4: queue grew 250.00s > 2.0s)" in out
    with pytest.raises(SystemExit) as exc:
        script.main([str(path), *map(str, runs), "--max-waiting-growth-s", "0"])
    assert exc.value.code == 2
    assert "--max-waiting-growth-s must be > 0" in capsys.readouterr().err


def test_a_directory_that_holds_no_run_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, path = _script_and_scenario(tmp_path)
    assert script.main([str(path), str(tmp_path)]) == 2
    assert "neither a run" in capsys.readouterr().err


def test_next_writes_the_runs_the_search_needs_and_they_count_once_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from evinfra.cli import main as evinfra_main

    script, path = _script_and_scenario(tmp_path)
    scenario = load_scenario(path)
    dynamo = scenario.entries[1]
    stop = {"stop_past_ttft_p95_s": 2.0, "stop_max_unfinished_frac": 0.01}
    runs = [
        _run(tmp_path, "d2", _config(scenario, dynamo, 2, stop)),
        _run(tmp_path, "d8", _config(scenario, dynamo, 8, stop), p95_ttft_s=3.0),
    ]
    nxt = tmp_path / "next"
    assert script.main([str(path), *map(str, runs), "--next", str(nxt)]) == 0
    out = capsys.readouterr().out
    # evolving has no run: the search's two ends; dynamo's bisection: the midpoint 5
    assert "3 run(s) still needed by the full search" in out
    written = sorted(p.parent.name for p in nxt.glob("runs/*/config-in.yaml"))
    assert written == [
        "dynamo__session_rate=5__seed0",
        "evolving__session_rate=2__seed0",
        "evolving__session_rate=8__seed0",
    ]
    # run one as printed: the search counts it as the bench's own run
    run_dir = nxt / "runs" / "evolving__session_rate=2__seed0"
    cmd = next(line.split() for line in out.splitlines() if str(run_dir / "config-in") in line)
    assert cmd[:2] == ["evinfra", "sim"]
    assert evinfra_main(cmd[1:]) == 0
    capsys.readouterr()
    assert script.main([str(path), *map(str, runs), str(nxt), "--next", str(nxt)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | " in out and "skipped" not in out
    assert "- evolving: **2** (passed every load run)" in out
    # a run done is not asked for again; the evolving search steps on from its result
    assert "evolving__session_rate=2__seed0/config-in" not in out
    assert "evolving__session_rate=8__seed0/config-in" in out


def test_next_alone_starts_a_search_from_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, path = _script_and_scenario(tmp_path)
    assert script.main([str(path), "--next", str(tmp_path / "n")]) == 0
    assert "4 run(s) still needed" in capsys.readouterr().out
    assert len(list((tmp_path / "n").glob("runs/*/config-in.yaml"))) == 4
