"""`evinfra bench SCENARIO.yaml --out DIR`: several systems, same cluster and workload, side
by side."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from evinfra.bench.scenario import Scenario, ScenarioError, SystemEntry, load_scenario
from evinfra.policy.bundle import available_systems
from evinfra.sim.config import ConfigError


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def add_bench_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="run several systems on one scenario and report them side by side",
        description="Runs a scenario file (benchmarks/*.yaml) and writes results.json,"
        " report.md, plots and per-run files under --out.",
    )
    p.add_argument("scenario", help="scenario YAML file (see benchmarks/README.md)")
    p.add_argument("--out", help="output directory (default: runs/<scenario name>)")
    p.add_argument(
        "--jobs", type=int, default=default_jobs(), help="worker processes (default: %(default)s)"
    )
    p.add_argument("--quick", action="store_true", help="shortened runs, first seed only")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="run these seeds instead of the scenario's (e.g. --seeds 0: one full-length seed)",
    )
    p.add_argument(
        "--systems",
        nargs="+",
        metavar="LABEL",
        help="run only these systems: the scenario's, by label (e.g. --systems evolving"
        " dynamo: the two a ratio needs), or any other known system by name, added with"
        " default options (e.g. --systems evolving-no-ttft)",
    )
    p.add_argument(
        "--resume", action="store_true", help="reuse runs already stored in --out (same config)"
    )
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNGs")
    p.add_argument(
        "--progress-every-s",
        type=float,
        default=60.0,
        help="while no run finishes, print how far the runs in flight are this often"
        " (wall seconds; default: %(default)g)",
    )
    p.set_defaults(handler=run_bench_command)


def only_systems(scenario: Scenario, labels: list[str]) -> Scenario:
    """The scenario with only the systems of these labels, in the scenario's order; a label
    the scenario lacks that names a known system is added after them, with default
    options."""
    known = scenario.labels
    registered = set(available_systems())
    unknown = [x for x in labels if x not in known and x not in registered]
    if unknown:
        raise ScenarioError(
            f"--systems: {', '.join(unknown)} neither in {scenario.name} (it has"
            f" {', '.join(known)}) nor a known system ({', '.join(sorted(registered))})"
        )
    if len(set(labels)) != len(labels):
        raise ScenarioError("--systems: duplicate label")
    kept: list[str | SystemEntry] = [
        s for s, label in zip(scenario.systems, known, strict=True) if label in labels
    ]
    kept += [x for x in labels if x not in known]
    return scenario.model_copy(update={"systems": kept})


def portable_path(path: Path) -> Path:
    """`path` as another checkout would name it: an absolute path inside a project is made
    relative to the project (the nearest folder above it with a `pyproject.toml`), so a
    report written from a worktree in /tmp says `benchmarks/x.yaml`; any other path is
    kept as given."""
    if not path.is_absolute():
        return path
    for parent in path.parents:
        if (parent / "pyproject.toml").is_file():
            return path.relative_to(parent)
    return path


def reproduce_command(args: argparse.Namespace, out: Path) -> str:
    parts = ["evinfra", "bench", str(portable_path(Path(args.scenario))), "--out", str(out)]
    if args.quick:
        parts.append("--quick")
    if args.seeds:
        parts += ["--seeds", *map(str, args.seeds)]
    if args.systems:
        parts += ["--systems", *args.systems]
    return shlex.join(parts)


def run_bench_command(args: argparse.Namespace) -> int:
    from evinfra.bench.run import run_bench

    if args.jobs < 1:
        print("evinfra bench: error: --jobs must be >= 1", file=sys.stderr)
        return 2
    if not args.progress_every_s > 0:
        print("evinfra bench: error: --progress-every-s must be > 0", file=sys.stderr)
        return 2
    path = Path(args.scenario)
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        print(f"evinfra bench: error: {exc}", file=sys.stderr)
        return 2
    if args.seeds:
        if len(set(args.seeds)) != len(args.seeds):
            print("evinfra bench: error: --seeds: duplicate seed", file=sys.stderr)
            return 2
        scenario = scenario.model_copy(update={"seeds": list(args.seeds)})
    if args.systems:
        try:
            scenario = only_systems(scenario, args.systems)
        except ScenarioError as exc:
            print(f"evinfra bench: error: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else Path("runs") / scenario.name

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        results = run_bench(
            scenario,
            out,
            jobs=args.jobs,
            quick=args.quick,
            resume=args.resume,
            scenario_path=path,
            command=reproduce_command(args, out),
            log=log,
            plots=args.plots,
            progress_every_s=args.progress_every_s,
        )
    except (ScenarioError, ConfigError) as exc:
        print(f"evinfra bench: error: {exc}", file=sys.stderr)
        return 2
    print((out / "report.md").read_text())
    failed = [k for k, v in results["runs"].items() if not v["ok"]]
    print(f"wrote {out}/results.json, {out}/report.md", file=sys.stderr)
    return 1 if failed else 0
