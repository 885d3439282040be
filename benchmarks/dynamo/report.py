"""Turn a side-by-side run's outputs into results.json and report.md: per workload and
system the measured mean end-to-end latency, P50/P95 TTFT and ITL, the ratios of each
Dynamo deployment to evinfra, and the simulator's prediction next to each measured value.

The replay's mean end-to-end latency averages the calls that finished; a system that
strands calls (preempted, never readmitted before the end) is not charged for them. So
next to it the report puts the mean with every unfinished call counted from its send to
the end of the replay (a lower bound on its latency) and the number of unfinished calls,
from the same per-call records `stalls.py` reads (`stalls.replay_stats`).

TTFT, TPOT and ITL are recomputed from `requests.jsonl` over token chunks only (see
`token_timing`): both servers send a chunk that carries no token, which `evinfra replay`
counts as one.

Re-render a finished run (its results.json plus `measured/*/*/requests.jsonl`) with the
current report, printing it, or rewriting report.md and results.json with `--write`:

    .venv/bin/python benchmarks/dynamo/report.py runs/sbs-X [--write]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from stalls import replay_stats

METRICS = (
    "mean_e2e_s",
    "mean_e2e_with_unfinished_s",
    "p50_ttft_s",
    "p95_ttft_s",
    "mean_itl_s",
    "p50_itl_s",
    "p95_itl_s",
)
SIM_METRICS = ("mean_e2e_s", "p50_ttft_s", "p95_ttft_s", "mean_tpot_s")
SIM_TOLERANCE = 0.15
SERVER_STATS = (
    "server_role_switches",
    "server_kv_transfer_bytes",
    "server_prefix_pulls",
    "server_node_steps",
    "server_node_busy_s",
    "server_kv_score_messages",
    "server_kv_scored_hashes",
)
"""What evinfra's own server counted (`side_by_side.evinfra_server_stats`)."""


def token_timing(row: Mapping[str, Any], leading_extra: bool) -> tuple[float, list[float]] | None:
    """(TTFT, inter-token gaps) of one successful request, counting only token chunks.

    A stream can hold chunks that carry no token: Dynamo's frontend sends `finish_reason`
    alone after the last token (a trailing extra), evinfra's disaggregated runtime sends
    an empty chunk when the prefill node hands the request off, before the decode node
    has the KV and the first token (a leading extra). `evinfra replay` counted every chunk
    before d9f1e2f and ce927c9, so in runs recorded then, with `num_output_tokens` tokens
    and more chunks than that, the surplus chunks are dropped from the start
    (`leading_extra`) or the end."""
    if row.get("error") or row.get("e2e_s") is None or row.get("ttft_s") is None:
        return None
    gaps = [float(g) for g in row.get("itl_s") or []]
    ttft = float(row["ttft_s"])
    num_tokens = int(row.get("num_output_tokens") or 0)
    extra = len(gaps) + 1 - num_tokens if num_tokens > 0 else 0
    if extra > 0 and leading_extra:
        ttft += sum(gaps[:extra])
        gaps = gaps[extra:]
    elif extra > 0:
        gaps = gaps[: len(gaps) - extra]
    return ttft, gaps


