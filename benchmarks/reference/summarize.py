"""One Markdown table of reference runs: each `evinfra bench` output folder given (its
results.json), one row per scenario with every system's mean e2e / P95 TTFT, the ratios
against the baseline and the floor (the lower of the oracle variants run).

    .venv/bin/python benchmarks/reference/summarize.py runs/ref-kimi-k2-*-s0
    .venv/bin/python benchmarks/reference/summarize.py runs/ref-* --plot ratios.png

A scenario given in several folders (one seed each: `runs/ref-x-s0 runs/ref-x-s1 ...`)
also gets a row in a second table: `evolving`'s ratios against the baseline on each seed,
their geometric mean and range. A folder without results.json is reported and skipped.
With `--plot PNG` it also draws
each scenario's ratios against the baseline (mean e2e and P95 TTFT, one bar per system
shown, log scale) with the reference result's targets as lines; nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from evinfra.bench.aggregate import is_floor_label

SHOWN = ("evolving", "aggregated", "dynamo")
TARGETS = {"mean_e2e_s": 4.1, "p95_ttft_s": 14.0}
"""The reference result's ratios against Dynamo (mean e2e, P95 TTFT)."""


def ratio_label(value: float) -> str:
    """A ratio as the tables and the plot's bars print it: three significant digits below
    100 (1.07x, 14.8x), whole numbers with thousands separators above (142x, 1,030x),
    never scientific notation."""
    return f"{value:.3g}x" if value < 100 else f"{value:,.0f}x"


def _cell(block: dict[str, Any] | None, with_ratio: bool) -> str:
    if block is None or block.get("summary") is None:
        return "—"
    s = block["summary"]
    text = f"{s['mean_e2e_s']:.2f} / {s['p95_ttft_s']:.3g}"
    r = block.get("ratio_vs_dynamo") or {}
    if with_ratio and r.get("mean_e2e_s") and r.get("p95_ttft_s"):
        text += f" ({r['mean_e2e_s']:.2f}x / {ratio_label(r['p95_ttft_s'])})"
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


def scenario_label(results: dict[str, Any]) -> str:
    cfg = results["config"]
    name = str(results["scenario"]).removeprefix("ref-")
    return f"{name} @ {cfg['session_rate']:g}/s"


def ratios(results: dict[str, Any], metric: str) -> dict[str, float]:
    """Each shown system's ratio against the baseline on `metric` (above 1: better)."""
    out: dict[str, float] = {}
    for label in SHOWN:
        if label == results["baseline"]:
            continue
        r = (results["systems"].get(label) or {}).get("ratio_vs_dynamo") or {}
        if r.get(metric):
            out[label] = float(r[metric])
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def seed_rows(all_results: list[dict[str, Any]], system: str = "evolving") -> list[str]:
    """One row per scenario found in more than one folder: `system`'s ratios against the
    baseline (mean e2e, P95 TTFT) per seed, their geometric mean and range."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for results in all_results:
        by_name.setdefault(str(results["scenario"]), []).append(results)
    rows = []
    for name, group in by_name.items():
        if len(group) < 2:
            continue
        seeds = [s for r in group for s in r["seeds"]]
        cells = [f"{name} (seeds {','.join(map(str, seeds))})"]
        for metric in TARGETS:
            values = [ratios(r, metric).get(system) for r in group]
            known = [v for v in values if v is not None]
            if len(known) < len(values):
                cells.append("— (a seed lacks it)")
                continue
            per_seed = ", ".join(ratio_label(v) for v in known)
            cells.append(
                f"**{ratio_label(geomean(known))}** "
                f"({ratio_label(min(known))}-{ratio_label(max(known))}; {per_seed})"
            )
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _minor_label(value: float, _pos: object) -> str:
    """2x, 5x, 20x and 50x between the decades up to 100x (past it the decades' own
    labels would run into them); nothing at the other minor ticks."""
    if not 0 < value < 100:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}x" if round(mantissa) in (2, 5) else ""


def plotted_systems(all_results: list[dict[str, Any]]) -> list[str]:
    """The shown systems with a ratio in at least one scenario, in `SHOWN` order: a
    system no folder ran (evolving and dynamo only) gets no bar slot and no legend entry."""
    return [
        s for s in SHOWN if any(s in ratios(r, metric) for r in all_results for metric in TARGETS)
    ]


def plot(all_results: list[dict[str, Any]], path: Path) -> None:
    """Horizontal bars, one group per scenario, a panel per metric, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    labels = [scenario_label(r) for r in all_results]
    systems = plotted_systems(all_results)
    height = 0.8 / max(len(systems), 1)
    fig, axes = plt.subplots(
        1, 2, figsize=(11, 1.2 + 0.45 * len(labels) * max(len(systems), 1)), sharey=True
    )
    titles = {"mean_e2e_s": "mean e2e", "p95_ttft_s": "P95 TTFT"}
    for ax, metric in zip(axes, TARGETS, strict=True):
        for j, system in enumerate(systems):
            ys, xs = [], []
            for i, results in enumerate(all_results):
                value = ratios(results, metric).get(system)
                if value is not None:
                    ys.append(i + (j - (len(systems) - 1) / 2) * height)
                    xs.append(value)
            ax.barh(ys, xs, height=height, label=system)
            for y, x in zip(ys, xs, strict=True):
                ax.annotate(
                    ratio_label(x),
                    (x, y),
                    xytext=(3, 0),
                    textcoords="offset points",
                    va="center",
                    fontsize=7,
                )
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=1)
        ax.axvline(TARGETS[metric], color="red", ls="--", lw=1, label="reference target")
        ax.set_title(f"{titles[metric]}: {all_results[0]['baseline']} / system (above 1: better)")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(FuncFormatter(_minor_label))
        ax.set_yticks(range(len(labels)), labels)
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.set_axisbelow(True)  # the log scale's minor grid would stripe the bars
    axes[0].invert_yaxis()  # shared: the first scenario, and the first system, on top
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="evinfra bench --out folders")
    parser.add_argument("--plot", type=Path, help="also draw the ratios into this PNG")
    args = parser.parse_args(argv)
    print(
        "| scenario | evolving | aggregated | dynamo | floor | evolving / floor | command |\n"
        "| --- | --- | --- | --- | --- | ---: | --- |"
    )
    missing = 0
    found: list[dict[str, Any]] = []
    for folder in args.folders:
        path = folder / "results.json"
        if not path.is_file():
            print(f"skipped {folder}: no results.json", file=sys.stderr)
            missing += 1
            continue
        found.append(json.loads(path.read_text()))
        print(row(found[-1]))
    across = seed_rows(found)
    if across:
        print(
            "\nAcross seeds, evolving against the baseline (geometric mean, range, per seed):\n\n"
            "| scenario | mean e2e | P95 TTFT |\n| --- | --- | --- |"
        )
        print("\n".join(across))
    if args.plot is not None and found:
        plot(found, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if missing == len(args.folders) else 0


if __name__ == "__main__":
    raise SystemExit(main())
