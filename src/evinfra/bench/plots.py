"""PNG plots of a benchmark (matplotlib, Agg): latency CDFs, the PD split over time against
the workload's composition, KV hit rate over time, latency against load, goodput."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from evinfra.bench.goodput import goodput_label, load_axis_label
from evinfra.bench.store import load_latencies, load_timeseries

ROLE_COLORS = {
    "prefill": "#d95f02",
    "decode": "#1b9e77",
    "mixed": "#7570b3",
    "offline": "#bbbbbb",
}
DPI = 110


def _colors(labels: list[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _ok_runs(results: dict[str, Any], label: str) -> list[str]:
    runs = results.get("runs", {})
    block = results["systems"][label]
    return [r for r in block["runs"] if runs.get(r, {}).get("ok")]


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _headline(results: dict[str, Any]) -> str:
    sw = results.get("sweep")
    return f" at {sw['field']} = {sw['headline']:g}" if sw else ""


def plot_latency_cdf(results: dict[str, Any], out: Path) -> Path | None:
    labels = list(results["systems"])
    colors = _colors(labels)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = False
    for label in labels:
        parts = [load_latencies(out, r) for r in _ok_runs(results, label)]
        lats = [p for p in parts if p is not None and len(p.e2e_s)]
        if not lats:
            continue
        drawn = True
        for ax, key in zip(axes, ("e2e_s", "ttft_s"), strict=True):
            values = np.sort(np.concatenate([getattr(p, key) for p in lats]))
            values = np.maximum(values, 1e-4)
            y = np.arange(1, len(values) + 1) / len(values)
            ax.step(values, y, where="post", color=colors[label], label=label, lw=1.6)
    if not drawn:
        plt.close(fig)
        return None
    for ax, title in zip(axes, ("end-to-end latency", "time to first token"), strict=True):
        _log_seconds_axis(ax)
        ax.set_xlabel(f"{title} (s, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.axhline(0.95, color="#999999", lw=0.8, ls=":")
        ax.grid(True, which="both", alpha=0.25)
        ax.set_title(f"{title} CDF{_headline(results)}")
    axes[1].legend(loc="lower right", fontsize=9)
    return _save(fig, out / "latency_cdf.png")


def _log_seconds_axis(ax: Axes, which: str = "x") -> None:
    """Log axis labelled 0.01, 0.02, 0.05, 0.1 ... in plain numbers (1-2-5 steps when the
    data spans few decades, decades otherwise). Call after plotting."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    if which == "x":
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
    else:
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
    decades = np.log10(max(hi, 1e-9) / max(lo, 1e-9))
    subs: tuple[float, ...] = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    if decades < 1.2:  # about one decade: 1-2-5 can leave the lower half unlabelled
        subs = tuple(float(x) for x in range(1, 10))
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _composition(series: list[dict[str, Any]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    t = np.array([s["time_s"] for s in series], dtype=float)
    kinds = sorted({k for s in series for k in s["active_sessions_by_kind"]})
    by_kind = {
        k: np.array([s["active_sessions_by_kind"].get(k, 0) for s in series], dtype=float)
        for k in kinds
    }
    return t, by_kind


def _roles(ax: Axes, series: list[dict[str, Any]], label: str) -> None:
    t = np.array([s["time_s"] for s in series], dtype=float)
    stacks = {
        role: np.array([s[f"num_{role}_nodes"] for s in series], dtype=float)
        for role in ROLE_COLORS
    }
    shown = {r: v for r, v in stacks.items() if v.any()}
    ax.stackplot(
        t,
        *shown.values(),
        labels=list(shown),
        colors=[ROLE_COLORS[r] for r in shown],
        step="post",
        alpha=0.85,
    )
    total = max(float(sum(v[0] for v in stacks.values())), 1.0)
    ax.set_ylim(0, total)
    ax.set_ylabel("nodes")
    ax.set_title(f"{label}: node roles", fontsize=10, loc="left")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)


def plot_pd_split(results: dict[str, Any], out: Path) -> Path | None:
    """Top: active sessions by kind (from the baseline's run, or the first system's); below:
    each system's prefill/decode/mixed node counts on the same time axis."""
    labels = [x for x in results["systems"] if _ok_runs(results, x)]
    if not labels:
        return None
    ref = results["baseline"] if results["baseline"] in labels else labels[0]
    ref_series = load_timeseries(out, _ok_runs(results, ref)[0])
    if not ref_series:
        return None
    n = len(labels) + 1
    fig, axes = plt.subplots(
        n, 1, figsize=(11, 1.5 + 1.55 * n), sharex=True, squeeze=False, layout="constrained"
    )
    ax0 = axes[0][0]
    t, by_kind = _composition(ref_series)
    if by_kind:
        ax0.stackplot(t, *by_kind.values(), labels=list(by_kind), step="post", alpha=0.8)
        ax0.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    ax0.set_ylabel("sessions")
    ax0.set_title(f"workload: active sessions by kind ({ref}'s run)", fontsize=10, loc="left")
    for i, label in enumerate(labels, start=1):
        _roles(axes[i][0], load_timeseries(out, _ok_runs(results, label)[0]), label)
    warm = results["config"].get("warmup_s", 0)
    for row in axes:
        row[0].axvline(warm, color="#555555", lw=0.8, ls="--")
        row[0].grid(True, alpha=0.25)
    axes[-1][0].set_xlabel("simulated time (s); dashed: end of warm-up")
    fig.suptitle(f"PD split against workload composition{_headline(results)}")
    return _save(fig, out / "pd_split.png")


def plot_kv_hit_rate(results: dict[str, Any], out: Path) -> Path | None:
    labels = [x for x in results["systems"] if _ok_runs(results, x)]
    colors = _colors(list(results["systems"]))
    horizon_s = float(results["config"]["duration_s"])
    fig, ax = plt.subplots(figsize=(11, 3.8))
    drawn = False
    for label in labels:
        series = load_timeseries(out, _ok_runs(results, label)[0])
        if not series:
            continue
        drawn = True
        # a sample covers the interval before it; past the horizon no sessions start and
        # an interval without admissions reads 0, so only (0, horizon] is drawn
        series = [s for s in series if 0 < s["time_s"] <= horizon_s]
        t = np.array([s["time_s"] for s in series], dtype=float)
        hit = np.array([s["kv_hit_rate"] for s in series], dtype=float)
        ax.plot(t, hit, color=colors[label], label=label, lw=1.4)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_ylim(0, 1.02)
    ax.axvline(float(results["config"].get("warmup_s", 0)), color="#555555", lw=0.8, ls="--")
    ax.set_xlabel("simulated time (s); dashed: end of warm-up")
    ax.set_ylabel("KV hit rate (cached / prompt tokens)")
    ax.set_title(
        f"KV hit rate per {results['config']['sample_interval_s']:g} s interval{_headline(results)}"
    )
    ax.grid(True, alpha=0.25)
    ax.legend(loc="lower right", fontsize=9, ncol=2)
    return _save(fig, out / "kv_hit_rate.png")


def plot_latency_vs_load(results: dict[str, Any], out: Path) -> Path | None:
    sw = results.get("sweep")
    if not sw:
        return None
    labels = list(sw["points"][0]["systems"])
    colors = _colors(list(results["systems"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in zip(
        axes, ("mean_e2e_s", "p95_ttft_s"), ("mean end-to-end latency", "P95 TTFT"), strict=True
    ):
        for label in labels:
            xs, ys, lo, hi = [], [], [], []
            for p in sw["points"]:
                b = p["systems"].get(label)
                if b is None or b["summary"] is None or b["summary"].get(key) is None:
                    continue
                y = float(b["summary"][key])
                sp = b.get("spread", {}).get(key, {"min": y, "max": y})
                xs.append(p["value"])
                ys.append(y)
                lo.append(y - sp["min"])
                hi.append(sp["max"] - y)
            if xs:
                ax.errorbar(
                    xs,
                    ys,
                    yerr=[lo, hi],
                    color=colors[label],
                    label=label,
                    marker="o",
                    ms=4,
                    capsize=3,
                    lw=1.5,
                )
        _log_seconds_axis(ax, "y")
        ax.set_xlabel(load_axis_label(sw["field"]))
        ax.set_ylabel(f"{title} (s, log scale)")
        ax.set_title(f"{title} against load")
        ax.grid(True, which="both", alpha=0.25)
    axes[0].legend(fontsize=9)
    return _save(fig, out / "latency_vs_load.png")


def goodput_bar_text(result: dict[str, Any]) -> str:
    """A goodput bar's label: the report's cell, then the ratio against the baseline."""
    ratio = result.get("ratio_vs_dynamo")
    text = goodput_label(result)
    return text if ratio is None else f"{text}\n{ratio:.2f}x"


def plot_goodput(results: dict[str, Any], out: Path) -> Path | None:
    g = results.get("goodput")
    if not g:
        return None
    labels = list(g["systems"])
    colors = _colors(list(results["systems"]))
    rates = [float(g["systems"][x]["rate"]) for x in labels]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels) + 2), 3.8))
    bars = ax.bar(labels, rates, color=[colors.get(x, "#777777") for x in labels])
    for bar, label in zip(bars, labels, strict=True):
        ax.annotate(
            goodput_bar_text(g["systems"][label]),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    t = g["targets"]
    ax.set_ylabel(f"goodput: highest {load_axis_label(t['field'])}")
    ax.set_title(
        f"goodput at P95 TTFT <= {t['ttft_p95_s']:g} s,"
        f" mean TPOT <= {t['tpot_mean_s'] * 1000:g} ms (ratio vs {results['baseline']})",
        fontsize=10,
    )
    ax.set_ylim(0, max([*rates, 1e-9]) * 1.3)
    ax.grid(True, axis="y", alpha=0.25)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    return _save(fig, out / "goodput.png")


def make_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Every plot that applies to these results; returns the files written."""
    made = [
        plot_latency_cdf(results, out),
        plot_pd_split(results, out),
        plot_kv_hit_rate(results, out),
        plot_latency_vs_load(results, out),
        plot_goodput(results, out),
    ]
    return [p for p in made if p is not None]