def token_gaps(rows: Iterable[Mapping[str, Any]], leading_extra: bool = False) -> list[float]:
    """Inter-token gaps of the successful requests, non-token chunks dropped."""
    gaps: list[float] = []
    for row in rows:
        timing = token_timing(row, leading_extra)
        if timing is not None:
            gaps.extend(timing[1])
    return gaps


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measured_metrics(
    run_dir: Path, leading_extra: bool = False, window_s: float = math.inf
) -> dict[str, Any]:
    """The replay's summary.json with TTFT, TPOT and ITL recomputed from requests.jsonl
    over token chunks only (`token_timing`) and the unfinished calls sent before
    `window_s` counted (`unfinished_metrics`); the replay's own values are kept as
    `replay_*`."""
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    rows = read_jsonl(run_dir / "requests.jsonl")
    timings = [t for row in rows if (t := token_timing(row, leading_extra)) is not None]
    for key in (
        "mean_ttft_s",
        "p50_ttft_s",
        "p95_ttft_s",
        "p99_ttft_s",
        "mean_itl_s",
        "p95_itl_s",
        "mean_tpot_s",
    ):
        summary[f"replay_{key}"] = summary.get(key)  # fmt: skip
    ttft = np.array([t for t, _ in timings], dtype=float)
    if len(ttft):
        summary["mean_ttft_s"] = float(ttft.mean())
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
            summary[f"{name}_ttft_s"] = float(np.percentile(ttft, q))
    tpot = np.array([sum(g) / len(g) for _, g in timings if g], dtype=float)
    if len(tpot):
        summary["mean_tpot_s"] = float(tpot.mean())
    gaps = np.array([g for _, gs in timings for g in gs], dtype=float)
    if len(gaps):
        summary["mean_itl_s"] = float(gaps.mean())
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
            summary[f"{name}_itl_s"] = float(np.percentile(gaps, q))
    summary["replay_num_unfinished"] = summary.get("num_unfinished")
    summary.update(unfinished_metrics(run_dir, window_s))
    return summary


def unfinished_metrics(run_dir: Path, window_s: float = math.inf) -> dict[str, Any]:
    """`num_unfinished` and `mean_e2e_with_unfinished_s` (every unfinished call counted
    from its send to the end of the replay) of one replay's folder, over the calls sent
    before `window_s` that did not fail; empty where the folder has no requests.jsonl."""
    calls = replay_stats(run_dir, window_s)
    if calls is None:
        return {}
    return {
        "num_unfinished": len(calls.unfinished),
        "mean_e2e_with_unfinished_s": calls.mean_e2e_with_unfinished_s,
    }


def ratio(numerator: float | None, denominator: float | None) -> float:
    if numerator is None or denominator is None or not denominator or math.isnan(denominator):
        return math.nan
    return float(numerator) / float(denominator)


def relative_error(predicted: float | None, measured: float | None) -> float:
    r = ratio(predicted, measured)
    return r - 1.0 if not math.isnan(r) else math.nan


def build_results(
    measured: Mapping[str, Mapping[str, Mapping[str, Any]]],
    simulated: Mapping[str, Mapping[str, Mapping[str, Any]]],
    baseline: str = "evinfra-evolving",
) -> dict[str, Any]:
    """measured/simulated: workload -> deployment label -> summary. Returns per workload
    the rows, Dynamo-to-evinfra ratios and the simulator's relative errors."""
    out: dict[str, Any] = {}
    for workload, by_system in measured.items():
        base = by_system.get(baseline, {})
        ratios = {
            label: {m: ratio(s.get(m), base.get(m)) for m in METRICS}
            for label, s in by_system.items()
            if label != baseline
        }
        sims = simulated.get(workload, {})
        sim_errors = _errors(by_system, sims)
        out[workload] = {
            "measured": {k: _pick(v, (*METRICS, "num_requests", "num_errors", "kv_hit_rate",
                                      "mean_tpot_s", "num_unfinished", *SERVER_STATS))
                         for k, v in by_system.items()},
            "simulated": {k: _pick(v, (*SIM_METRICS, "num_requests", "kv_hit_rate",
                                       "num_unfinished"))
                          for k, v in sims.items()},
            "ratio_to_evinfra": ratios,
            "sim_relative_error": sim_errors,
        }  # fmt: skip
    return out


