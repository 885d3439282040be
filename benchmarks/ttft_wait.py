"""Where each kind of call's TTFT goes: its own prefill, computed alone on an idle node,
against the rest (waiting for the step in flight, queued prefills, prefix pulls), for
each system of a scenario at one of its points.

    .venv/bin/python benchmarks/ttft_wait.py benchmarks/light-load-kimi-k2-mixed.yaml --at 3

Runs each of the scenario's systems once (its first seed, or `--seed`) with `run_sim` and
reads the request records (calls that arrived between warm-up and the end of the window
and finished, as the summaries count them). A call's own prefill is its uncached tokens
in chunks of the step budget, each timed by the run's cost model on top of the context
before it, with nothing else in the step; the wait is its TTFT less that (negative where
the cost model's own batch is cheaper than the sum of its chunks). The question it
answers: is a system's TTFT tail its prefill work or its wait?
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from evinfra.bench.scenario import ScenarioError, load_scenario, main_runs
from evinfra.costmodel.base import BatchShape, CostModel, PrefillChunk
from evinfra.costmodel.registry import make_cost_model
from evinfra.sim.config import SimConfig
from evinfra.sim.metrics import RequestRecord
from evinfra.sim.runner import run_sim


def own_prefill_s(cost: CostModel, record: RequestRecord, chunk_tokens: int) -> float:
    """The call's uncached tokens prefilled alone, chunk by chunk, on an idle node."""
    done = record.num_cached_tokens
    left = max(record.num_prompt_tokens - done, 1)
    total_s = 0.0
    while left > 0:
        chunk = min(left, chunk_tokens)
        total_s += cost.step_time_s(BatchShape((PrefillChunk(chunk, done),)))
        done += chunk
        left -= chunk
    return total_s


def rows(cfg: SimConfig) -> list[tuple[str, int, float, float, float, float, float]]:
    """Per kind (and all calls): count, P50 / P95 TTFT, mean own prefill, P50 / P95 wait."""
    result = run_sim(cfg)
    cost = make_cost_model(cfg.cost_model, result.node_spec, **cfg.cost_options)
    records = [
        r
        for r in result.metrics.records.values()
        if cfg.warmup_s <= r.arrival_s < cfg.duration_s and r.finish_s is not None
    ]
    kind = np.array([r.kind for r in records])
    ttft = np.array([r.ttft_s for r in records], dtype=float)
    own = np.array([own_prefill_s(cost, r, cfg.max_num_batched_tokens) for r in records])
    wait = ttft - own
    out = []
    for name in [*sorted(set(kind.tolist())), "all"]:
        chosen = np.ones(len(records), dtype=bool) if name == "all" else kind == name
        if not chosen.any():
            continue
        out.append(
            (
                name,
                int(chosen.sum()),
                float(np.percentile(ttft[chosen], 50)),
                float(np.percentile(ttft[chosen], 95)),
                float(own[chosen].mean()),
                float(np.percentile(wait[chosen], 50)),
                float(np.percentile(wait[chosen], 95)),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", type=Path, help="a scenario file (benchmarks/*.yaml)")
    parser.add_argument("--at", type=float, help="the sweep point (required for a sweep)")
    parser.add_argument("--seed", type=int, help="default: the scenario's first seed")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario)
        runs = main_runs(scenario, scenario_path=args.scenario)
    except (ScenarioError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if scenario.sweep is not None and args.at is None:
        values = ", ".join(f"{v:g}" for v in scenario.sweep.values)
        field = scenario.sweep.field
        print(f"error: --at: the scenario sweeps {field} ({values})", file=sys.stderr)
        return 2
    seed = scenario.seeds[0] if args.seed is None else args.seed
    chosen = [
        r
        for r in runs
        if r.seed == seed and (r.point is None or math.isclose(r.point[1], args.at or 0.0))
    ]
    if not chosen:
        print(f"error: no run of the scenario at --at {args.at} and seed {seed}", file=sys.stderr)
        return 2
    print(
        "| system | kind | calls | P50 TTFT (ms) | P95 TTFT (ms) | own prefill, mean (ms) "
        "| wait P50 (ms) | wait P95 (ms) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in chosen:
        for kind, n, p50, p95, own, w50, w95 in rows(run.config):
            print(
                f"| {run.label} | {kind} | {n:,} | {1e3 * p50:.1f} | {1e3 * p95:.1f} "
                f"| {1e3 * own:.1f} | {1e3 * w50:.1f} | {1e3 * w95:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
