"""report.md: the scenario, the command that reproduces it, one table to read in ten
seconds, what stands out (including where a system falls behind the baseline), the sweep
and goodput tables, the plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from evinfra.bench.goodput import STEP_UP_FACTOR, goodput_label, unit_suffix
from evinfra.workloads.factory import DEFAULT_SESSION_RATE_PER_S

UNFINISHED_WARN_FRAC = 0.01


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _fmt(value: Any, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    v = _num(value)
    return "n/a" if v is None else fmt.format(v * scale)


def _ratio(value: Any) -> str:
    v = _num(value)
    return "n/a" if v is None else f"{v:.2f}x"


def _with_spread(block: dict[str, Any], key: str, fmt: str, scale: float = 1.0) -> str:
    text = _fmt(block["summary"].get(key), fmt, scale)
    sp = block.get("spread", {}).get(key)
    if sp and len(block.get("seeds", [])) > 1:
        text += f" ±{fmt.format(sp['std'] * scale)}"
    return text


def describe_setup(results: dict[str, Any]) -> str:
    c = results["config"]
    load = (
        f"{c['session_rate']} sessions/s"
        if c.get("session_rate")
        else f"{c['concurrency']} concurrent sessions"
        if c.get("concurrency")
        else "the trace's own arrivals"
        + (f" x{c['rate_scale']}" if c.get("rate_scale") != 1 else "")
        if c.get("trace")
        else f"{DEFAULT_SESSION_RATE_PER_S:g} sessions/s (the workload default)"
    )
    what = f"trace `{c['trace']}`" if c.get("trace") else f"`{c['workload']}` workload"
    if results.get("sweep"):
        sw = results["sweep"]
        load = f"sweep of {sw['field']} over {', '.join(f'{v:g}' for v in sw['values'])}"
    return (
        f"{what}; model `{c['model']}` on {c['num_gpus']} x `{c['gpu']}`"
        f" ({c['num_gpus'] // c['gpus_per_node']} nodes of {c['gpus_per_node']});"
        f" load: {load}; {c['duration_s']:g} s simulated ({c['warmup_s']:g} s warm-up"
        f" excluded); seeds {', '.join(map(str, results['seeds']))}"
        + ("; **--quick** (shortened)" if results.get("quick") else "")
    )


def main_table(results: dict[str, Any]) -> list[str]:
    base = results["baseline"]
    gp = (results.get("goodput") or {}).get("systems", {})
    head = (
        f"| system | mean e2e (s) | vs {base} | P95 TTFT (s) | vs {base} | mean TPOT (ms)"
        " | tok/s/GPU | KV hit | e2e / floor |"
    )
    sep = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    if gp:
        head += f" goodput{unit_suffix(results['goodput']['targets']['field'])} | vs {base} |"
        sep += " ---: | ---: |"
    lines = [head, sep]
    for label, block in results["systems"].items():
        if block["summary"] is None:
            lines.append(f"| {label} | failed: see Runs |" + " |" * (sep.count("|") - 3))
            continue
        r = block["ratio_vs_dynamo"]
        row = (
            f"| {label} | {_with_spread(block, 'mean_e2e_s', '{:.3f}')} | {_ratio(r['mean_e2e_s'])}"
            f" | {_with_spread(block, 'p95_ttft_s', '{:.3f}')} | {_ratio(r['p95_ttft_s'])}"
            f" | {_with_spread(block, 'mean_tpot_s', '{:.1f}', 1000)}"
            f" | {_fmt(block['summary'].get('throughput_tok_s_per_gpu'), '{:.0f}')}"
            f" | {_fmt(block['summary'].get('kv_hit_rate'), '{:.3f}')}"
            f" | {_ratio(block['vs_floor']['mean_e2e_s'])} |"
        )
        if gp:
            g = gp.get(label, {})
            row += f" {goodput_label(g)} | {_ratio(g.get('ratio_vs_dynamo'))} |"
        lines.append(row)
    lines.append("")
    lines.append(
        f"`vs {base}`: {base}'s value / the system's (above 1: lower latency than {base}, or"
        f" for goodput: higher). `e2e / floor`: mean e2e / the lowest of"
        f" `{results['floor']}` and its variants (`{results['floor']}-...`) in the run"
        " (1 is the limit)."
    )
    return lines


def findings(results: dict[str, Any]) -> list[str]:
    """Plain statements about the headline point: ahead of or behind the baseline, failed
    runs, unfinished requests."""
    base, floor = results["baseline"], results["floor"]
    out = []
    systems = results["systems"]
    if base not in systems or systems[base]["summary"] is None:
        out.append(f"- No `{base}` result: ratios are missing.")
    for label, block in systems.items():
        if block["errors"]:
            seeds = ", ".join(block["errors"])
            out.append(f"- `{label}` failed for seed(s) {seeds}: see results.json `runs`.")
        s = block["summary"]
        if s is None:
            continue
        n, left = s.get("num_requests", 0), s.get("num_unfinished", 0)
        if n + left and left / (n + left) > UNFINISHED_WARN_FRAC:
            out.append(
                f"- `{label}` left {left:.0f} of {n + left:.0f} window requests unfinished"
                " after the drain: it is overloaded, its latencies are underestimated."
            )
        if label in (base, floor):
            continue
        r = block["ratio_vs_dynamo"]
        e2e, ttft = _num(r["mean_e2e_s"]), _num(r["p95_ttft_s"])
        if e2e is None or ttft is None:
            continue
        if e2e >= 1 and ttft >= 1:
            out.append(
                f"- `{label}` is ahead of `{base}`: {e2e:.2f}x lower mean e2e latency,"
                f" {ttft:.2f}x lower P95 TTFT."
            )
        else:
            behind = [n for n, v in (("mean e2e", e2e), ("P95 TTFT", ttft)) if v < 1]
            out.append(
                f"- **`{label}` is behind `{base}`** on {' and '.join(behind)}"
                f" (mean e2e {e2e:.2f}x, P95 TTFT {ttft:.2f}x)."
            )
    return out


def sweep_findings(results: dict[str, Any]) -> list[str]:
    """The sweep's points, other than the headline, where a system is behind the baseline
    on mean e2e or P95 TTFT (the headline's are in `findings`)."""
    sw = results.get("sweep")
    if not sw:
        return []
    base, floor = results["baseline"], results["floor"]
    out = []
    for p in sw["points"]:
        if p["value"] == sw["headline"]:
            continue
        b = (p["systems"].get(base) or {}).get("summary")
        if b is None:
            continue
        for label, block in p["systems"].items():
            s = block.get("summary")
            if label in (base, floor) or s is None:
                continue
            r = block["ratio_vs_dynamo"]  # the point's own ratios (`add_ratios`)
            behind = [
                f"{name} {v:.2f}x"
                for name, key in (("mean e2e", "mean_e2e_s"), ("P95 TTFT", "p95_ttft_s"))
                if (v := _num(r[key])) is not None and v < 1
            ]
            if behind:
                out.append(
                    f"- **`{label}` is behind `{base}` at {sw['field']} = {p['value']:g}**:"
                    f" {', '.join(behind)} (mean e2e {_fmt(s['mean_e2e_s'])} s against"
                    f" {_fmt(b['mean_e2e_s'])} s)."
                )
    return out


def sweep_table(results: dict[str, Any]) -> list[str]:
    sw = results["sweep"]
    labels = list(sw["points"][0]["systems"])
    lines = [
        f"| {sw['field']} | " + " | ".join(f"{x} e2e (s) / P95 TTFT (s)" for x in labels) + " |",
        "| ---: |" + " ---: |" * len(labels),
    ]
    for p in sw["points"]:
        cells = []
        for x in labels:
            b = p["systems"].get(x)
            if b is None or b["summary"] is None:
                cells.append("failed")
                continue
            cells.append(f"{_fmt(b['summary']['mean_e2e_s'])} / {_fmt(b['summary']['p95_ttft_s'])}")
        mark = " (headline)" if p["value"] == sw["headline"] else ""
        lines.append(f"| {p['value']:g}{mark} | " + " | ".join(cells) + " |")
    return lines


def goodput_table(results: dict[str, Any]) -> list[str]:
    g = results["goodput"]
    t = g["targets"]
    lines = [
        f"Targets: P95 TTFT <= {t['ttft_p95_s']} s, mean TPOT <= {t['tpot_mean_s'] * 1000:g} ms,"
        f" at most {t['max_unfinished_frac']:.0%} unfinished; searched {t['field']} in"
        f" [{t['rate_lo']:g}, {t['rate_hi']:g}]"
        + (
            f", stepping up x{STEP_UP_FACTOR:g} to at most {t['rate_max']:g}"
            " while every load passed,"
            if t.get("rate_max") is not None
            else ""
        )
        + f" with up to {t['iterations']} bisections."
        + (
            f" A load whose waiting queue grew by more than {t['max_waiting_growth_s']:g} s"
            " of its calls over the window fails too."
            if t.get("max_waiting_growth_s") is not None
            else ""
        )
        + (
            " A run certain to fail the targets was stopped there (`stop_failing_runs`):"
            " its figures are up to the stop."
            if t.get("stop_failing_runs")
            else ""
        ),
        "",
        f"| system | goodput ({t['field']}) | vs {results['baseline']} | at the goodput"
        " | first failing | why |",
        "| --- | ---: | ---: | --- | ---: | --- |",
    ]
    for label, s in g["systems"].items():
        fail = next((p for p in s["points"] if not p["passed"] and p["value"] > s["rate"]), None)
        at = next((p for p in s["points"] if p["passed"] and p["value"] == s["rate"]), None)
        first = f"{fail['value']:g}" if fail else "none"
        why = fail["reason"] if fail else "passed every load tried"
        lines.append(
            f"| {label} | {goodput_label(s)} | {_ratio(s.get('ratio_vs_dynamo'))}"
            f" | {at['reason'] if at else '-'} | {first} | {why} |"
        )
    lines += [
        "",
        "`queue`: how much the waiting queue grew over the window, in seconds of the"
        " window's finished calls (`waiting_growth_s`): about 0 where it holds steady; near"
        " the P95 TTFT target, the load passes while its queue still builds.",
    ]
    return lines


def render_report(results: dict[str, Any], plot_files: list[str]) -> str:
    lines = [f"# {results['scenario']}", ""]
    if results.get("description"):
        lines += [results["description"].strip(), ""]
    lines += [f"Setup: {describe_setup(results)}.", ""]
    if results.get("command"):
        lines += ["Reproduce:", "", "```bash", results["command"], "```", ""]
    head = ""
    if results.get("sweep"):
        head = f" (at {results['sweep']['field']} = {results['sweep']['headline']:g})"
    lines += [f"## Results{head}", "", *main_table(results), ""]
    notes = findings(results) + sweep_findings(results)
    if notes:
        lines += ["## Findings", "", *notes, ""]
    if results.get("sweep"):
        lines += ["## Latency against load", "", *sweep_table(results), ""]
    if results.get("goodput"):
        lines += ["## Goodput", "", *goodput_table(results), ""]
    if plot_files:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plot_files] + [""]
    runs = results.get("runs", {})
    failed = [k for k, v in runs.items() if not v["ok"]]
    reused = sum(1 for v in runs.values() if v["reused"])
    stopped = sum(1 for v in runs.values() if v.get("stopped_s") is not None)
    lines += [
        "## Runs",
        "",
        f"{len(runs)} simulator runs ({reused} reused from an earlier invocation),"
        f" {len(failed)} failed"
        + (f", {stopped} stopped once certain to fail the goodput targets" if stopped else "")
        + f"; {results.get('wall_s', 0):.0f} s wall."
        " Per-run files: `runs/<run id>/` (summary.json, config.json, timeseries.json,"
        " records.npz, or error.json).",
    ]
    for k in failed:
        first = (runs[k]["error"] or "").splitlines()[:1]
        lines.append(f"- `{k}`: {first[0] if first else 'failed'}")
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, Any], out: Path, plot_files: list[str]) -> Path:
    path = out / "report.md"
    path.write_text(render_report(results, plot_files))
    return path
