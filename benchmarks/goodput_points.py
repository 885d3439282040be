"""A goodput search put together from runs made apart: the points of one scenario's search
run by `evinfra bench` (each system's half with `--systems`), by `evinfra sim --config` at
single loads, or both, judged against the scenario's targets as the bench judges them.

    .venv/bin/python benchmarks/goodput_points.py benchmarks/goodput-glm-5-coding-256.yaml \\
        runs/goodput-glm-5-coding-256-dynamo runs/gc256-28 runs/gc256-30.5 runs/gc256-33 \\
        --plot docs/img/goodput-glm-5-coding-256.png

Each DIR is one run (`summary.json` and `config.json`, as `evinfra sim --out` writes them)
or a bench output (its `runs/*`). A run counts for a system only if its config is the one
the bench would run for that system, seed and load (with or without the search's stop
rule, which only cuts runs already certain to fail); any other run is listed as skipped
with the fields that differ. At 256 GPUs a point costs up to an hour of one core, so a
search is often run a few points at a time: this prints the per-load table, each system's
goodput (the highest pass below its lowest fail, which assumes a system that fails at a
load fails above it), the ratio against dynamo with the range its brackets allow, what a
full bisection would still run, and plots P95 TTFT against load. With `--next DIR` it
also writes the config of each run the search still needs (every system's next loads,
every seed) to `DIR/runs/<run id>/config-in.yaml` and prints the command that runs it;
DIR is then one more bench output to pass back in.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from evinfra.bench.goodput import (
    Bisection,
    GoodputResult,
    PointVerdict,
    judge,
    load_axis_label,
    stop_rule,
)
from evinfra.bench.scenario import Scenario, ScenarioError, load_scenario, make_run
from evinfra.bench.store import read_summary, same_config

BASELINE = "dynamo"


@dataclass(frozen=True, slots=True)
class Point:
    label: str
    value: float
    seed: int
    summary: dict[str, Any]


def run_dirs(paths: list[Path]) -> list[Path]:
    """Every run directory under `paths` (a run itself, or a bench output's runs)."""
    out: list[Path] = []
    for p in paths:
        if (p / "summary.json").is_file():
            out.append(p)
        elif (p / "runs").is_dir():
            out.extend(sorted(d for d in (p / "runs").iterdir() if (d / "summary.json").is_file()))
        else:
            raise ValueError(f"{p}: neither a run (summary.json) nor a bench output (runs/)")
    return out


def _expected(scenario: Scenario, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, config) of every run the bench could have made at this run's load and seed."""
    spec = scenario.goodput
    assert spec is not None
    value, seed = config.get(spec.field), config.get("seed")
    if not isinstance(value, int | float) or not isinstance(seed, int):
        return []
    stops = [None, stop_rule(spec)]
    return [
        (
            e.display,
            json.loads(
                make_run(scenario, e, seed, (spec.field, value), extra=x).config.model_dump_json()
            ),
        )
        for e in scenario.entries
        for x in stops
    ]


def collect(scenario: Scenario, dirs: list[Path]) -> tuple[list[Point], list[str]]:
    """The runs that belong to the scenario's search, and why each other run was skipped."""
    spec = scenario.goodput
    assert spec is not None
    points: list[Point] = []
    skipped: list[str] = []
    for d in dirs:
        config = json.loads((d / "config.json").read_text())
        summary = read_summary(d)
        if config.get(spec.field) is None:
            skipped.append(f"{d}: no {spec.field} (the scenario's own point, not a search's)")
            continue
        expected = _expected(scenario, config)
        label = next((lab for lab, cfg in expected if same_config(config, cfg)), None)
        if label is None:
            same_system = [cfg for _, cfg in expected if cfg.get("system") == config.get("system")]
            ref = same_system[0] if same_system else (expected[0][1] if expected else {})
            differ = sorted(k for k in config.keys() | ref.keys() if config.get(k) != ref.get(k))
            skipped.append(f"{d}: not a run of this search (differs in {', '.join(differ)})")
            continue
        points.append(Point(label, float(config[spec.field]), int(config["seed"]), summary))
    return points, skipped


def search(
    scenario: Scenario, points: list[Point], *, every_system: bool = False
) -> dict[str, Bisection]:
    """Each system's search over its points (`every_system`: also those with no run)."""
    spec = scenario.goodput
    assert spec is not None
    out: dict[str, Bisection] = {}
    present = {p.label for p in points}
    for label in (e.display for e in scenario.entries if every_system or e.display in present):
        b = Bisection(spec)
        mine = [p for p in points if p.label == label]
        for value in sorted({p.value for p in mine}):
            b.record(judge(value, [p.summary for p in mine if p.value == value], spec))
        out[label] = b
    return out


def _cell(point_summaries: list[dict[str, Any]], verdict: PointVerdict) -> str:
    s = point_summaries[0]
    if s.get("stopped_s") is not None:
        return (
            f"stopped at {s['stopped_s']:.0f} s (P95 TTFT {s['p95_ttft_s']:.2f} s to then): fails"
        )
    growth = s.get("waiting_growth_s")
    queue = "-" if growth is None or math.isnan(growth) else f"{growth:+.2f} s"
    figures = (
        f"{s['mean_e2e_s']:.2f} s / {s['p95_ttft_s']:.3f} s / {s['mean_tpot_s'] * 1000:.1f} ms"
        f" / {s.get('role_switches', 0)} / {queue}"
    )
    return f"{figures}: {'passes' if verdict.passed else '**fails**'}"


def table(scenario: Scenario, points: list[Point], searches: dict[str, Bisection]) -> str:
    spec = scenario.goodput
    assert spec is not None
    labels = list(searches)
    head = f"| {load_axis_label(spec.field)} | " + " | ".join(
        f"{x}: mean e2e / P95 TTFT / mean TPOT / role switches / queue growth" for x in labels
    )
    lines = [head + " |", "| ---: |" + " ---: |" * len(labels)]
    for value in sorted({p.value for p in points}):
        cells = []
        for x in labels:
            mine = [p.summary for p in points if p.label == x and p.value == value]
            cells.append(_cell(mine, searches[x].verdicts[value]) if mine else "")
        lines.append(f"| {value:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replay_search(b: Bisection) -> tuple[list[float], dict[float, bool]]:
    """The bench's bisection walked again over these verdicts: the loads it would still
    need (the first it reaches with no run, if any), and the loads it visits without a run
    whose verdict the runs imply (a pass at or above it, or a fail at or below it)."""
    known = {v: x.passed for v, x in b.verdicts.items()}
    walk = Bisection(b.spec)
    inferred: dict[float, bool] = {}
    for _ in range(100):
        todo = walk.next_values()
        if not todo:
            return [], inferred
        missing = []
        for v in todo:
            if v in known:
                passed = known[v]
            elif any(ok and w >= v for w, ok in known.items()):
                passed = inferred[v] = True
            elif any(not ok and w <= v for w, ok in known.items()):
                passed = inferred[v] = False
            else:
                missing.append(v)
                continue
            walk.record(PointVerdict(v, passed, "inferred" if v in inferred else ""))
        if missing:
            return missing, inferred
    return [], inferred


def describe(label: str, result: GoodputResult, b: Bisection) -> str:
    fail = next((v for v in result.points if v.value == result.upper), None)
    where = (
        f"fails at {result.upper:g}: {fail.reason}" if fail is not None else "passed every load run"
    )
    if result.rate <= 0:
        return f"{label}: below {result.upper:g} (fails at every load run)"
    missing, inferred = replay_search(b)
    notes = []
    if inferred:
        passes = [f"{v:g}" for v, ok in sorted(inferred.items()) if ok]
        fails = [f"{v:g}" for v, ok in sorted(inferred.items()) if not ok]
        said = [f"passes {', '.join(passes)}"] if passes else []
        said += [f"fails {', '.join(fails)}"] if fails else []
        notes.append(f"not run, implied by the runs: {'; '.join(said)}")
    if missing:
        notes.append(f"the full search would still run {', '.join(f'{v:g}' for v in missing)}")
    return f"{label}: **{result.rate:g}** ({where})" + "".join(f"; {n}" for n in notes)


def ratio_text(sys_result: GoodputResult, base: GoodputResult) -> str | None:
    if base.rate <= 0 or sys_result.rate <= 0:
        return None
    ratio = sys_result.rate / base.rate
    low = sys_result.rate / base.upper if base.upper else None
    high = sys_result.upper / base.rate if sys_result.upper else None
    if high is None:  # no load failed yet: the system's goodput is this or more
        return f"at least {ratio:.2f}x"
    span = f" ({low:.2f}x-{high:.2f}x from the brackets)" if low else ""
    return f"{ratio:.2f}x{span}"


def write_next(scenario: Scenario, searches: dict[str, Bisection], root: Path) -> list[str]:
    """Write the config of every run the searches still need (each system's next loads,
    each seed) as `root/runs/<run id>/config-in.yaml`, the search's stop rule included as
    the bench sets it; the commands that run them, one per run. A run already there
    (its summary written) is not written again."""
    spec = scenario.goodput
    assert spec is not None
    extra = stop_rule(spec) if spec.stop_failing_runs else None
    commands: list[str] = []
    for entry in scenario.entries:
        b = searches.get(entry.display)
        if b is None:
            continue
        # the fields the bench sets, resolved (not every default: a short file)
        named = {*scenario.base, *(extra or {}), "system", "seed", spec.field}
        if entry.system_options:
            named.add("system_options")
        for value in replay_search(b)[0]:
            for seed in scenario.seeds:
                run = make_run(scenario, entry, seed, (spec.field, value), extra=extra)
                d = root / "runs" / run.run_id
                if (d / "summary.json").is_file():
                    continue
                d.mkdir(parents=True, exist_ok=True)
                fields = run.config.model_dump(mode="json", include=named)
                (d / "config-in.yaml").write_text(yaml.safe_dump(fields, sort_keys=False))
                commands.append(f"evinfra sim --config {d / 'config-in.yaml'} --out {d}")
    return commands


def plot(
    scenario: Scenario, points: list[Point], searches: dict[str, Bisection], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = scenario.goodput
    assert spec is not None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (label, b) in enumerate(searches.items()):
        color = f"C{i}"
        mine = sorted((p for p in points if p.label == label), key=lambda p: p.value)
        xs = [p.value for p in mine]
        ys = [max(float(p.summary["p95_ttft_s"]), 1e-3) for p in mine]
        ax.plot(xs, ys, color=color, alpha=0.5)
        for p, y in zip(mine, ys, strict=True):
            ok = b.verdicts[p.value].passed
            ax.plot(p.value, y, "o", color=color, mfc=color if ok else "white", ms=7)
        result = b.result()
        least = "at least " if result.upper is None else ""  # no load failed yet
        ax.plot([], [], "o", color=color, label=f"{label}: goodput {least}{result.rate:g}")
    ax.axhline(spec.ttft_p95_s, color="grey", ls="--", lw=1, label=f"target {spec.ttft_p95_s:g} s")
    ax.set_yscale("log")
    ax.set_xlabel(load_axis_label(spec.field))
    ax.set_ylabel("P95 TTFT (s; hollow: fails a target)")
    ax.set_title(scenario.name, fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(
    scenario: Scenario, points: list[Point], skipped: list[str], plot_path: Path | None
) -> None:
    """Print the per-load table, each system's goodput and the ratios; plot if asked."""
    searches = search(scenario, points)
    print(table(scenario, points, searches))
    print()
    results = {x: b.result() for x, b in searches.items()}
    for x, b in searches.items():
        print("- " + describe(x, results[x], b))
    if BASELINE in results:
        for x, r in results.items():
            if x != BASELINE and (text := ratio_text(r, results[BASELINE])) is not None:
                print(f"- {x} against {BASELINE}: **{text}**")
    for line in skipped:
        print(f"- skipped {line}")
    if plot_path is not None:
        plot(scenario, points, searches, plot_path)
        print(f"wrote {plot_path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", type=Path, help="the goodput scenario the runs belong to")
    p.add_argument(
        "dirs", type=Path, nargs="*", help="run directories or bench outputs (none: --next only)"
    )
    p.add_argument("--plot", type=Path, help="write P95 TTFT against load here (PNG)")
    p.add_argument(
        "--next",
        type=Path,
        metavar="DIR",
        help="write the configs of the runs the search still needs under DIR/runs/",
    )
    p.add_argument(
        "--max-waiting-growth-s",
        type=float,
        metavar="S",
        help="judge with this queue rule instead of the scenario's (goodput's"
        " max_waiting_growth_s): a load also fails where the waiting queue grew by more",
    )
    args = p.parse_args(argv)
    if args.max_waiting_growth_s is not None and not args.max_waiting_growth_s > 0:
        p.error(f"--max-waiting-growth-s must be > 0, not {args.max_waiting_growth_s}")
    try:
        scenario = load_scenario(args.scenario)
        if scenario.goodput is None:
            raise ScenarioError(f"{args.scenario}: no goodput section")
        if args.max_waiting_growth_s is not None:
            spec = scenario.goodput.model_copy(
                update={"max_waiting_growth_s": args.max_waiting_growth_s}
            )
            scenario = scenario.model_copy(update={"goodput": spec})
        dirs = run_dirs(args.dirs)
    except (OSError, ScenarioError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    points, skipped = collect(scenario, dirs)
    if not points and args.next is None:
        print("error: no run of this search among the directories given", file=sys.stderr)
        return 2
    if points:
        report(scenario, points, skipped, args.plot)
    if args.next is not None:
        commands = write_next(scenario, search(scenario, points, every_system=True), args.next)
        print(f"\n{len(commands)} run(s) still needed by the full search, under {args.next}:")
        for command in commands:
            print(f"    {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
