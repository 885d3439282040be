"""The fixed per-request costs of each server, measured at zero load.

One request at a time (an open-loop trace, one request every `interval_ms`, each with its
own uncached prompt, so nothing queues and nothing hits the cache) through each
deployment, and the same trace through `evinfra sim` with no fixed costs. With no queue,
the simulator's TTFT is the engine's prefill time alone, so each request's measured minus
simulated TTFT is what the server adds around the engine:

- `api_s`: aggregated deployments: HTTP, tokenization and routing in the frontend, and the
  first token's way back to the client;
- `handoff_s`: a disaggregated deployment's extra over its aggregated one: the hand-off
  from the prefill to the decode engine (messages, KV, the first step on the decode side).

Run inside the side-by-side namespace: `run_side_by_side.sh --probe --out DIR` (about
2 minutes). Writes DIR/probe.json and prints a table.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch import Deployment
from matrix import Limits, WorkloadRun, sim_config
from report import read_jsonl, token_timing

PROBE_SIZES_BLOCKS = (1, 4, 8)
"""Prompt sizes in 512-token trace blocks: 512, 2,048 and 4,096 tokens."""


@dataclass(frozen=True, slots=True)
class ProbeTrace:
    num_requests: int = 30
    interval_ms: int = 600
    output_tokens: int = 32
    block_tokens: int = 512
    burst_size: int = 12
    """Then this many one-block requests at once (the closed-loop runs start so)."""

    @property
    def burst_ms(self) -> int:
        return (self.num_requests + 1) * self.interval_ms

    @property
    def duration_s(self) -> float:
        return self.burst_ms / 1000.0 + 1.0

    def write(self, path: Path) -> None:
        """Each request with its own hash ids (no shared prefix), sizes in turn."""
        rows, next_id = [], 0
        sizes = [PROBE_SIZES_BLOCKS[i % len(PROBE_SIZES_BLOCKS)] for i in range(self.num_requests)]
        times = [i * self.interval_ms for i in range(self.num_requests)]
        sizes += [1] * self.burst_size
        times += [self.burst_ms] * self.burst_size
        for t, n in zip(times, sizes, strict=True):
            rows.append({
                "timestamp": t, "input_length": n * self.block_tokens,
                "output_length": self.output_tokens,
                "hash_ids": list(range(next_id, next_id + n)),
            })  # fmt: skip
            next_id += n
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def probe_deployments(num_nodes: int = 2) -> list[Deployment]:
    """evinfra forced aggregated (evolving stays mixed at zero load) and forced
    disaggregated (the no-planner ablation keeps 1 prefill + 1 decode; no local prefill on
    the decode node, so every request is handed off), and both Dynamo deployments."""
    always_handoff = (("max_local_prefill_tokens", "0"),)
    return [
        Deployment("evinfra", num_nodes=num_nodes, system="evolving"),
        Deployment(
            "evinfra",
            num_nodes=num_nodes,
            system="evolving-no-planner",
            system_options=always_handoff,
        ),
        Deployment("dynamo-agg", num_nodes=num_nodes),
        Deployment("dynamo-disagg", num_nodes=num_nodes),
    ]


def measured_rows(run_dir: Path, leading_extra: bool) -> list[tuple[int, float, float]]:
    """(prompt tokens, TTFT, e2e) per request, in send order."""
    rows = sorted(read_jsonl(run_dir / "requests.jsonl"), key=lambda r: float(r["send_s"]))
    out = []
    for row in rows:
        timing = token_timing(row, leading_extra)
        if timing is not None:
            out.append((int(row["num_prompt_tokens"]), timing[0], float(row["e2e_s"])))
    return out


def simulated_rows(cfg: dict[str, Any]) -> list[tuple[int, float, float]]:
    from evinfra.sim.config import load_config
    from evinfra.sim.runner import run_sim

    metrics = run_sim(load_config(None, cfg)).metrics
    out = []
    for rec in sorted(metrics.records.values(), key=lambda r: r.arrival_s):
        if rec.ttft_s is not None and rec.e2e_s is not None:
            out.append((rec.num_prompt_tokens, rec.ttft_s, rec.e2e_s))
    return out


def excess(
    measured: list[tuple[int, float, float]],
    simulated: list[tuple[int, float, float]],
    burst_size: int,
) -> dict[str, Any]:
    """Measured minus simulated TTFT and e2e, request by request (same prompt sizes in the
    same order), overall and by prompt size, over the spaced requests; over the burst,
    the excesses sorted and their least-squares slope over rank (ms per request ahead)."""
    if len(measured) != len(simulated):
        raise ValueError(f"{len(measured)} measured requests, {len(simulated)} simulated")
    burst = [
        m[1] - s[1] for m, s in zip(measured[-burst_size:], simulated[-burst_size:], strict=True)
    ]
    measured, simulated = measured[:-burst_size], simulated[:-burst_size]
    by_size: dict[int, list[float]] = {}
    ttft, e2e = [], []
    for (n_m, t_m, e_m), (n_s, t_s, e_s) in zip(measured, simulated, strict=True):
        if n_m != n_s:
            raise ValueError(f"prompt sizes differ: {n_m} measured, {n_s} simulated")
        ttft.append(t_m - t_s)
        e2e.append(e_m - e_s)
        by_size.setdefault(n_m, []).append(t_m - t_s)
    return {
        "num_requests": len(ttft),
        "median_ttft_excess_s": statistics.median(ttft),
        "mean_ttft_excess_s": statistics.fmean(ttft),
        "median_e2e_excess_s": statistics.median(e2e),
        "median_ttft_excess_by_prompt_s": {
            str(n): statistics.median(v) for n, v in sorted(by_size.items())
        },
        "median_sim_ttft_s": statistics.median(t for _, t, _ in simulated),
        "burst_ttft_excess_s": sorted(burst),
        "burst_excess_slope_s": _slope(sorted(burst)),
    }


def _slope(values: list[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(values)
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))


def probe_sim_config(
    dep: Deployment, run: WorkloadRun, limits: Limits, num_blocks: int
) -> dict[str, Any]:
    """The side-by-side sim config for `dep`, fixed costs 0."""
    cfg = sim_config(dep, run, limits, num_blocks)
    cfg["api_overhead_s"] = 0.0
    cfg["handoff_overhead_s"] = 0.0
    return cfg


def fixed_costs(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per system, the API cost (its aggregated deployment's median TTFT excess over the
    spaced requests) and the hand-off cost (its disaggregated deployment's excess over
    that). The burst is a diagnostic, not a fixed cost: its excesses are mostly the
    engines' first passes (which requests of the burst each pass takes), not the API."""
    pairs = {
        "evinfra": ("evinfra-evolving", "evinfra-evolving-no-planner"),
        "dynamo": ("dynamo-agg", "dynamo-disagg"),
    }
    out: dict[str, dict[str, float]] = {}
    for system, (agg, disagg) in pairs.items():
        if agg in results and disagg in results:
            api = results[agg]["median_ttft_excess_s"]
            handoff = results[disagg]["median_ttft_excess_s"] - api
            out[system] = {"api_overhead_s": api, "handoff_overhead_s": handoff}
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| deployment | requests | sim TTFT P50 (s) | TTFT excess P50 (ms) | by prompt (ms) "
        "| e2e excess P50 (ms) | burst slope (ms/request) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for label, r in results.items():
        by = ", ".join(
            f"{n}: {v * 1000:.1f}" for n, v in r["median_ttft_excess_by_prompt_s"].items()
        )
        lines.append(
            f"| {label} | {r['num_requests']} | {r['median_sim_ttft_s']:.3f} "
            f"| {r['median_ttft_excess_s'] * 1000:.1f} | {by} "
            f"| {r['median_e2e_excess_s'] * 1000:.1f} "
            f"| {r['burst_excess_slope_s'] * 1000:.2f} |"
        )
    return "\n".join(lines)
