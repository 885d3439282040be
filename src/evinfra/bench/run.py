"""A whole benchmark: the scenario's runs, the goodput search, results.json, report.md and
the plots, all under one output directory."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evinfra.bench.aggregate import point_blocks, runs_table, sanitize
from evinfra.bench.execute import BenchExecutor, RunOutcome
from evinfra.bench.goodput import (
    STEP_UP_FACTOR,
    Bisection,
    goodput_ratio,
    judge,
    result_to_json,
    stop_rule,
)
from evinfra.bench.scenario import (
    QUICK_MAX_BISECTIONS,
    RunSpec,
    Scenario,
    main_runs,
    make_run,
    seeds_for,
)

Log = Callable[[str], None]


def _goodput_runs(
    scenario: Scenario, ex: BenchExecutor, quick: bool, scenario_path: Path | None
) -> tuple[dict[str, Any], list[RunSpec]]:
    """Bisection per system, each system's next loads started as soon as its last are
    judged (the systems' searches side by side, not in lockstep)."""
    spec = scenario.goodput
    assert spec is not None
    seeds = seeds_for(scenario, quick)
    searches = {e.display: Bisection(spec) for e in scenario.entries}
    entries = {e.display: e for e in scenario.entries}
    if quick:
        for b in searches.values():
            b.limit_bisections(QUICK_MAX_BISECTIONS)
    all_specs: list[RunSpec] = []
    extra = None
    if spec.stop_failing_runs and len(seeds) == 1:
        extra = stop_rule(spec)

    def specs_at(label: str, value: float) -> list[RunSpec]:
        return [
            make_run(
                scenario,
                entries[label],
                seed,
                (spec.field, value),
                quick=quick,
                scenario_path=scenario_path,
                extra=extra,
            )
            for seed in seeds
        ]

    # the sweep's points count when they vary the same field
    for label, search in searches.items():
        if scenario.sweep is not None and scenario.sweep.field == spec.field:
            for value in scenario.sweep.values:
                runs = specs_at(label, value)
                if all(r.run_id in ex.outcomes for r in runs):
                    search.record(judge(value, [ex.outcomes[r.run_id].summary for r in runs], spec))
    asked: dict[str, dict[float, list[RunSpec]]] = {}

    def next_batch(label: str) -> list[RunSpec]:
        asked[label] = {v: specs_at(label, v) for v in searches[label].next_values()}
        batch = [r for runs in asked[label].values() for r in runs]
        all_specs.extend(batch)
        return batch

    def then(label: str) -> list[RunSpec]:
        search = searches[label]
        for value, runs in asked[label].items():
            search.record(judge(value, [ex.outcomes[r.run_id].summary for r in runs], spec))
        return next_batch(label)

    # each system's search goes on as soon as its own loads are judged
    ex.run_chains({label: next_batch(label) for label in searches}, then)
    results = {label: s.result() for label, s in searches.items()}
    base = results.get(scenario.baseline)
    systems = {}
    for label, res in results.items():
        block = result_to_json(res)
        block["ratio_vs_dynamo"] = goodput_ratio(res, base) if base is not None else None
        systems[label] = block
    return {"targets": spec.model_dump(), "systems": systems}, all_specs


def _estimate_goodput_work(scenario: Scenario, quick: bool) -> list[RunSpec]:
    spec = scenario.goodput
    if spec is None:
        return []
    steps = 2 + (min(spec.iterations, QUICK_MAX_BISECTIONS) if quick else spec.iterations)
    if spec.rate_max is not None:
        # at most this many steps above rate_hi (an estimate for progress, not a limit)
        steps += math.ceil(math.log(spec.rate_max / spec.rate_hi) / math.log(STEP_UP_FACTOR))
    per = [
        make_run(scenario, e, s, None, quick=quick)
        for e in scenario.entries
        for s in seeds_for(scenario, quick)
    ]
    return per * steps


def run_bench(
    scenario: Scenario,
    out: Path,
    *,
    jobs: int = 1,
    quick: bool = False,
    resume: bool = False,
    scenario_path: Path | None = None,
    command: str = "",
    log: Log = print,
    plots: bool = True,
    progress_every_s: float = 60.0,
) -> dict[str, Any]:
    """Runs everything, writes results.json, report.md and the plots; returns the results."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    specs = main_runs(scenario, quick=quick, scenario_path=scenario_path)
    goodput: dict[str, Any] | None = None
    goodput_specs: list[RunSpec] = []
    with BenchExecutor(
        out, jobs=jobs, resume=resume, log=log, progress_every_s=progress_every_s
    ) as ex:
        ex.plan(specs)
        ex.plan(_estimate_goodput_work(scenario, quick))
        outcomes: dict[str, RunOutcome] = dict(ex.run(specs))
        if scenario.goodput is not None:
            goodput, goodput_specs = _goodput_runs(scenario, ex, quick, scenario_path)
        outcomes.update(ex.outcomes)
    results = build_results(
        scenario,
        specs,
        outcomes,
        goodput,
        quick=quick,
        command=command,
        scenario_path=scenario_path,
    )
    results["runs"] = runs_table(specs + goodput_specs, outcomes)
    results["wall_s"] = time.perf_counter() - start
    (out / "results.json").write_text(json.dumps(sanitize(results), indent=2))
    from evinfra.bench.report import write_report

    plot_files: list[str] = []
    if plots:
        from evinfra.bench.plots import make_plots

        plot_files = [p.name for p in make_plots(results, out)]
    write_report(results, out, plot_files)
    return results


def build_results(
    scenario: Scenario,
    specs: list[RunSpec],
    outcomes: dict[str, RunOutcome],
    goodput: dict[str, Any] | None,
    *,
    quick: bool,
    command: str,
    scenario_path: Path | None,
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "scenario": scenario.name,
        "description": scenario.description,
        "file": str(scenario_path) if scenario_path else None,
        "command": command,
        "quick": quick,
        "seeds": seeds_for(scenario, quick),
        "baseline": scenario.baseline,
        "floor": scenario.floor,
        "config": json.loads(specs[0].config.model_dump_json(exclude={"system", "seed"})),
        "sweep": None,
        "goodput": goodput,
    }
    if scenario.sweep is None:
        results["systems"] = point_blocks(scenario, specs, outcomes)
        return results
    sweep = scenario.sweep
    points = []
    for value in sweep.values:
        at = [s for s in specs if s.point == (sweep.field, value)]
        points.append({"value": value, "systems": point_blocks(scenario, at, outcomes)})
    results["sweep"] = {
        "field": sweep.field,
        "values": sweep.values,
        "headline": sweep.headline_value,
        "points": points,
    }
    head = next(p for p in points if p["value"] == sweep.headline_value)
    results["systems"] = head["systems"]
    return results
