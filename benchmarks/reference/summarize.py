"""One Markdown table of reference runs: each `evinfra bench` output folder given (its
results.json), one row per scenario with every system's mean e2e / P95 TTFT, the ratios
against the baseline and the floor (the lower of the oracle variants run).

    .venv/bin/python benchmarks/reference/summarize.py runs/ref-kimi-k2-*-s0

A folder without results.json is reported and skipped; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from evinfra.bench.aggregate import is_floor_label

SHOWN = ("evolving", "aggregated", "dynamo")


def _cell(block: dict[str, Any] | None, with_ratio: bool) -> str:
    if block is None or block.get("summary") is None:
        return "—"
    s = block["summary"]
    text = f"{s['mean_e2e_s']:.2f} / {s['p95_ttft_s']:.3g}"
    r = block.get("ratio_vs_dynamo") or {}
    if with_ratio and r.get("mean_e2e_s") and r.get("p95_ttft_s"):
        text += f" ({r['mean_e2e_s']:.2f}x / {r['p95_ttft_s']:.3g}x)"
    return text


def _floor(systems: dict[str, dict[str, Any]], floor: str) -> str:
    best: dict[str, float] = {}
    for label, block in systems.items():
        if not is_floor_label(label, floor):
            continue
        s = block.get("summary")
        if s is None:
            continue
        for key in ("mean_e2e_s", "p95_ttft_s"):
            best[key] = min(best.get(key, float("inf")), float(s[key]))
    if not best:
        return "—"
    return f"{best['mean_e2e_s']:.2f} / {best['p95_ttft_s']:.3g}"


def row(results: dict[str, Any]) -> str:
    systems = results["systems"]
    cfg = results["config"]
    evolving = systems.get("evolving") or {}
    vs_floor = (evolving.get("vs_floor") or {}).get("mean_e2e_s")
    cells = [
        f"{results['scenario']} ({cfg['session_rate']:g} sessions/s, seeds "
        + ",".join(str(s) for s in results["seeds"])
        + ")",
        *(_cell(systems.get(label), label != results["baseline"]) for label in SHOWN),
        _floor(systems, results["floor"]),
        f"{vs_floor:.2f}x" if vs_floor else "—",
        f"`{results['command']}`",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="evinfra bench --out folders")
    args = parser.parse_args(argv)
    print(
        "| scenario | evolving | aggregated | dynamo | floor | evolving / floor | command |\n"
        "| --- | --- | --- | --- | --- | ---: | --- |"
    )
    missing = 0
    for folder in args.folders:
        path = folder / "results.json"
        if not path.is_file():
            print(f"skipped {folder}: no results.json", file=sys.stderr)
            missing += 1
            continue
        print(row(json.loads(path.read_text())))
    return 1 if missing == len(args.folders) else 0


if __name__ == "__main__":
    raise SystemExit(main())
