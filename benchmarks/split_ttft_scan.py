"""Which stored runs the planner's TTFT rule (`mixed_past_split_ttft`) would have changed:
for each run directory, the P95 TTFT of the calls finished in a trailing window at each
planner tick while the cluster was split (no mixed node, some prefill node), and how
many ticks passed the target, read as the planner reads it (nearest-rank P95 of every
call finished in the window, however few). Roles are sampled every `sample_interval_s`
and the ticks' phase is the script's, so a run with no such tick plans the same with the
rule on only to that resolution.

    .venv/bin/python benchmarks/split_ttft_scan.py runs/*/runs/evolving*
    .venv/bin/python benchmarks/split_ttft_scan.py runs/x/runs/evolving__seed0 --target-s 1

Reads each run's `records.npz` (arrival, TTFT and e2e of every call) and
`timeseries.json` (the roles every `sample_interval_s`); the planner's own window is the
calls finished over its last `window_s` (30 s) at every plan (5 s). Runs without those
files are skipped and named.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class Scan:
    run: str
    worst_p95_ttft_s: float
    """The largest windowed P95 TTFT at a tick under a split (0 when never split)."""
    num_ticks_past: int
    first_tick_past_s: float | None


def scan_run(
    run: Path,
    target_s: float = 2.0,
    window_s: float = 30.0,
    tick_s: float = 5.0,
) -> Scan:
    records = np.load(run / "records.npz")
    samples = json.loads((run / "timeseries.json").read_text())
    finish_s = records["arrival_s"] + records["e2e_s"]
    ttft_s = records["ttft_s"]
    done = np.isfinite(finish_s)
    order = np.argsort(finish_s[done])
    finish_s, ttft_s = finish_s[done][order], ttft_s[done][order]
    times_s = np.array([float(s["time_s"]) for s in samples])
    split = np.array(
        [int(s["num_mixed_nodes"]) == 0 and int(s["num_prefill_nodes"]) > 0 for s in samples]
    )
    worst, num_past, first = 0.0, 0, None
    for now_s in np.arange(window_s, float(times_s[-1]) if len(times_s) else 0.0, tick_s):
        sample = int(np.searchsorted(times_s, now_s, side="right")) - 1
        if sample < 0 or not split[sample]:
            continue
        lo = int(np.searchsorted(finish_s, now_s - window_s))
        hi = int(np.searchsorted(finish_s, now_s, side="right"))
        if hi == lo:
            continue
        # nearest rank, as `EvolvingPlanner._observed_ttft_p95_s`
        p95 = float(np.percentile(ttft_s[lo:hi], 95, method="inverted_cdf"))
        worst = max(worst, p95)
        if p95 > target_s:
            num_past += 1
            first = float(now_s) if first is None else first
    return Scan(str(run), worst, num_past, first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (runs/<out>/runs/<id>)")
    ap.add_argument("--target-s", type=float, default=2.0, help="P95 TTFT target (s)")
    ap.add_argument("--window-s", type=float, default=30.0, help="planner window (s)")
    ap.add_argument("--tick-s", type=float, default=5.0, help="planner interval (s)")
    args = ap.parse_args(argv)
    if args.target_s <= 0 or args.window_s <= 0 or args.tick_s <= 0:
        ap.error("--target-s, --window-s and --tick-s must be > 0")
    print(f"| run | worst split-window P95 TTFT (s) | ticks past {args.target_s:g} s | first (s) |")
    print("| --- | ---: | ---: | ---: |")
    num_scanned = num_changed = 0
    for run in args.runs:
        if not (run / "records.npz").is_file() or not (run / "timeseries.json").is_file():
            print(f"skipped {run}: no records.npz or timeseries.json", file=sys.stderr)
            continue
        s = scan_run(run, args.target_s, args.window_s, args.tick_s)
        num_scanned += 1
        num_changed += s.num_ticks_past > 0
        first = "" if s.first_tick_past_s is None else f"{s.first_tick_past_s:g}"
        print(f"| {s.run} | {s.worst_p95_ttft_s:.3f} | {s.num_ticks_past} | {first} |")
    print(f"\n{num_changed} of {num_scanned} runs have a tick past the target under a split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
