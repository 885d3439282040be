"""benchmarks/reference/summarize.py: one row per bench folder, the floor the lower of the
oracle variants, folders without results skipped."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.scripts import load_script


def load() -> ModuleType:
    return load_script("benchmarks/reference/summarize.py", "reference_summarize")


def block(e2e: float, ttft: float, ratio: float | None = None) -> dict[str, Any]:
    return {
        "summary": {"mean_e2e_s": e2e, "p95_ttft_s": ttft},
        "ratio_vs_dynamo": {"mean_e2e_s": ratio, "p95_ttft_s": ratio},
        "vs_floor": {"mean_e2e_s": e2e / 4.0},
    }


def stored(folder: Path, scenario: str, systems: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """A bench folder's results.json at 3 sessions/s, one seed, written and returned."""
    results = {
        "scenario": scenario,
        "config": {"session_rate": 3.0},
        "seeds": [seed],
        "baseline": "dynamo",
        "floor": "oracle",
        "command": "evinfra bench x.yaml",
        "systems": systems,
    }
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results))
    return results


def test_rows_and_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    systems = {
        "evolving": block(5.0, 0.2, 2.0),
        "dynamo": block(10.0, 4.0),
        "oracle": block(6.0, 0.1),
        "oracle-split": block(4.0, 0.3),
    }
    stored(tmp_path / "a", "ref-x", systems)
    assert load().main([str(tmp_path / "a"), str(tmp_path / "missing")]) == 0
    out, err = capsys.readouterr()
    line = out.splitlines()[2]
    assert line.startswith("| ref-x (3 sessions/s, seeds 0) | 5.00 / 0.2 (2.00x / 2x) | — |")
    assert "| 4.00 / 0.1 | 1.25x |" in line  # the floor per metric: 4.0 split, 0.1 mixed
    assert "missing" in err
    assert load().main([str(tmp_path / "missing")]) == 1


def test_plot_draws_every_scenarios_ratios(tmp_path: Path) -> None:
    module = load()
    for name, ratio in (("ref-a", 2.0), ("ref-b", 0.5)):
        systems = {
            "evolving": block(5.0, 0.2, ratio),
            "aggregated": block(6.0, 0.3, ratio / 2),
            "dynamo": block(10.0, 4.0),
        }
        results = stored(tmp_path / name, name, systems)
        # the baseline has no bar; each other shown system its ratio
        assert module.ratios(results, "p95_ttft_s") == {"evolving": ratio, "aggregated": ratio / 2}
        assert module.scenario_label(results) == f"{name.removeprefix('ref-')} @ 3/s"
    png = tmp_path / "ratios.png"
    assert module.main([str(tmp_path / "ref-a"), str(tmp_path / "ref-b"), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000


def test_plot_slots_only_systems_that_ran_and_labels_read_plainly(tmp_path: Path) -> None:
    module = load()
    # evolving and dynamo only (`--systems evolving dynamo`): no empty aggregated slot
    only_two = [
        stored(
            tmp_path / f"ref-{i}",
            f"ref-{i}",
            {"evolving": block(5.0, 0.2, r), "dynamo": block(10.0, 4.0)},
        )
        for i, r in enumerate((2.0, 1030.0))
    ]
    assert module.plotted_systems(only_two) == ["evolving"]
    both = [*only_two, stored(tmp_path / "ref-c", "ref-c", {"aggregated": block(6.0, 0.3, 1.5)})]
    assert module.plotted_systems(both) == ["evolving", "aggregated"]
    assert [module.ratio_label(v) for v in (1.07, 14.8, 142.4, 1030.0, 1170.4)] == [
        "1.07x",
        "14.8x",
        "142x",
        "1,030x",
        "1,170x",
    ]


def test_seeds_in_separate_folders_get_a_geometric_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed, ratio in ((0, 2.0), (1, 0.5), (2, 1.0)):
        systems = {"evolving": block(5.0, 0.2, ratio), "dynamo": block(10.0, 4.0)}
        stored(tmp_path / f"x-s{seed}", "ref-x", systems, seed)
    stored(tmp_path / "y-s0", "ref-y", {"evolving": block(5.0, 0.2, 3.0), "dynamo": block(1, 1)})
    folders = [str(tmp_path / n) for n in ("x-s0", "x-s1", "x-s2", "y-s0")]
    assert load().main(folders) == 0
    out = capsys.readouterr().out
    across = out.split("Across seeds")[1]
    # geomean of 2, 0.5, 1 is 1: one row, only for the scenario with several seeds
    assert "| ref-x (seeds 0,1,2) | **1x** (0.5x-2x; 2x, 0.5x, 1x) |" in across
    assert "ref-y" not in across


def test_large_ratios_print_plainly_in_the_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed, ratio in ((0, 1174.0), (1, 882.0)):
        systems = {"evolving": block(5.0, 0.2, ratio), "dynamo": block(10.0, 4.0)}
        stored(tmp_path / f"m-s{seed}", "ref-m", systems, seed)
    assert load().main([str(tmp_path / "m-s0"), str(tmp_path / "m-s1")]) == 0
    out = capsys.readouterr().out
    assert "e+0" not in out
    assert "x / 1,174x)" in out  # the per-folder row
    assert "**1,018x** (882x-1,174x; 1,174x, 882x)" in out  # across seeds: geomean 1,017.6


def test_minor_ticks_are_labelled_only_below_100x() -> None:
    label = load()._minor_label
    assert [label(v, None) for v in (2.0, 3.0, 5.0, 20.0, 50.0, 200.0, 500.0)] == [
        "2x",
        "",
        "5x",
        "20x",
        "50x",
        "",
        "",
    ]
