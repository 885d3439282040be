"""results.json: per system the `evinfra sim` summary keys (mean over seeds) with their
spread, ratios against the baseline (`ratio_vs_dynamo`: baseline / system, so above 1 means
lower latency than the baseline) and against the floor (system / oracle, 1 is the limit)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from evinfra.bench.execute import RunOutcome
from evinfra.bench.scenario import RunSpec, Scenario

RATIO_KEYS = ("mean_e2e_s", "p95_ttft_s")
SPREAD_KEYS = (
    "mean_e2e_s",
    "p95_ttft_s",
    "p99_ttft_s",
    "mean_tpot_s",
    "throughput_tok_s_per_gpu",
    "kv_hit_rate",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def mean_summary(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Key by key: the mean of numbers (NaN where any seed has NaN), else the first value."""
    out: dict[str, Any] = {}
    for key, first in summaries[0].items():
        values = [s.get(key) for s in summaries]
        if all(_is_number(v) for v in values):
            nums = [float(v) for v in values]  # type: ignore[arg-type]
            if len(nums) == 1:
                out[key] = values[0]
            elif any(math.isnan(v) for v in nums):
                out[key] = math.nan
            else:
                out[key] = math.fsum(nums) / len(nums)
        else:
            out[key] = first
    return out


def spread(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """min, max and standard deviation across seeds of the main metrics."""
    out: dict[str, dict[str, float]] = {}
    for key in SPREAD_KEYS:
        nums = [float(s[key]) for s in summaries if _is_number(s.get(key))]
        if not nums:
            continue
        mean = math.fsum(nums) / len(nums)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in nums) / len(nums))
        out[key] = {"min": min(nums), "max": max(nums), "std": std}
    return out


def system_block(
    label: str, specs: Sequence[RunSpec], outcomes: Mapping[str, RunOutcome]
) -> dict[str, Any]:
    """One system at one point: mean summary over its successful seeds, spread, errors."""
    ok = [(s, outcomes[s.run_id]) for s in specs if outcomes[s.run_id].ok]
    failed = [(s, outcomes[s.run_id]) for s in specs if not outcomes[s.run_id].ok]
    summaries = [o.summary for _, o in ok if o.summary is not None]
    return {
        "label": label,
        "system": specs[0].config.system,
        "summary": mean_summary(summaries) if summaries else None,
        "spread": spread(summaries) if summaries else {},
        "seeds": [s.seed for s, _ in ok],
        "errors": {str(s.seed): o.error for s, o in failed},
        "runs": [s.run_id for s in specs],
    }


def _value(block: Mapping[str, Any] | None, key: str) -> float | None:
    if block is None or block.get("summary") is None:
        return None
    v = block["summary"].get(key)
    if not _is_number(v) or math.isnan(float(v)):
        return None
    return float(v)


def is_floor_label(label: str, floor: str) -> bool:
    """Whether `label` gives the floor: the floor label itself or one of its variants
    (`floor-...`, e.g. `oracle-split` beside `oracle`)."""
    return label == floor or label.startswith(floor + "-")


def add_ratios(blocks: dict[str, dict[str, Any]], baseline: str, floor: str) -> None:
    """Adds `ratio_vs_dynamo` (baseline / system) and `vs_floor` (system / floor) to each
    block, for mean end-to-end latency and P95 TTFT; None where a value is missing. The
    floor of a metric is the lowest value of the `floor` label and its variants (labels
    `floor-...`, e.g. `oracle` and `oracle-split`): neither all-mixed nor split nodes are
    best on every workload."""
    base = blocks.get(baseline)
    lows = [b for label, b in blocks.items() if is_floor_label(label, floor)]
    for block in blocks.values():
        ratios: dict[str, float | None] = {}
        floors: dict[str, float | None] = {}
        for key in RATIO_KEYS:
            mine = _value(block, key)
            b = _value(base, key)
            f = min((v for v in (_value(low, key) for low in lows) if v), default=None)
            ratios[key] = b / mine if b is not None and mine else None
            floors[key] = mine / f if mine is not None and f else None
        block["ratio_vs_dynamo"] = ratios
        block["vs_floor"] = floors


def point_blocks(
    scenario: Scenario,
    specs: Sequence[RunSpec],
    outcomes: Mapping[str, RunOutcome],
) -> dict[str, dict[str, Any]]:
    """Blocks by label for the runs of one point, with ratios."""
    blocks = {}
    for label in scenario.labels:
        mine = [s for s in specs if s.label == label]
        if mine:
            blocks[label] = system_block(label, mine, outcomes)
    add_ratios(blocks, scenario.baseline, scenario.floor)
    return blocks


def sanitize(value: Any) -> Any:
    """JSON without NaN or infinity (they become null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [sanitize(v) for v in value]
    return value


def runs_table(specs: Sequence[RunSpec], outcomes: Mapping[str, RunOutcome]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for s in specs:
        o = outcomes[s.run_id]
        table[s.run_id] = {
            "label": s.label,
            "seed": s.seed,
            "point": list(s.point) if s.point else None,
            "ok": o.ok,
            "error": o.error,
            "wall_s": o.wall_s,
            "reused": o.reused,
            "stopped_s": o.summary.get("stopped_s") if o.summary else None,
        }
    return table
