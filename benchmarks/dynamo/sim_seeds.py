"""The simulator's prediction for a side-by-side run's cells over many workload seeds.

One side-by-side run measures each cell (workload x system) once, on one workload seed,
and at the small scale of that run (2 nodes, a few dozen calls in 40 s) one call placed
differently moves a mean by 10-30%. This script re-simulates the run's own configs (its
`sim/<workload>/<system>.yaml`, with its context cut) over a range of seeds and reports
what the simulator expects on average: per seed the mean e2e of the calls that finished
and the mean with every unfinished call counted to the end of the drain, as the report
does for the servers; then per system the means over seeds and, against the last system
named, the geometric mean of the per-seed ratios and the seeds won.

    .venv/bin/python benchmarks/dynamo/sim_seeds.py RUN [--seeds 0-11]
        [--workloads coding,mixed] [--systems evinfra-evolving,...,dynamo-agg] [--json F]
        [--concurrency N] [--num-blocks N]   # the run's cell moved: sessions, KV a node

Each simulation takes a second or two here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sim_cut import simulate_cut  # noqa: E402


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    mean_e2e_s: float
    """Over the calls that finished (the report's mean e2e)."""
    mean_e2e_with_unfinished_s: float
    """Every call sent in the load window, an unfinished one counted to the end of the drain."""
    num_unfinished: int


def parse_seeds(text: str) -> list[int]:
    """`0-11`, `3` or `0,2,5` -> seeds; a clear error for anything else."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise SystemExit(f"--seeds: expected e.g. 0-11 or 0,3,5, got {text!r}") from None
    if not seeds:
        raise SystemExit(f"--seeds: no seed in {text!r}")
    return seeds


def cell_overrides(
    config: Path, *, concurrency: int | None = None, num_blocks: int | None = None
) -> dict[str, Any]:
    """Config changes that move a run's cell elsewhere: sessions kept running, and KV
    blocks per node (the pool and the polynomial's capacity, both scaled from the run's)."""
    out: dict[str, Any] = {}
    if concurrency is not None:
        out["concurrency"] = concurrency
    if num_blocks is not None:
        cfg = json.loads(config.read_text())
        run_blocks = cfg["cost_options"]["kv_capacity_tokens"] // cfg["block_size"]
        out["kv_capacity_scale"] = cfg["kv_capacity_scale"] * num_blocks / run_blocks
        out["cost_options"] = {
            **cfg["cost_options"],
            "kv_capacity_tokens": num_blocks * cfg["block_size"],
        }
    return out


def simulate(
    config: Path, seed: int, max_context_tokens: int | None, overrides: dict[str, Any] | None = None
) -> SeedResult:
    result, _ = simulate_cut(str(config), max_context_tokens, {**(overrides or {}), "seed": seed})
    cfg = result.config
    end_s = cfg.duration_s + cfg.drain_s
    sent = [r for r in result.metrics.records.values() if r.arrival_s < cfg.duration_s]
    counted = [(r.finish_s if r.finish_s is not None else end_s) - r.arrival_s for r in sent]
    return SeedResult(
        seed=seed,
        mean_e2e_s=float(result.summary["mean_e2e_s"]),
        mean_e2e_with_unfinished_s=statistics.fmean(counted) if counted else math.nan,
        num_unfinished=sum(1 for r in sent if r.finish_s is None),
    )


def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def summarize(
    results: dict[str, list[SeedResult]], reference: str
) -> list[tuple[str, float, float, float, float, int]]:
    """Per system: (name, mean e2e over seeds, with unfinished, geomean ratio of the
    reference's mean e2e to this one's, the same counted, seeds where this one is faster)."""
    rows = []
    ref = results[reference]
    for name, rs in results.items():
        ratios = [b.mean_e2e_s / a.mean_e2e_s for a, b in zip(rs, ref, strict=True)]
        counted = [
            b.mean_e2e_with_unfinished_s / a.mean_e2e_with_unfinished_s
            for a, b in zip(rs, ref, strict=True)
        ]
        rows.append((
            name,
            statistics.fmean(r.mean_e2e_s for r in rs),
            statistics.fmean(r.mean_e2e_with_unfinished_s for r in rs),
            geomean(ratios),
            geomean(counted),
            sum(1 for t in ratios if t > 1.0),
        ))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a side-by-side run folder (its --out)")
    p.add_argument("--seeds", default="0-11")
    p.add_argument("--workloads", default=None, help="default: every workload in the run")
    p.add_argument("--systems", default=None,
                   help="default: every simulated system, dynamo-agg last if present")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="simulate the cell with this many sessions instead of the run's",
    )
    p.add_argument("--num-blocks", type=int, default=None,
                   help="... with this many KV blocks a node (calls cut to that KV)")  # fmt: skip
    args = p.parse_args(argv)
    for flag, value in (("--concurrency", args.concurrency), ("--num-blocks", args.num_blocks)):
        if value is not None and value <= 0:
            p.error(f"{flag}: must be a positive number, got {value}")
    results_path = args.run / "results.json"
    if not results_path.is_file():
        p.error(f"run: {args.run} has no results.json (not a side-by-side run folder?)")
    workloads = json.loads(results_path.read_text())["workloads"]
    names = args.workloads.split(",") if args.workloads else list(workloads)
    for w in names:
        if w not in workloads:
            p.error(f"--workloads: {w!r} is not in the run (it has {', '.join(workloads)})")
    seeds = parse_seeds(args.seeds)
    out: dict[str, dict[str, list[dict[str, float]]]] = {}
    for w in names:
        folder = args.run / "sim" / w
        available = sorted(c.stem for c in folder.glob("*.yaml"))
        if args.systems:
            systems = args.systems.split(",")
            missing = [s for s in systems if s not in available]
            if missing:
                p.error(f"--systems: {', '.join(missing)} not simulated in {folder} "
                        f"(it has {', '.join(available)})")  # fmt: skip
        else:
            systems = sorted(available, key=lambda s: (s == "dynamo-agg", s))
        if not systems:
            p.error(f"run: no simulated systems in {folder}")
        cut = workloads[w].get("max_context_tokens")
        if args.num_blocks is not None:
            first = json.loads((folder / f"{systems[0]}.yaml").read_text())
            cut = args.num_blocks * int(first["block_size"])
        results: dict[str, list[SeedResult]] = {s: [] for s in systems}
        cell = {"concurrency": args.concurrency, "num_blocks": args.num_blocks}
        overrides = {s: cell_overrides(folder / f"{s}.yaml", **cell) for s in systems}
        print(f"## {w} (calls cut to {cut or 'no limit'} tokens), seeds {args.seeds}")
        for seed in seeds:
            cells = []
            for s in systems:
                r = simulate(folder / f"{s}.yaml", seed, cut, overrides[s])
                results[s].append(r)
                cells.append(f"{s} {r.mean_e2e_s:6.3f} / {r.mean_e2e_with_unfinished_s:6.3f} "
                             f"({r.num_unfinished})")  # fmt: skip
            print(f"seed {seed:3d}: " + "  ".join(cells), flush=True)
        reference = systems[-1]
        print(f"\n| system | mean e2e (s) | with unfinished (s) | {reference} / system "
              "| counted | seeds faster |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        for name, mean_s, counted_s, ratio, ratio_counted, wins in summarize(results, reference):
            print(f"| {name} | {mean_s:.3f} | {counted_s:.3f} | {ratio:.3f}x | "
                  f"{ratio_counted:.3f}x | {wins}/{len(seeds)} |")  # fmt: skip
        print()
        out[w] = {s: [vars_of(r) for r in rs] for s, rs in results.items()}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def vars_of(r: SeedResult) -> dict[str, float]:
    return {"seed": r.seed, "mean_e2e_s": r.mean_e2e_s,
            "mean_e2e_with_unfinished_s": r.mean_e2e_with_unfinished_s,
            "num_unfinished": r.num_unfinished}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
