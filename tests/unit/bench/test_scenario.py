from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evinfra.bench.scenario import (
    ScenarioError,
    load_scenario,
    main_runs,
    make_run,
    parse_scenario,
    quick_base,
    resolve_trace,
)


def test_parses_string_and_entry_systems(scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = [
        "dynamo",
        {"name": "evolving", "label": "evolving-slow", "system_options": {"planner": "x"}},
    ]
    s = parse_scenario(scenario_data)
    assert s.labels == ["dynamo", "evolving-slow"]
    assert s.entries[1].system_options == {"planner": "x"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"systems": ["dynamo", "nope"]}, "systems.1"),
        ({"systems": ["dynamo", "dynamo"]}, "duplicate label"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"systems": []}, "systems"),
        ({"sweep": {"field": "model", "values": [1.0]}}, "sweep"),
        ({"sweep": {"values": [2.0, 1.0]}}, "increasing"),
        ({"sweep": {"values": [1.0, 2.0], "headline": 3.0}}, "headline"),
        (
            {"goodput": {"ttft_p95_s": 1, "tpot_mean_s": 0.1, "rate_lo": 2, "rate_hi": 1}},
            "rate_hi",
        ),
        ({"goodput": {"ttft_p95_s": 1, "rate_lo": 1, "rate_hi": 2}}, "goodput.tpot_mean_s"),
        (
            {
                "goodput": {
                    "ttft_p95_s": 1,
                    "tpot_mean_s": 0.1,
                    "rate_lo": 1,
                    "rate_hi": 2,
                    "field": "concurrency",
                    "stop_failing_runs": True,
                }
            },
            "goodput.stop_failing_runs",
        ),
        ({"name": "has space"}, "name"),
    ],
)
def test_errors_name_the_field(
    scenario_data: dict[str, Any], change: dict[str, Any], field: str
) -> None:
    scenario_data.update(change)
    with pytest.raises(ScenarioError, match=field):
        parse_scenario(scenario_data)


@pytest.mark.parametrize(
    ("base_change", "field"),
    [
        ({"gpus_per_node": 4}, "base: num_gpus"),
        ({"duration_s": -1}, "base.duration_s"),
        ({"nonsense": 1}, "base.nonsense"),
        ({"system": "dynamo"}, "base.system"),
        ({"seed": 3}, "base.seed"),
    ],
)
def test_base_errors_name_the_field(
    scenario_data: dict[str, Any], base_change: dict[str, Any], field: str
) -> None:
    scenario_data["base"].update(base_change)
    with pytest.raises(ScenarioError, match=field):
        parse_scenario(scenario_data)


def test_load_scenario_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ScenarioError, match="mapping"):
        load_scenario(listy)


def test_main_runs_cover_systems_seeds_and_points(scenario_data: dict[str, Any]) -> None:
    scenario_data["seeds"] = [0, 7]
    scenario_data["sweep"] = {"field": "session_rate", "values": [0.5, 1.5]}
    runs = main_runs(parse_scenario(scenario_data))
    assert len(runs) == 3 * 2 * 2
    ids = {r.run_id for r in runs}
    assert len(ids) == len(runs)
    r = next(r for r in runs if r.run_id == "dynamo__session_rate=1.5__seed7")
    assert r.config.system == "dynamo"
    assert r.config.seed == 7
    assert r.config.session_rate == 1.5
    assert r.point == ("session_rate", 1.5)


def test_integer_field_points_are_rounded(scenario_data: dict[str, Any]) -> None:
    del scenario_data["base"]["session_rate"]
    scenario_data["sweep"] = {"field": "concurrency", "values": [4, 8]}
    s = parse_scenario(scenario_data)
    run = make_run(s, s.entries[0], 0, ("concurrency", 6.4))
    assert run.config.concurrency == 6
    assert isinstance(run.config.concurrency, int)


def test_system_options_reach_the_config(scenario_data: dict[str, Any]) -> None:
    scenario_data["systems"] = [{"name": "dynamo", "system_options": {"cold_start_s": 30.0}}]
    s = parse_scenario(scenario_data)
    (run,) = main_runs(s)
    assert run.config.system_options == {"cold_start_s": 30.0}


def test_quick_shortens_and_keeps_first_seed(scenario_data: dict[str, Any]) -> None:
    scenario_data["base"].update({"duration_s": 1000, "warmup_s": 100, "drain_s": 600})
    scenario_data["seeds"] = [3, 4]
    runs = main_runs(parse_scenario(scenario_data), quick=True)
    assert {r.seed for r in runs} == {3}
    cfg = runs[0].config
    assert cfg.duration_s == 200
    assert cfg.warmup_s == pytest.approx(20)
    assert cfg.drain_s == 120


def test_quick_keeps_short_runs_whole() -> None:
    out = quick_base({"duration_s": 40, "warmup_s": 10})
    assert out["duration_s"] == 40
    assert out["warmup_s"] == 10


def test_trace_paths_resolve_from_repo_root(tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text("{}\n")
    scenario_file = tmp_path / "benchmarks" / "s.yaml"
    got = resolve_trace("traces/t.jsonl", scenario_file)
    assert Path(got) == (tmp_path / "traces" / "t.jsonl").resolve()
    assert resolve_trace("nowhere/t.jsonl", scenario_file) == "nowhere/t.jsonl"


def test_trace_scenario_clears_the_workload(scenario_data: dict[str, Any]) -> None:
    scenario_data["base"]["trace"] = "some/trace.jsonl"
    del scenario_data["base"]["session_rate"]
    s = parse_scenario(scenario_data)
    (run, *_) = main_runs(s)
    assert run.config.workload is None
    assert run.config.trace == "some/trace.jsonl"


def test_shipped_scenarios_parse() -> None:
    root = Path(__file__).resolve().parents[3] / "benchmarks"
    files = sorted(root.glob("*.yaml")) + sorted(root.glob("reference/*.yaml"))
    assert any(f.name == "smoke.yaml" for f in files)
    assert sum(1 for f in files if f.parent.name == "reference") == 30
    for f in files:
        s = load_scenario(f)
        assert main_runs(s, scenario_path=f)
