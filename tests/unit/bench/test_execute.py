from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from evinfra.bench import execute, progress
from evinfra.bench.aggregate import sanitize
from evinfra.bench.execute import BenchExecutor, RunOutcome
from evinfra.bench.scenario import RunSpec, main_runs, parse_scenario
from evinfra.bench.store import load_latencies, load_timeseries, run_dir


def make_runs(data: dict[str, Any]) -> list[RunSpec]:
    return main_runs(parse_scenario(data))


def test_failed_run_is_reported_without_losing_the_others(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    scenario_data["systems"] = [
        "dynamo",
        {"name": "dynamo", "label": "broken", "system_options": {"no_such_option": 1}},
    ]
    lines: list[str] = []
    with BenchExecutor(tmp_path, jobs=1, log=lines.append) as ex:
        out = ex.run(make_runs(scenario_data))
    assert out["dynamo__seed0"].ok
    bad = out["broken__seed0"]
    assert not bad.ok
    assert bad.error is not None and "no_such_option" in bad.error
    err = json.loads((run_dir(tmp_path, "broken__seed0") / "error.json").read_text())
    assert "no_such_option" in err["error"]
    assert any("FAILED" in x and "broken__seed0" in x for x in lines)
    assert any(x.startswith("[1/2] dynamo__seed0") for x in lines)


def test_run_files_are_written(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = ["dynamo"]
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        (outcome,) = ex.run(make_runs(scenario_data)).values()
    assert outcome.summary is not None
    d = run_dir(tmp_path, "dynamo__seed0")
    stored = json.loads((d / "summary.json").read_text())
    assert stored["num_requests"] == outcome.summary["num_requests"] > 0
    lat = load_latencies(tmp_path, "dynamo__seed0")
    assert lat is not None and len(lat.e2e_s) == outcome.summary["num_requests"]
    assert (lat.e2e_s >= lat.ttft_s).all()
    assert load_timeseries(tmp_path, "dynamo__seed0")


def test_resume_reuses_matching_runs_only(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = ["dynamo"]
    runs = make_runs(scenario_data)
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        first = ex.run(runs)["dynamo__seed0"]
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        again = ex.run(runs)["dynamo__seed0"]
    assert again.reused
    assert again.summary == json.loads(json.dumps(first.summary))
    # without --resume, or with a different config, the run is done again
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        assert not ex.run(runs)["dynamo__seed0"].reused
    scenario_data["base"]["duration_s"] = 21
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        assert not ex.run(make_runs(scenario_data))["dynamo__seed0"].reused


def test_resume_accepts_a_field_added_since_at_its_default(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    # a run stored before `kv_allocation` existed is the same run as one at its default
    # ("prompt"), and not the same as one with another value
    scenario_data["systems"] = ["dynamo"]
    runs = make_runs(scenario_data)
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        ex.run(runs)
    stored = tmp_path / "runs" / "dynamo__seed0" / "config.json"
    old = json.loads(stored.read_text())
    assert old.pop("kv_allocation") == "prompt"
    stored.write_text(json.dumps(old))
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        assert ex.run(runs)["dynamo__seed0"].reused
    stored.write_text(json.dumps(old))
    scenario_data["base"]["kv_allocation"] = "chunk"
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        assert not ex.run(make_runs(scenario_data))["dynamo__seed0"].reused
    # a stored field the current config lacks is a different config
    stored.write_text(json.dumps({**old, "kv_allocation": "prompt", "retired_knob": 1}))
    scenario_data["base"].pop("kv_allocation")
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        assert not ex.run(make_runs(scenario_data))["dynamo__seed0"].reused


def test_resume_reruns_a_failed_run(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = [{"name": "dynamo", "system_options": {"bad": 1}}]
    runs = make_runs(scenario_data)
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        assert not ex.run(runs)["dynamo__seed0"].ok
    with BenchExecutor(tmp_path, resume=True, log=lambda _: None) as ex:
        outcome = ex.run(runs)["dynamo__seed0"]
    assert not outcome.reused and not outcome.ok


def test_worker_processes_give_the_same_results(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    scenario_data["systems"] = ["dynamo", "oracle"]
    runs = make_runs(scenario_data)
    with BenchExecutor(tmp_path / "a", jobs=1, log=lambda _: None) as ex:
        serial = ex.run(runs)
    lines: list[str] = []
    with BenchExecutor(tmp_path / "b", jobs=2, log=lines.append) as ex:
        parallel = ex.run(runs)
    for run_id, outcome in serial.items():
        a, b = dict(outcome.summary or {}), dict(parallel[run_id].summary or {})
        for volatile in ("wall_s", "events_per_s", "sim_s_per_wall_s"):
            a.pop(volatile), b.pop(volatile)
        assert sanitize(a) == sanitize(b)
    assert len(lines) == 2
    assert "ETA" in lines[0]


def test_eta_scales_remaining_work(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = ["dynamo"]
    scenario_data["seeds"] = [0, 1, 2, 3]
    runs = make_runs(scenario_data)
    with BenchExecutor(tmp_path, log=lambda _: None) as ex:
        ex.plan(runs)
        ex.run(runs[:1])
        eta = ex.eta_s()
        assert eta is not None
        per_run = ex.outcomes[runs[0].run_id].wall_s
        assert eta == pytest.approx(3 * per_run)


def _sleep_run(spec: RunSpec, out: str, progress: object = None) -> RunOutcome:
    """Stands in for a simulator run in the worker processes: the `slow` system takes 1.5 s,
    every other 0.05 s."""
    wall_s = 1.5 if spec.run_id.startswith("slow") else 0.05
    time.sleep(wall_s)
    return RunOutcome(spec.run_id, {"num_requests": 1}, None, wall_s)


def test_chains_go_on_without_waiting_for_each_other(
    tmp_path: Path, scenario_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a goodput search per system: the fast system's next loads start as soon as its own
    # are judged, not when the slow system's are (in lockstep its second run would wait)
    monkeypatch.setattr(execute, "execute_run", _sleep_run)  # forked workers inherit it
    scenario_data["systems"] = [
        {"name": "dynamo", "label": "slow"},
        {"name": "dynamo", "label": "fast"},
    ]
    scenario_data["seeds"] = [0, 1, 2]
    runs = {r.run_id: r for r in make_runs(scenario_data)}
    fast = iter([[runs["fast__seed1"]], [runs["fast__seed2"]], []])
    asked: list[str] = []

    def then(key: str) -> list[RunSpec]:
        asked.append(key)
        return next(fast) if key == "fast" else []

    lines: list[str] = []
    first = {"slow": [runs["slow__seed0"]], "fast": [runs["fast__seed0"]]}
    with BenchExecutor(tmp_path, jobs=2, log=lines.append) as ex:
        ex.run_chains(first, then)
    assert asked == ["fast", "fast", "fast", "slow"]
    done = [line.split()[1] for line in lines]
    assert done == ["fast__seed0", "fast__seed1", "fast__seed2", "slow__seed0"]
    assert lines[-1].startswith("[4/4] ")


def test_chains_run_one_by_one_without_workers(
    tmp_path: Path, scenario_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(execute, "execute_run", _sleep_run)
    scenario_data["systems"] = [{"name": "dynamo", "label": "a"}, {"name": "dynamo", "label": "b"}]
    scenario_data["seeds"] = [0, 1]
    runs = {r.run_id: r for r in make_runs(scenario_data)}
    nexts = {"a": iter([[runs["a__seed1"], runs["b__seed0"]], []]), "b": iter([[]])}
    lines: list[str] = []
    with BenchExecutor(tmp_path, jobs=1, log=lines.append) as ex:
        # b__seed0 is asked for twice (by b, then by a's second batch) and run once
        ex.run_chains({"a": [runs["a__seed0"]], "b": [runs["b__seed0"]]}, lambda k: next(nexts[k]))
    assert [line.split()[1] for line in lines] == ["a__seed0", "b__seed0", "a__seed1"]


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.skipif(execute._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_release_gives_a_fragmented_heap_back() -> None:
    # 200 MB of malloc'd objects with one in 64 kept: freed, the heap keeps its pages
    # until trimmed (what a long run leaves behind in a process that runs the next one)
    objs = [bytes(1000 + i % 7) for i in range(200_000)]
    kept = objs[::64]
    del objs
    before = _rss_mb()
    execute.release_freed_memory()
    assert before - _rss_mb() > 100
    del kept  # alive until here: the objects that keep the heap fragmented


def test_each_run_releases_its_memory(
    tmp_path: Path, scenario_data: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario_data["systems"] = [
        "dynamo",
        {"name": "dynamo", "label": "broken", "system_options": {"no_such_option": 1}},
    ]
    calls: list[int] = []
    monkeypatch.setattr(execute, "release_freed_memory", lambda: calls.append(1))
    with BenchExecutor(tmp_path, jobs=1, log=lambda _: None) as ex:
        out = ex.run(make_runs(scenario_data))
    assert out["dynamo__seed0"].ok and not out["broken__seed0"].ok
    assert len(calls) == 2  # after the run that worked and after the one that failed


def test_a_long_run_reports_its_simulated_time_while_it_runs(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    # in the parent process (--jobs 1) and in a worker: lines between the runs' own say
    # how far each run's simulated clock has got, and no progress file is left behind
    scenario_data["systems"] = ["dynamo"]
    runs = make_runs(scenario_data)
    end_s = runs[0].config.duration_s + runs[0].config.drain_s
    for jobs in (1, 2):
        lines: list[str] = []
        out = tmp_path / f"jobs{jobs}"
        with BenchExecutor(out, jobs=jobs, log=lines.append, progress_every_s=0.02) as ex:
            assert ex.run(runs)["dynamo__seed0"].ok
        running = [x for x in lines if x.startswith("... running: dynamo__seed0 ")]
        assert running, lines
        assert f"/{end_s:,.0f} simulated s (" in running[-1]
        assert lines[-1].startswith("[1/1] dynamo__seed0")
        assert not (run_dir(out, "dynamo__seed0") / "progress.json").exists()


def test_progress_file_round_trip_and_a_run_not_started(tmp_path: Path) -> None:
    path = tmp_path / "r" / "progress.json"
    assert progress.read_progress(path) is None
    hook = progress.ProgressFile(path, "evolving__seed0", 1740.0, every_s=0.0)
    hook(612.4, 1000)
    got = progress.read_progress(path)
    assert got is not None and (got.run_id, got.sim_s, got.end_s) == (
        "evolving__seed0",
        612.4,
        1740.0,
    )
    line = progress.running_line([got], 1300.0)
    assert line.startswith("... running: evolving__seed0 612/1,740 simulated s (35%, ")
    assert line.endswith("(elapsed 21m40s)")
    path.write_text("{not json")
    assert progress.read_progress(path) is None


def test_progress_wall_time_counts_from_the_runs_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a hook made when the run is handed to the pool, whose run starts 500 s later (a
    # busy worker): its wall time is the run's own, not the wait
    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    path = tmp_path / "progress.json"
    hook = progress.ProgressFile(path, "r", 100.0, every_s=10.0)
    logged: list[str] = []
    inline = progress.InlineProgress(logged.append, "r", 100.0, 10.0, lambda: 0.0)
    clock[0] += 500.0
    hook(1.0, 1)
    inline(1.0, 1)
    got = progress.read_progress(path)
    assert got is not None and got.wall_s == 0.0
    assert not logged  # inline: the first line after `every_s` of the run itself
    clock[0] += 12.0
    hook(7.0, 2)
    inline(7.0, 2)
    got = progress.read_progress(path)
    assert got is not None and (got.sim_s, got.wall_s) == (7.0, 12.0)
    assert len(logged) == 1 and "(7%, 12s)" in logged[0]
