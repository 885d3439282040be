"""`evinfra sim`: run one system on one cluster and workload in the simulator."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from evinfra.sim.config import ConfigError, load_config
from evinfra.sim.runner import SimResult, run_sim

SUMMARY_ROWS = (
    ("requests", "num_requests", "{:.0f}"),
    ("unfinished", "num_unfinished", "{:.0f}"),
    ("sessions", "num_sessions", "{:.0f}"),
    ("mean e2e (s)", "mean_e2e_s", "{:.3f}"),
    ("p50 TTFT (s)", "p50_ttft_s", "{:.3f}"),
    ("p95 TTFT (s)", "p95_ttft_s", "{:.3f}"),
    ("p99 TTFT (s)", "p99_ttft_s", "{:.3f}"),
    ("mean TPOT (ms)", "mean_tpot_s", "{:.2f}"),
    ("tok/s", "throughput_tok_s", "{:.0f}"),
    ("tok/s/GPU", "throughput_tok_s_per_gpu", "{:.1f}"),
    ("KV hit rate", "kv_hit_rate", "{:.3f}"),
    ("recomputed tokens", "recomputed_tokens", "{:.0f}"),
    ("KV bytes moved (GB)", "kv_bytes_moved", "{:.2f}"),
    ("  handed off (GB)", "kv_bytes_handed_off", "{:.2f}"),
    ("  pulled (GB)", "kv_bytes_pulled", "{:.2f}"),
    ("  migrated (GB)", "kv_bytes_migrated", "{:.2f}"),
    ("role switches", "role_switches", "{:.0f}"),
    ("sim events", "sim_events", "{:.0f}"),
    ("wall (s)", "wall_s", "{:.1f}"),
)


def format_value(key: str, value: Any, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if key == "mean_tpot_s":
        value = value * 1000
    if key.startswith("kv_bytes_"):
        value = value / 1e9
    return fmt.format(value)


def format_table(summaries: list[dict[str, Any]]) -> str:
    """A plain-text table: one row per metric, one column per system."""
    names = [str(s.get("system", "?")) for s in summaries]
    width = max(20, *(len(n) + 2 for n in names))
    lines = ["metric".ljust(22) + "".join(n.rjust(width) for n in names)]
    for label, key, fmt in SUMMARY_ROWS:
        cells = [format_value(key, s.get(key, math.nan), fmt) for s in summaries]
        lines.append(label.ljust(22) + "".join(c.rjust(width) for c in cells))
    return "\n".join(lines)


class ProgressLine:
    """Prints simulated time and events to stderr at most every `every_s` of wall time."""

    def __init__(self, label: str, horizon_s: float, every_s: float = 2.0) -> None:
        self.label = label
        self.horizon_s = horizon_s
        self.every_s = every_s
        self.start = time.perf_counter()
        self.last = 0.0

    def __call__(self, sim_s: float, num_events: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s:
            return
        self.last = now
        pct = min(100.0, 100.0 * sim_s / self.horizon_s)
        print(
            f"[{self.label}] {sim_s:8.1f}/{self.horizon_s:.0f} s simulated ({pct:5.1f}%),"
            f" {num_events:,} events, {now - self.start:6.1f} s wall",
            file=sys.stderr,
            flush=True,
        )


def write_result(result: SimResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, default=float))
    (out / "config.json").write_text(result.config.model_dump_json(indent=2))
    samples = [
        {
            "time_s": s.time_s,
            "num_prefill_nodes": s.num_prefill_nodes,
            "num_decode_nodes": s.num_decode_nodes,
            "num_mixed_nodes": s.num_mixed_nodes,
            "num_offline_nodes": s.num_offline_nodes,
            "active_sessions_by_kind": s.active_sessions_by_kind,
            "kv_hit_rate": s.kv_hit_rate,
            "num_waiting_requests": s.num_waiting_requests,
            "num_running_decodes": s.num_running_decodes,
            "kv_usage": s.kv_usage,
        }
        for s in result.metrics.samples
    ]
    (out / "timeseries.json").write_text(json.dumps(samples))


def add_common_sim_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with SimConfig fields; flags override it")
    p.add_argument("--workload", help="coding | math | computer-use | mixed")
    p.add_argument("--trace", help="a Mooncake / Azure / session JSONL trace to replay")
    p.add_argument("--rate-scale", type=float, dest="rate_scale")
    p.add_argument("--session-rate", type=float, dest="session_rate", help="sessions per second")
    p.add_argument("--concurrency", type=int, help="sessions kept running")
    p.add_argument("--num-sessions", type=int, dest="num_sessions")
    p.add_argument("--no-hints", dest="hints", action="store_const", const=False)
    p.add_argument("--model", help="kimi-k2 | glm-5 | llama-3-70b | smollm2-135m | tiny")
    p.add_argument("--gpu", help="gb300 | b200 | h200 | h100")
    p.add_argument("--num-gpus", type=int, dest="num_gpus")
    p.add_argument("--gpus-per-node", type=int, dest="gpus_per_node")
    p.add_argument("--cost-model", dest="cost_model", help="roofline | dynamo-polynomial | profile")
    p.add_argument("--duration-s", type=float, dest="duration_s")
    p.add_argument("--warmup-s", type=float, dest="warmup_s")
    p.add_argument("--seed", type=int)


def add_sim_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("sim", help="simulate one system on a cluster and workload")
    p.add_argument("--system", help="evolving | dynamo | dynamo-agentic | aggregated | oracle ...")
    add_common_sim_flags(p)
    p.add_argument(
        "--api-overhead-s",
        type=float,
        dest="api_overhead_s",
        help="fixed per-request API/frontend time (default 0)",
    )
    p.add_argument(
        "--handoff-overhead-s",
        type=float,
        dest="handoff_overhead_s",
        help="fixed time per disaggregated hand-off (default 0)",
    )
    p.add_argument(
        "--stop-past-ttft-p95-s",
        type=float,
        dest="stop_past_ttft_p95_s",
        help="stop once P95 TTFT is certain to pass this (or 1%% to be left unfinished)",
    )
    p.add_argument("--out", help="directory for summary.json, config.json, timeseries.json")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(handler=run_sim_command)


OVERRIDE_KEYS = (
    "system", "workload", "trace", "rate_scale", "session_rate", "concurrency", "num_sessions",
    "hints", "model", "gpu", "num_gpus", "gpus_per_node", "cost_model", "duration_s",
    "warmup_s", "seed", "api_overhead_s", "handoff_overhead_s", "stop_past_ttft_p95_s",
)  # fmt: skip


def run_sim_command(args: argparse.Namespace) -> int:
    overrides = {k: getattr(args, k, None) for k in OVERRIDE_KEYS}
    if args.trace is not None:
        overrides["workload"] = None
    try:
        cfg = load_config(args.config, overrides)
        progress = None if args.quiet else ProgressLine(cfg.system, cfg.duration_s)
        result = run_sim(cfg, progress)
    except ConfigError as exc:
        print(f"evinfra sim: error: {exc}", file=sys.stderr)
        return 2
    print(format_table([result.summary]))
    if result.summary.get("stopped_reason"):
        print(f"{result.summary['stopped_reason']} (figures up to then)")
    if args.out:
        write_result(result, Path(args.out))
        print(f"wrote {args.out}/summary.json", file=sys.stderr)
    return 0
