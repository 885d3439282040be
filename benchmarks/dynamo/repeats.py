"""Repeats of one side-by-side cell, summarised: per workload the ratio of each other
system's mean e2e and P95 TTFT to evinfra's (`evinfra-evolving`; above 1: evinfra faster)
as min / median / max over the repeats, and per system the measured value next to the
simulator's prediction, min / median / max each.

    .venv/bin/python benchmarks/dynamo/repeats.py RUN1 RUN2 RUN3   # each a run's --out
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BASELINE = "evinfra-evolving"
OTHERS = ("dynamo-agg", "dynamo-disagg", "evinfra-evolving-lru")
METRICS = ("mean_e2e_s", "p95_ttft_s")


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(min, median, max) of the values present, or None when there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return min(present), statistics.median(present), max(present)


def fmt(s: tuple[float, float, float] | None, unit: str = "") -> str:
    if s is None:
        return "n/a"
    lo, mid, hi = s
    return f"{mid:.2f}{unit} ({lo:.2f}-{hi:.2f})"


def values(runs: Sequence[Mapping[str, Any]], workload: str, label: str, metric: str,
           kind: str) -> Any:  # fmt: skip
    """The spread of one system's `metric` over the repeats, from each run's `kind` table
    ("measured", "simulated", or "ratio_to_evinfra")."""
    return spread([r["results"][workload][kind].get(label, {}).get(metric)
                   for r in runs if workload in r["results"]])  # fmt: skip


def markdown(runs: Sequence[Mapping[str, Any]]) -> str:
    workloads = list(runs[0]["results"])
    lines = [f"{len(runs)} repeats; median (min-max).", "",
             "| workload | metric | evinfra | vs Dynamo agg | vs Dynamo disagg | vs evinfra-lru |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for w in workloads:
        for m in METRICS:
            base = values(runs, w, BASELINE, m, "measured")
            cells = [fmt(values(runs, w, o, m, "ratio_to_evinfra"), "x") for o in OTHERS]
            lines.append(f"| {w} | {m} | {fmt(base, ' s')} | {' | '.join(cells)} |")
    lines += ["", "| workload | system | mean e2e meas (s) | sim | P95 TTFT meas (s) | sim "
              "| errors | calls cut |", "|---|---|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for w in workloads:
        for label in (BASELINE, *OTHERS):
            row = [fmt(values(runs, w, label, m, kind)) for m in METRICS
                   for kind in ("measured", "simulated")]  # fmt: skip
            errors = [r["results"][w]["measured"].get(label, {}).get("num_errors") for r in runs]
            cut = [r.get("_cut", {}).get(w, {}).get(label) for r in runs]
            lines.append(f"| {w} | {label} | {' | '.join(row)} | {errors} | {cut} |")
    return "\n".join(lines)


def load(path: Path) -> dict[str, Any]:
    """A run's results.json, with the calls each replay cut (`num_cut_calls` of its
    summary.json) under `_cut`."""
    run: dict[str, Any] = json.loads((path / "results.json").read_text())
    cut: dict[str, dict[str, Any]] = {}
    for summary in sorted(path.glob("measured/*/*/summary.json")):
        s = json.loads(summary.read_text())
        cut.setdefault(summary.parent.parent.name, {})[summary.parent.name] = s.get("num_cut_calls")
    run["_cut"] = cut
    return run


def main(paths: Sequence[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown([load(Path(p)) for p in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