def _errors(
    measured: Mapping[str, Mapping[str, Any]], sims: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    return {
        label: {m: relative_error(sims[label].get(m), measured[label].get(m)) for m in SIM_METRICS}
        for label in measured
        if label in sims
    }


def _pick(summary: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: summary.get(k) for k in keys}


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if not _known(value):
        return "n/a"
    return f"{float(value) * scale:.{digits}f}"


def _count(value: Any) -> str:
    return f"{value:.0f}" if _known(value) else "n/a"


def _pct(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    flag = "" if abs(value) <= SIM_TOLERANCE else " ✗"
    return f"{value * 100:+.0f}%{flag}"


def markdown(results: Mapping[str, Any], header: str) -> str:
    lines = [header, ""]
    for workload, res in results.items():
        lines += [f"## {workload}", ""]
        lines.append("| system | requests | mean e2e (s) | with unfinished (s) | unfinished "
                     "| P50 TTFT (s) | P95 TTFT (s) | mean ITL (ms) | P50 ITL (ms) | P95 ITL (ms) "
                     "| KV hit |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for label, m in res["measured"].items():
            lines.append(
                f"| {label} | {m.get('num_requests')} ({m.get('num_errors')} err) "
                f"| {_fmt(m['mean_e2e_s'])} | {_fmt(m.get('mean_e2e_with_unfinished_s'))} "
                f"| {_count(m.get('num_unfinished'))} "
                f"| {_fmt(m['p50_ttft_s'])} | {_fmt(m['p95_ttft_s'])} "
                f"| {_fmt(m['mean_itl_s'], 1e3, 2)} | {_fmt(m['p50_itl_s'], 1e3, 2)} "
                f"| {_fmt(m['p95_itl_s'], 1e3, 2)} | {_fmt(m.get('kv_hit_rate'), 1, 2)} |"
            )
        for label, m in res["measured"].items():
            if m.get("server_role_switches") is not None:
                moved = m.get("server_kv_transfer_bytes") or 0
                tiers = m.get("server_kv_score_messages") or 0
                lines += ["", f"{label}: {m['server_role_switches']:.0f} role switches, "
                          f"{moved:.0f} KV bytes moved between nodes "
                          f"({m.get('server_prefix_pulls') or 0:.0f} prefix pulls), "
                          f"{tiers:.0f} tier messages to nodes "
                          f"({m.get('server_kv_scored_hashes') or 0:.0f} block hashes), "
                          f"steps per node {m.get('server_node_steps')}."]  # fmt: skip
        lines += ["", "Ratio of each Dynamo deployment to evinfra (above 1: evinfra faster):", ""]
        lines.append("| system | mean e2e | with unfinished | P50 TTFT | P95 TTFT | mean ITL "
                     "| P50 ITL | P95 ITL |")  # fmt: skip
        lines.append("|---|---|---|---|---|---|---|---|")
        for label, r in res["ratio_to_evinfra"].items():
            row = " | ".join(_fmt(r.get(m), 1, 2) + ("x" if _known(r.get(m)) else "")
                             for m in METRICS)  # fmt: skip
            lines.append(f"| {label} | {row} |")
        lines += ["", "Simulator (`evinfra sim`) prediction next to the measured value "
                  "(relative error; ✗ beyond 15%):", ""]  # fmt: skip
        lines.append("| system | mean e2e meas / sim | P50 TTFT meas / sim "
                     "| P95 TTFT meas / sim | mean TPOT (ms) meas / sim |")  # fmt: skip
        lines.append("|---|---|---|---|---|")
        for label, err in res["sim_relative_error"].items():
            meas, sim = res["measured"][label], res["simulated"][label]
            cells = []
            for m in SIM_METRICS:
                scale, digits = (1e3, 2) if m == "mean_tpot_s" else (1.0, 3)
                pair = f"{_fmt(meas.get(m), scale, digits)} / {_fmt(sim.get(m), scale, digits)}"
                cells.append(f"{pair} ({_pct(err[m])})")
            lines.append(f"| {label} | {' | '.join(cells)} |")
        lines.append("")
    return "\n".join(lines)


# -- aiperf -------------------------------------------------------------------------------
AIPERF_KEYS = {
    "mean_e2e_s": ("request_latency", "avg"),
    "p50_ttft_s": ("time_to_first_token", "p50"),
    "p95_ttft_s": ("time_to_first_token", "p95"),
    "mean_itl_s": ("inter_token_latency", "avg"),
    "p50_itl_s": ("inter_token_latency", "p50"),
    "p95_itl_s": ("inter_token_latency", "p95"),
}


def aiperf_metrics(artifact_dir: Path) -> dict[str, Any]:
    """aiperf's profile_export_aiperf.json (milliseconds) in seconds with our names."""
    found = sorted(artifact_dir.rglob("profile_export_aiperf.json"))
    if not found:
        return {"error": f"no profile_export_aiperf.json under {artifact_dir}"}
    data = json.loads(found[0].read_text())
    records = data.get("records", data)
    out: dict[str, Any] = {}
    for key, (metric, stat) in AIPERF_KEYS.items():
        entry = records.get(metric) if isinstance(records, dict) else None
        value = entry.get(stat) if isinstance(entry, dict) else None
        unit = entry.get("unit", "ms") if isinstance(entry, dict) else "ms"
        scale = 1e-3 if unit == "ms" else (1e-9 if unit == "ns" else 1.0)
        out[key] = None if value is None else float(value) * scale
    count = records.get("request_count") if isinstance(records, dict) else None
    out["num_requests"] = count.get("avg") if isinstance(count, dict) else count
    return out


def crosscheck_markdown(rows: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """rows: server label -> client ("evinfra replay" | "aiperf") -> metrics."""
    lines = ["| server | client | requests | mean e2e (s) | P50 TTFT (s) | P95 TTFT (s) "
             "| mean ITL (ms) | P95 ITL (ms) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for server, by_client in rows.items():
        for client, m in by_client.items():
            if "error" in m:
                lines.append(f"| {server} | {client} | {m['error']} | | | | | |")
                continue
            lines.append(
                f"| {server} | {client} | {m.get('num_requests')} | {_fmt(m.get('mean_e2e_s'))} "
                f"| {_fmt(m.get('p50_ttft_s'))} | {_fmt(m.get('p95_ttft_s'))} "
                f"| {_fmt(m.get('mean_itl_s'), 1e3, 2)} | {_fmt(m.get('p95_itl_s'), 1e3, 2)} |"
            )
    return "\n".join(lines)


# -- the whole report ---------------------------------------------------------------------
def report_text(
    results: Mapping[str, Any],
    header: str,
    failures: Sequence[str] = (),
    crosscheck: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
) -> str:
    """report.md: the tables of `markdown`, then the failures and the aiperf cross-check."""
    text = markdown(results, header)
    if failures:
        text += "\n## Failures\n\n" + "".join(f"- {f}\n" for f in failures)
    if crosscheck:
        text += "\n## aiperf cross-check\n\n" + crosscheck_markdown(crosscheck) + "\n"
    return text


def rerender(run: Path) -> tuple[dict[str, Any], str]:
    """(results.json payload, report.md) of a finished side-by-side run folder, the
    unfinished calls recounted from `measured/<workload>/<system>/requests.jsonl` and the
    ratios recomputed; the header is the old report's (everything before its first `## `)."""
    payload: dict[str, Any] = json.loads((run / "results.json").read_text())
    window_s = float(payload["limits"]["duration_s"])
    measured = {
        workload: {
            label: {**m, **unfinished_metrics(run / "measured" / workload / label, window_s)}
            for label, m in res["measured"].items()
        }
        for workload, res in payload["results"].items()
    }
    simulated = {workload: res["simulated"] for workload, res in payload["results"].items()}
    payload["results"] = build_results(measured, simulated)
    old = run / "report.md"
    header = old.read_text().split("\n## ", 1)[0].rstrip() if old.is_file() else "# Side by side"
    text = report_text(
        payload["results"], header, payload.get("failures", []), payload.get("crosscheck")
    )
    return payload, text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Re-render a side-by-side run's report.")
    p.add_argument("run", type=Path, help="a side-by-side run folder (--out)")
    p.add_argument("--write", action="store_true", help="rewrite its report.md, results.json")
    args = p.parse_args(argv)
    payload, text = rerender(args.run)
    if args.write:
        (args.run / "results.json").write_text(json.dumps(payload, indent=2, default=float))
        (args.run / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
