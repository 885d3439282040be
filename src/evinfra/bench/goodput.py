"""Goodput: the highest load (session rate) at which a system still meets its latency targets,
found from a sweep's points and the scenario's range, refined by bisection.

Unlike a latency ratio at one chosen load, it does not depend on the load one picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from evinfra.bench.scenario import GoodputSpec

STEP_UP_FACTOR = 1.5
"""Past rate_hi, with rate_max set, each load tried is this times the highest pass."""


class Bound(Enum):
    EXACT = "exact"
    """Passes at `rate`, fails just above it (within the bisection's resolution)."""
    AT_LEAST = "at_least"
    """Passed at every load tried (rate_hi, or rate_max when set): the goodput is `rate` or
    more."""
    BELOW = "below"
    """Failed at every load tried, the lowest included: the goodput is below it (rate 0)."""


@dataclass(frozen=True, slots=True)
class PointVerdict:
    value: float
    passed: bool
    reason: str
    """Why it failed, or the measured values when it passed."""


@dataclass(frozen=True, slots=True)
class GoodputResult:
    rate: float
    bound: Bound
    upper: float | None
    """The lowest failing load above `rate` (None when every load passed)."""
    points: tuple[PointVerdict, ...]


def stop_rule(spec: GoodputSpec) -> dict[str, float]:
    """The config fields that stop a search's run once it is certain to fail the targets
    (`stop_failing_runs`)."""
    return {
        "stop_past_ttft_p95_s": spec.ttft_p95_s,
        "stop_max_unfinished_frac": spec.max_unfinished_frac,
    }


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _number(value: Any) -> float:
    """A summary's figure, NaN where it is missing or null."""
    return math.nan if value is None else float(value)


def judge(
    value: float, summaries: Sequence[dict[str, Any] | None], spec: GoodputSpec
) -> PointVerdict:
    """Does the mean over seeds meet the targets? A failed run fails the point."""
    if not summaries or any(s is None for s in summaries):
        return PointVerdict(value, False, "a run failed")
    ok = [s for s in summaries if s is not None]
    stopped = next((s for s in ok if s.get("stopped_s") is not None), None)
    if stopped is not None:
        return PointVerdict(value, False, str(stopped.get("stopped_reason") or "stopped"))
    ttft = _mean([float(s["p95_ttft_s"]) for s in ok])
    tpot = _mean([float(s["mean_tpot_s"]) for s in ok])
    done = sum(int(s["num_requests"]) for s in ok)
    left = sum(int(s["num_unfinished"]) for s in ok)
    unfinished = left / (done + left) if done + left else 1.0
    growth = _mean([_number(s.get("waiting_growth_s")) for s in ok])
    measured = f"p95 TTFT {ttft:.3f}s, mean TPOT {tpot * 1000:.1f}ms, unfinished {unfinished:.1%}"
    if not math.isnan(growth):
        measured += f", queue {growth:+.2f}s"
    if done == 0 or math.isnan(ttft) or math.isnan(tpot):
        return PointVerdict(value, False, "no finished requests")
    if ttft > spec.ttft_p95_s:
        return PointVerdict(value, False, f"p95 TTFT {ttft:.3f}s > {spec.ttft_p95_s}s")
    if tpot > spec.tpot_mean_s:
        return PointVerdict(
            value, False, f"mean TPOT {tpot * 1000:.1f}ms > {spec.tpot_mean_s * 1000:.1f}ms"
        )
    if unfinished > spec.max_unfinished_frac:
        return PointVerdict(value, False, f"unfinished {unfinished:.1%}")
    if spec.max_waiting_growth_s is not None:
        if math.isnan(growth):
            return PointVerdict(value, False, "no queue samples to judge the queue's growth")
        if growth > spec.max_waiting_growth_s:
            return PointVerdict(
                value, False, f"queue grew {growth:.2f}s > {spec.max_waiting_growth_s}s"
            )
    return PointVerdict(value, True, measured)


class Bisection:
    """The search for one system: feed it verdicts, ask it which loads to try next."""

    def __init__(self, spec: GoodputSpec) -> None:
        self.spec = spec
        self.verdicts: dict[float, PointVerdict] = {}
        self.num_bisections = 0
        self._max_bisections = spec.iterations
        self._midpoints: set[float] = set()
        """Loads proposed as bisection midpoints and not yet judged."""

    def limit_bisections(self, max_bisections: int) -> None:
        self._max_bisections = min(self._max_bisections, max_bisections)

    def record(self, verdict: PointVerdict) -> None:
        """Judged loads: a midpoint this search proposed counts as one bisection."""
        self.verdicts[verdict.value] = verdict
        if verdict.value in self._midpoints:
            self._midpoints.discard(verdict.value)
            self.num_bisections += 1

    def _bracket(self) -> tuple[float | None, float | None]:
        """(highest pass below the lowest fail, lowest fail)."""
        fails = [v for v, x in self.verdicts.items() if not x.passed]
        hi = min(fails) if fails else None
        passes = [v for v, x in self.verdicts.items() if x.passed and (hi is None or v < hi)]
        return (max(passes) if passes else None), hi

    def next_values(self) -> list[float]:
        """Loads to evaluate next (empty: done). First the range's ends; while every load
        passes, STEP_UP_FACTOR x the highest pass up to rate_max; then midpoints."""
        ends = [v for v in (self.spec.rate_lo, self.spec.rate_hi) if v not in self.verdicts]
        if ends:
            return ends
        lo, hi = self._bracket()
        cap = self.spec.rate_max
        if hi is None and lo is not None and cap is not None and lo < cap:
            return [min(cap, _round_rate(lo * STEP_UP_FACTOR))]
        if lo is None or hi is None or self.num_bisections >= self._max_bisections:
            return []
        mid = _round_rate((lo + hi) / 2)
        self._midpoints.add(mid)
        return [mid]

    def result(self) -> GoodputResult:
        lo, hi = self._bracket()
        points = tuple(self.verdicts[v] for v in sorted(self.verdicts))
        if lo is None:
            return GoodputResult(0.0, Bound.BELOW, hi, points)
        if hi is None:
            return GoodputResult(lo, Bound.AT_LEAST, None, points)
        return GoodputResult(lo, Bound.EXACT, hi, points)


def _round_rate(value: float) -> float:
    # 4 significant digits keep run ids short and stable across resumes
    return float(f"{value:.4g}")


def goodput_ratio(system: GoodputResult, baseline: GoodputResult) -> float | None:
    """system / baseline goodput; None when the baseline's goodput is 0."""
    if baseline.rate <= 0:
        return None
    return system.rate / baseline.rate


LOAD_UNITS = {"session_rate": "/s", "concurrency": "sessions", "rate_scale": "x"}
"""The unit of each load field a sweep or goodput search may vary ("x": a multiple of a
trace's own arrival rate)."""


def unit_suffix(field: str) -> str:
    """ " (/s)" for `session_rate`; "" for a field with no known unit."""
    unit = LOAD_UNITS.get(field)
    return f" ({unit})" if unit else ""


def load_axis_label(field: str) -> str:
    """`session_rate` -> "session rate (/s)"; a field with no known unit is named alone."""
    return field.replace("_", " ") + unit_suffix(field)


def goodput_label(result: dict[str, Any]) -> str:
    """A system's goodput as written in report.md and on goodput.png, from its
    `result_to_json` form: the load tried (`:g`), ">= x" when the search stopped at
    rate_max still passing, "< x" when it failed at its lowest load x."""
    if not result:
        return "n/a"
    bound = result.get("bound")
    if bound == Bound.BELOW.value:
        return f"< {result['points'][0]['value']:g}" if result.get("points") else "0"
    prefix = ">= " if bound == Bound.AT_LEAST.value else ""
    return f"{prefix}{result['rate']:g}"


def result_to_json(result: GoodputResult) -> dict[str, Any]:
    return {
        "rate": result.rate,
        "bound": result.bound.value,
        "upper": result.upper,
        "points": [
            {"value": p.value, "passed": p.passed, "reason": p.reason} for p in result.points
        ],
    }
