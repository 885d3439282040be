"""Request records and the summary every runtime reports with the same names.

Hooks only record; nothing here feeds a decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class RequestRecord:
    request_id: int
    session_id: str
    kind: str
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    prefill_node: int = -1
    decode_node: int = -1
    first_token_s: float | None = None
    finish_s: float | None = None
    num_cached_tokens: int = 0
    num_host_cached_tokens: int = 0
    num_recomputed_tokens: int = 0
    num_transfer_bytes: int = 0
    """KV moved between nodes for this request: the hand-off from its prefill node to its
    decode node, a prefix pulled before its prefill, and a migration."""
    num_pulled_bytes: int = 0
    """Of `num_transfer_bytes`, the prefix pulled from another node before the prefill."""
    num_migrated_bytes: int = 0
    """Of `num_transfer_bytes`, what moved when its running decode migrated."""
    num_preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or self.first_token_s is None or self.num_output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.num_output_tokens - 1)


@dataclass(slots=True)
class TimeSample:
    time_s: float
    num_prefill_nodes: int
    num_decode_nodes: int
    num_mixed_nodes: int
    num_offline_nodes: int
    active_sessions_by_kind: dict[str, int]
    kv_hit_rate: float
    """Cached prompt tokens / prompt tokens over the requests admitted since the last sample."""
    num_waiting_requests: int
    num_running_decodes: int
    kv_usage: float


@dataclass(slots=True)
class Metrics:
    records: dict[int, RequestRecord] = field(default_factory=dict)
    samples: list[TimeSample] = field(default_factory=list)
    session_start_s: dict[str, float] = field(default_factory=dict)
    session_end_s: dict[str, float] = field(default_factory=dict)
    role_switches: int = 0
    switch_cost_s: float = 0.0
    migrated_seqs: int = 0
    num_prefix_pulls: int = 0
    num_rejected: int = 0
    """Calls no node could ever hold (prompt plus output beyond a node's KV)."""
    planner_predictions: list[tuple[float, float, float]] = field(default_factory=list)
    """(time, predicted, observed) uncached prefill tokens/s, when a planner reports them."""


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


QUEUE_KEYS = ("num_waiting_end", "waiting_growth_s")
"""The summary's keys for the waiting queue's trend (NaN where a run stopped early or
records no samples: a serve replay)."""
NO_QUEUE_TREND = dict.fromkeys(QUEUE_KEYS, math.nan)
"""What a run stopped early reports for them: its samples end at the stop."""


def waiting_trend(
    times_s: Sequence[float], num_waiting: Sequence[int], *, warmup_s: float, end_s: float
) -> tuple[float, float]:
    """(calls waiting at the window's last sample, the rise of the least-squares line through
    the window's samples over the window, in calls); NaN for both with fewer than two
    samples. A queue that holds steady rises by about 0 however long it is; one that grows
    all window long rises by about its length at the end."""
    pairs = [(t, q) for t, q in zip(times_s, num_waiting, strict=True) if warmup_s <= t <= end_s]
    if len(pairs) < 2:
        return math.nan, math.nan
    t = np.array([p[0] for p in pairs], dtype=float)
    q = np.array([p[1] for p in pairs], dtype=float)
    if float(np.ptp(t)) == 0.0:
        return float(q[-1]), math.nan
    slope_per_s = float(np.polyfit(t, q, 1)[0])
    return float(q[-1]), slope_per_s * (end_s - warmup_s)


def waiting_growth_s(rise_calls: float, num_requests: int, window_s: float) -> float:
    """A queue's rise over the window in seconds of the window's calls (those that arrived
    in it and finished, per second of it): about how much longer a call arriving at the end
    waits than one arriving at the start, were the queue one line served at that rate (it
    is served slower while it grows, so this understates the wait a little)."""
    if math.isnan(rise_calls) or num_requests <= 0 or window_s <= 0:
        return math.nan
    return rise_calls / (num_requests / window_s)


def queue_trend(
    times_s: Sequence[float],
    num_waiting: Sequence[int],
    *,
    warmup_s: float,
    end_s: float,
    num_requests: int,
) -> dict[str, float]:
    """The summary's `QUEUE_KEYS` from a run's samples of waiting calls and the calls that
    arrived in the window [warmup_s, end_s] and finished."""
    num_waiting_end, rise_calls = waiting_trend(
        times_s, num_waiting, warmup_s=warmup_s, end_s=end_s
    )
    return {
        "num_waiting_end": num_waiting_end,
        "waiting_growth_s": waiting_growth_s(rise_calls, num_requests, end_s - warmup_s),
    }


KV_BYTES_KEYS = ("kv_bytes_moved", "kv_bytes_handed_off", "kv_bytes_pulled", "kv_bytes_migrated")
"""The summary's KV transfer keys: the whole, then its three parts."""


def summarize(
    metrics: Metrics, *, warmup_s: float, end_s: float, num_gpus: int
) -> dict[str, float | int]:
    """The fixed metric names of ARCHITECTURE.md over requests that arrived in
    [warmup_s, end_s) and finished; unfinished ones are counted, not averaged."""
    window = [r for r in metrics.records.values() if warmup_s <= r.arrival_s < end_s]
    done = [r for r in window if r.finish_s is not None]
    ttft = np.array([r.ttft_s for r in done], dtype=float)
    e2e = np.array([r.e2e_s for r in done], dtype=float)
    tpot = np.array([t for r in done if (t := r.tpot_s) is not None], dtype=float)
    prompt = sum(r.num_prompt_tokens for r in done)
    cached = sum(r.num_cached_tokens for r in done)
    host = sum(r.num_host_cached_tokens for r in done)
    span_s = max(end_s - warmup_s, 1e-9)
    moved = sum(r.num_transfer_bytes for r in done)
    pulled = sum(r.num_pulled_bytes for r in done)
    migrated = sum(r.num_migrated_bytes for r in done)
    out_tokens = sum(r.num_output_tokens for r in done if r.finish_s is not None)
    sessions_done = [
        metrics.session_end_s[s] - metrics.session_start_s[s]
        for s in metrics.session_end_s
        if s in metrics.session_start_s and metrics.session_start_s[s] >= warmup_s
    ]
    queue = queue_trend(
        [x.time_s for x in metrics.samples],
        [x.num_waiting_requests for x in metrics.samples],
        warmup_s=warmup_s,
        end_s=end_s,
        num_requests=len(done),
    )
    return {
        "num_requests": len(done),
        "num_unfinished": len(window) - len(done),
        "num_sessions": len({r.session_id for r in window}),
        "num_sessions_finished": len(sessions_done),
        "mean_e2e_s": _mean(e2e),
        "p50_e2e_s": _pct(e2e, 50),
        "p95_e2e_s": _pct(e2e, 95),
        "p99_e2e_s": _pct(e2e, 99),
        "mean_ttft_s": _mean(ttft),
        "p50_ttft_s": _pct(ttft, 50),
        "p95_ttft_s": _pct(ttft, 95),
        "p99_ttft_s": _pct(ttft, 99),
        "mean_tpot_s": _mean(tpot),
        "p95_tpot_s": _pct(tpot, 95),
        "mean_session_s": float(np.mean(sessions_done)) if sessions_done else math.nan,
        "throughput_tok_s": out_tokens / span_s,
        "throughput_tok_s_per_gpu": out_tokens / span_s / max(num_gpus, 1),
        "kv_hit_rate": cached / prompt if prompt else 0.0,
        "kv_device_hit_rate": (cached - host) / prompt if prompt else 0.0,
        "kv_host_hit_rate": host / prompt if prompt else 0.0,
        "recomputed_tokens": sum(r.num_recomputed_tokens for r in done),
        "kv_bytes_moved": moved,
        "kv_bytes_handed_off": moved - pulled - migrated,
        "kv_bytes_pulled": pulled,
        "kv_bytes_migrated": migrated,
        "num_preemptions": sum(r.num_preemptions for r in done),
        "role_switches": metrics.role_switches,
        "migrated_seqs": metrics.migrated_seqs,
        "prefix_pulls": metrics.num_prefix_pulls,
        "num_rejected": metrics.num_rejected,
        **queue,
        "warmup_s": warmup_s,
        "window_s": span_s,
    }
