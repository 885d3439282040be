from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from evinfra.bench.cli import add_bench_parser
from evinfra.bench.run import run_bench
from evinfra.bench.scenario import load_scenario, main_runs, parse_scenario
from evinfra.sim.metrics import QUEUE_KEYS

REPO = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *argv])
    return int(args.handler(args))


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_point_scenario_outputs(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = [
        "evolving",
        "dynamo",
        "oracle",
        {"name": "dynamo", "label": "broken", "system_options": {"bogus": 1}},
    ]
    lines: list[str] = []
    results = run_bench(
        parse_scenario(scenario_data), tmp_path, command="evinfra bench x.yaml", log=lines.append
    )
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["scenario"] == "tiny"
    systems = on_disk["systems"]
    assert set(systems) == {"evolving", "dynamo", "oracle", "broken"}
    evo = systems["evolving"]
    # the summary keys of `evinfra sim`, and the ratios computed from them
    for key in ("num_requests", "mean_e2e_s", "p95_ttft_s", "mean_tpot_s", "kv_hit_rate"):
        assert key in evo["summary"]
    dyn = systems["dynamo"]["summary"]
    ratio = evo["ratio_vs_dynamo"]
    assert ratio["mean_e2e_s"] == pytest.approx(dyn["mean_e2e_s"] / evo["summary"]["mean_e2e_s"])
    assert ratio["p95_ttft_s"] == pytest.approx(dyn["p95_ttft_s"] / evo["summary"]["p95_ttft_s"])
    assert systems["broken"]["summary"] is None
    assert "bogus" in systems["broken"]["errors"]["0"]
    assert on_disk["runs"]["broken__seed0"]["ok"] is False
    report = (tmp_path / "report.md").read_text()
    assert "evinfra bench x.yaml" in report
    assert "| evolving |" in report and "`broken` failed" in report
    for name in ("latency_cdf.png", "pd_split.png", "kv_hit_rate.png"):
        assert is_png(tmp_path / name), name
        assert f"({name})" in report
    assert not (tmp_path / "latency_vs_load.png").exists()
    assert results["systems"]["dynamo"]["summary"]["num_requests"] == dyn["num_requests"]


def test_sweep_and_goodput(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = ["evolving", "dynamo"]
    scenario_data["base"]["duration_s"] = 12
    scenario_data["base"]["sample_interval_s"] = 2.0  # samples enough for the queue's trend
    scenario_data["sweep"] = {"field": "session_rate", "values": [0.5, 1.0, 2.0]}
    # a TPOT target between the two loads' values makes the search bracket something
    scenario_data["goodput"] = {
        "ttft_p95_s": 10.0,
        "tpot_mean_s": 10.0,
        "rate_lo": 0.5,
        "rate_hi": 4.0,
        "rate_max": 6.0,
        "iterations": 2,
    }
    results = run_bench(parse_scenario(scenario_data), tmp_path, log=lambda _: None)
    sweep = results["sweep"]
    assert [p["value"] for p in sweep["points"]] == [0.5, 1.0, 2.0]
    assert sweep["headline"] == 1.0
    assert results["systems"] == sweep["points"][1]["systems"]
    assert (
        sweep["points"][2]["systems"]["dynamo"]["summary"]["num_requests"]
        > (sweep["points"][0]["systems"]["dynamo"]["summary"]["num_requests"])
    )
    gp = results["goodput"]["systems"]
    for label in ("evolving", "dynamo"):
        tried = {p["value"] for p in gp[label]["points"]}
        # the sweep's points were reused, the range's ends evaluated, and with every load
        # passing the search stepped up to rate_max (x1.5 of 4 is the cap, 6)
        assert {0.5, 1.0, 2.0, 4.0, 6.0} <= tried
        assert gp[label]["bound"] == "at_least" and gp[label]["rate"] == 6.0
    assert gp["dynamo"]["ratio_vs_dynamo"] == 1.0
    assert is_png(tmp_path / "latency_vs_load.png")
    assert is_png(tmp_path / "goodput.png")
    report = (tmp_path / "report.md").read_text()
    assert "## Latency against load" in report and "## Goodput" in report
    assert "stepping up x1.5 to at most 6" in report
    # the goodput's own point, its queue's trend with it
    assert "| at the goodput | first failing |" in report
    assert all("queue " in p["reason"] for p in gp["dynamo"]["points"] if p["passed"])
    at = next(p for p in gp["dynamo"]["points"] if p["value"] == gp["dynamo"]["rate"])
    assert f"| {at['reason']} | none | passed every load tried |" in report
    # goodput runs at 4 and 6 sessions/s exist as runs of their own
    assert "dynamo__session_rate=4__seed0" in results["runs"]
    assert "evolving__session_rate=6__seed0" in results["runs"]


def test_goodput_tight_target_bisects(tmp_path: Path, scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = ["dynamo"]
    scenario_data["goodput"] = {
        "ttft_p95_s": 1e-6,
        "tpot_mean_s": 10.0,
        "rate_lo": 0.5,
        "rate_hi": 2.0,
        "iterations": 3,
    }
    results = run_bench(parse_scenario(scenario_data), tmp_path, log=lambda _: None, plots=False)
    g = results["goodput"]["systems"]["dynamo"]
    assert g["bound"] == "below" and g["rate"] == 0.0
    assert g["ratio_vs_dynamo"] is None
    assert all("TTFT" in p["reason"] for p in g["points"])


def test_cli_resume_and_errors(
    tmp_path: Path, scenario_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scenario_data["systems"] = ["dynamo", "oracle"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data))
    out = tmp_path / "out"
    assert run_cli([str(path), "--out", str(out), "--jobs", "1", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "| dynamo |" in captured.out
    assert "[2/2]" in captured.err
    assert run_cli([str(path), "--out", str(out), "--resume", "--no-plots"]) == 0
    assert "stored" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert all(r["reused"] for r in results["runs"].values())

    # a run stored before the summary had the queue's trend gets it from its timeseries
    stored = out / "runs" / "dynamo__seed0" / "summary.json"
    old = json.loads(stored.read_text())
    stored.write_text(json.dumps({k: v for k, v in old.items() if k not in QUEUE_KEYS}))
    assert run_cli([str(path), "--out", str(out), "--resume", "--no-plots"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    again = resumed["systems"]["dynamo"]["summary"]
    assert again["num_waiting_end"] == old["num_waiting_end"]
    assert again["waiting_growth_s"] == pytest.approx(old["waiting_growth_s"])
    assert all(r["reused"] for r in resumed["runs"].values())

    scenario_data["base"]["gpus_per_node"] = 4
    path.write_text(yaml.safe_dump(scenario_data))
    assert run_cli([str(path), "--out", str(out)]) == 2
    assert "base: num_gpus" in capsys.readouterr().err
    for bad in ("0", "-1", "nan"):
        assert run_cli([str(path), "--out", str(out), "--progress-every-s", bad]) == 2
        assert "--progress-every-s must be > 0" in capsys.readouterr().err


def test_cli_prints_how_far_the_runs_in_flight_are(
    tmp_path: Path, scenario_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scenario_data["systems"] = ["dynamo"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data))
    argv = [str(path), "--out", str(tmp_path / "out"), "--jobs", "1", "--no-plots"]
    assert run_cli([*argv, "--progress-every-s", "0.01"]) == 0
    assert "... running: dynamo__seed0 " in capsys.readouterr().err
    assert run_cli([*argv, "--progress-every-s", "3600"]) == 0
    assert "... running:" not in capsys.readouterr().err


def test_cli_seeds_override(
    tmp_path: Path, scenario_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scenario_data["systems"] = ["oracle"]
    scenario_data["seeds"] = [0, 1, 2]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data))
    out = tmp_path / "out"
    argv = [str(path), "--out", str(out), "--jobs", "1", "--no-plots", "--seeds", "5"]
    assert run_cli(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [5]
    assert "--seeds 5" in (out / "report.md").read_text()  # the command reproduces it
    assert run_cli([*argv[:-1], "5", "5"]) == 2
    assert "--seeds: duplicate seed" in capsys.readouterr().err


def test_the_reproduce_line_names_a_project_file_from_the_project(tmp_path: Path) -> None:
    from evinfra.bench.cli import portable_path

    # a scenario in a checkout anywhere (a worktree in /tmp) is named from its root
    (tmp_path / "wt" / "benchmarks").mkdir(parents=True)
    (tmp_path / "wt" / "pyproject.toml").write_text("")
    inside = tmp_path / "wt" / "benchmarks" / "smoke.yaml"
    assert portable_path(inside) == Path("benchmarks/smoke.yaml")
    assert portable_path(REPO / "benchmarks" / "smoke.yaml") == Path("benchmarks/smoke.yaml")
    # a relative path, or a file in no project, stays as given
    assert portable_path(Path("benchmarks/smoke.yaml")) == Path("benchmarks/smoke.yaml")
    assert portable_path(tmp_path / "mine.yaml") == tmp_path / "mine.yaml"


def test_cli_systems_subset(
    tmp_path: Path, scenario_data: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    scenario_data["systems"] = ["evolving", "dynamo", "oracle"]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_data))
    out = tmp_path / "out"
    argv = [str(path), "--out", str(out), "--jobs", "1", "--no-plots"]
    assert run_cli([*argv, "--systems", "oracle", "dynamo"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["systems"]) == ["dynamo", "oracle"]  # the scenario's order
    assert results["systems"]["oracle"]["ratio_vs_dynamo"]["mean_e2e_s"] > 0
    assert "--systems oracle dynamo" in (out / "report.md").read_text()
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["dynamo__seed0", "oracle__seed0"]
    assert run_cli([*argv, "--systems", "evolving", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--systems: nope neither in tiny (it has evolving, dynamo, oracle) nor" in err
    assert run_cli([*argv, "--systems", "oracle", "oracle"]) == 2
    assert "--systems: duplicate label" in capsys.readouterr().err


def test_cli_systems_adds_a_known_system_the_scenario_lacks(scenario_data: dict[str, Any]) -> None:
    from evinfra.bench.cli import only_systems
    from evinfra.bench.scenario import Scenario, SystemEntry

    scenario_data["systems"] = [
        "evolving",
        "dynamo",
        {"name": "evolving", "label": "slow", "system_options": {"planner": False}},
    ]
    scenario = Scenario.model_validate(scenario_data)
    picked = only_systems(scenario, ["evolving-ttft", "slow", "dynamo"])
    # the scenario's own in its order, then the added one with default options
    assert picked.labels == ["dynamo", "slow", "evolving-ttft"]
    assert picked.entries[2] == SystemEntry(name="evolving-ttft")
    assert picked.entries[1].system_options == {"planner": False}


def test_mooncake_trace_scenario_expands() -> None:
    path = REPO / "benchmarks" / "mooncake-conversation.yaml"
    trace = REPO.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    if not trace.is_file():
        pytest.skip("shared Mooncake traces absent")
    run = main_runs(load_scenario(path), scenario_path=path)[0]
    assert run.config.trace is not None and Path(run.config.trace).is_file()


@pytest.mark.slow
def test_smoke_scenario_runs(tmp_path: Path) -> None:
    """benchmarks/smoke.yaml, whole: the CI smoke (about a minute on two cores)."""
    out = tmp_path / "smoke"
    assert run_cli([str(REPO / "benchmarks" / "smoke.yaml"), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert {"evolving", "dynamo", "oracle"} <= set(results["systems"])
    assert all(r["ok"] for r in results["runs"].values())
    assert (out / "report.md").is_file()
    shutil.rmtree(out)


def test_goodput_searches_side_by_side_find_what_one_by_one_finds(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    # with worker processes each system's search goes on at its own pace: the same loads
    # are tried and judged alike as when every run goes one after another
    scenario_data["systems"] = ["evolving", "dynamo"]
    # a 70B model on two GPUs queues within the range, so both searches bisect
    scenario_data["base"].update(duration_s=10, model="llama-3-70b", gpu="gb300")
    scenario_data["goodput"] = {
        "ttft_p95_s": 0.4,
        "tpot_mean_s": 10.0,
        "rate_lo": 0.25,
        "rate_hi": 4.0,
        "iterations": 2,
    }
    scenario = parse_scenario(scenario_data)
    serial = run_bench(scenario, tmp_path / "a", jobs=1, log=lambda _: None, plots=False)
    both = run_bench(scenario, tmp_path / "b", jobs=2, log=lambda _: None, plots=False)
    for label in ("evolving", "dynamo"):
        a, b = serial["goodput"]["systems"][label], both["goodput"]["systems"][label]
        assert len(a["points"]) == 4  # the two ends, then 2 bisections
        assert [p["value"] for p in a["points"]] == [p["value"] for p in b["points"]]
        assert (a["rate"], a["bound"], a["points"]) == (b["rate"], b["bound"], b["points"])
    assert sorted(serial["runs"]) == sorted(both["runs"])


def test_goodput_stopping_failing_runs_finds_the_same_goodput(
    tmp_path: Path, scenario_data: dict[str, Any]
) -> None:
    # the overloaded loads end once their failure is certain: the same loads are tried,
    # judged alike, with fewer simulated events
    scenario_data["systems"] = ["evolving", "dynamo"]
    scenario_data["base"].update(duration_s=10, model="llama-3-70b", gpu="gb300")
    targets = {"ttft_p95_s": 0.4, "tpot_mean_s": 10.0, "rate_lo": 0.25, "rate_hi": 4.0}
    scenario_data["goodput"] = {**targets, "iterations": 2}
    full = run_bench(parse_scenario(scenario_data), tmp_path / "a", log=lambda _: None)
    scenario_data["goodput"]["stop_failing_runs"] = True
    lines: list[str] = []
    cut = run_bench(parse_scenario(scenario_data), tmp_path / "b", log=lines.append)
    stopped = [k for k, r in cut["runs"].items() if r["stopped_s"] is not None]
    assert stopped and all(r["stopped_s"] is None for r in full["runs"].values())
    assert sum("certain to fail (figures to then)" in line for line in lines) == len(stopped)
    for label in ("evolving", "dynamo"):
        a, b = full["goodput"]["systems"][label], cut["goodput"]["systems"][label]
        assert (a["rate"], a["bound"]) == (b["rate"], b["bound"])
        assert [(p["value"], p["passed"]) for p in a["points"]] == [
            (p["value"], p["passed"]) for p in b["points"]
        ]
    for run_id in stopped:
        events = [
            json.loads((tmp_path / d / "runs" / run_id / "summary.json").read_text())["sim_events"]
            for d in ("a", "b")
        ]
        assert events[1] < events[0]
    report = (tmp_path / "b" / "report.md").read_text()
    assert f"{len(stopped)} stopped once certain to fail" in report
    assert "stopped at" in report and "`stop_failing_runs`" in report
