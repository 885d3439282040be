"""benchmarks/dynamo/repeats.py: min / median / max over repeated side-by-side runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.scripts import load_script


def load() -> ModuleType:
    return load_script("benchmarks/dynamo/repeats.py", "dynamo_repeats")


def run(folder: Path, evinfra_e2e: float, agg_ratio: float, num_cut: int) -> None:
    table = {"evinfra-evolving": {"mean_e2e_s": evinfra_e2e, "p95_ttft_s": 0.4}}
    results = {
        "results": {
            "coding": {
                "measured": table,
                "simulated": table,
                "ratio_to_evinfra": {"dynamo-agg": {"mean_e2e_s": agg_ratio}},
            }
        }
    }
    summary = folder / "measured" / "coding" / "evinfra-evolving" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({"num_cut_calls": num_cut}))
    (folder / "results.json").write_text(json.dumps(results))


def test_spread_is_min_median_max_of_the_values_present() -> None:
    repeats = load()
    assert repeats.spread([3.0, None, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    assert repeats.spread([None]) is None
    assert repeats.fmt((1.0, 2.0, 3.0), "x") == "2.00x (1.00-3.00)"
    assert repeats.fmt(None) == "n/a"


def test_markdown_reports_ratios_values_and_cut_calls(tmp_path: Path) -> None:
    repeats = load()
    for i, (e2e, ratio) in enumerate(((6.0, 1.2), (7.0, 0.9), (5.0, 1.5))):
        run(tmp_path / f"r{i}", e2e, ratio, num_cut=1)
    runs: list[dict[str, Any]] = [repeats.load(tmp_path / f"r{i}") for i in range(3)]
    text = repeats.markdown(runs)
    assert text.startswith("3 repeats; median (min-max).")
    assert "| coding | mean_e2e_s | 6.00 s (5.00-7.00) | 1.20x (0.90-1.50) | n/a | n/a |" in text
    # measured beside simulated, and each repeat's cut calls
    assert "| coding | evinfra-evolving | 6.00 (5.00-7.00) | 6.00 (5.00-7.00) |" in text
    assert text.rstrip().endswith("| [None, None, None] |")
    assert "| [1, 1, 1] |" in text
