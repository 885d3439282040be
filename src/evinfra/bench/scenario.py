"""Benchmark scenarios: a YAML file naming the systems, the cluster, the workload, the load
(one point or a sweep), the seeds and the goodput targets; expanded into simulator runs.

Validated at the edge with pydantic (unknown keys rejected); errors name the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evinfra.policy.bundle import available_systems
from evinfra.sim.config import SimConfig, read_yaml

QUICK_TIME_SCALE = 0.2
"""`--quick` runs this fraction of each run's duration and warm-up."""
QUICK_MIN_DURATION_S = 60.0
QUICK_MAX_DRAIN_S = 120.0
QUICK_MAX_BISECTIONS = 2


class ScenarioError(ValueError):
    """A bad scenario file; the message names the field."""


class SystemEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    label: str | None = None
    system_options: dict[str, Any] = Field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.label or self.name


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = "session_rate"
    values: list[float] = Field(min_length=1)
    headline: float | None = None
    """The point whose results fill the per-system table (default: the middle value)."""

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if self.field not in _NUMERIC_FIELDS:
            raise ValueError(f"field {self.field!r} is not a numeric SimConfig field")
        if sorted(set(self.values)) != self.values:
            raise ValueError("values must be increasing and distinct")
        if self.headline is not None and self.headline not in self.values:
            raise ValueError(f"headline {self.headline} is not one of values")
        return self

    @property
    def headline_value(self) -> float:
        if self.headline is not None:
            return self.headline
        return self.values[(len(self.values) - 1) // 2]


class GoodputSpec(BaseModel):
    """Goodput: the highest `field` value (session rate) at which, in the mean over seeds,
    P95 TTFT <= ttft_p95_s, mean TPOT <= tpot_mean_s, and at most `max_unfinished_frac` of
    the window's requests are left unfinished (and, with `max_waiting_growth_s`, the waiting
    queue grows by at most that much); bracketed from rate_lo/rate_hi (and the
    sweep's points), stepped up by x1.5 to at most `rate_max` while every load passes, and
    refined by `iterations` bisections."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_p95_s: float = Field(gt=0)
    tpot_mean_s: float = Field(gt=0)
    rate_lo: float = Field(gt=0)
    rate_hi: float = Field(gt=0)
    rate_max: float | None = Field(None, gt=0)
    """When a system passes at rate_hi, try x1.5 the highest pass, up to this, until one fails
    (None: stop at rate_hi and report `at_least`)."""
    iterations: int = Field(4, ge=0, le=20)
    field: str = "session_rate"
    max_unfinished_frac: float = Field(0.01, ge=0, le=1)
    max_waiting_growth_s: float | None = Field(None, gt=0)
    """Also fail a load whose waiting queue grows through the window by more than this, in
    seconds of its finished calls (`waiting_growth_s`, mean over seeds): "within the targets"
    then means steady too. None (the default): the queue's trend is reported, not judged."""
    stop_failing_runs: bool = False
    """Stop a run once it is certain to fail the P95 TTFT target (or the unfinished share):
    the verdict is the same, the overloaded loads cost a fraction of their time, and their
    figures are the run's up to the stop. Only with one seed: over seeds the verdict is on
    the mean P95 TTFT, which one seed's failure does not decide."""

    @model_validator(mode="after")
    def _check(self) -> GoodputSpec:
        if self.rate_hi <= self.rate_lo:
            raise ValueError(f"rate_hi ({self.rate_hi}) must be > rate_lo ({self.rate_lo})")
        if self.rate_max is not None and self.rate_max <= self.rate_hi:
            raise ValueError(f"rate_max ({self.rate_max}) must be > rate_hi ({self.rate_hi})")
        if self.field not in _NUMERIC_FIELDS:
            raise ValueError(f"field {self.field!r} is not a numeric SimConfig field")
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    base: dict[str, Any] = Field(default_factory=dict)
    systems: list[str | SystemEntry] = Field(min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    sweep: SweepSpec | None = None
    goodput: GoodputSpec | None = None
    baseline: str = "dynamo"
    """The label ratios are taken against."""
    floor: str = "oracle"
    """The label that gives the limit (`vs floor` column), when present."""

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        labels = [s.display for s in self.entries]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"systems: duplicate label(s) {', '.join(dup)}")
        known = set(available_systems())
        for i, s in enumerate(self.entries):
            if s.name not in known:
                raise ValueError(
                    f"systems.{i}: unknown system {s.name!r}; known: {', '.join(sorted(known))}"
                )
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: duplicate seed")
        for key in ("system", "system_options", "seed"):
            if key in self.base:
                raise ValueError(f"base.{key}: set per system / in seeds, not in base")
        g = self.goodput
        closed = g is not None and (g.field == "concurrency" or self.base.get("concurrency"))
        if g is not None and g.stop_failing_runs and closed:
            raise ValueError(
                "goodput.stop_failing_runs: needs sessions arriving by rate or trace,"
                " not a concurrency (the calls a run can send must be countable)"
            )
        return self

    @property
    def entries(self) -> list[SystemEntry]:
        return [SystemEntry(name=s) if isinstance(s, str) else s for s in self.systems]

    @property
    def labels(self) -> list[str]:
        return [s.display for s in self.entries]


_NUMERIC_FIELDS = {
    name
    for name, f in SimConfig.model_fields.items()
    if f.annotation in (int, float, float | None, int | None)
}


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One simulator run of a benchmark."""

    run_id: str
    label: str
    seed: int
    point: tuple[str, float] | None
    """(field, value) for sweep and goodput runs; None for the scenario's single point."""
    config: SimConfig

    @property
    def end_s(self) -> float:
        """Where the run's simulated clock stops at the latest: its duration plus its drain."""
        return self.config.duration_s + self.config.drain_s

    @property
    def work(self) -> float:
        """Relative cost, for the ETA: simulated seconds x GPUs."""
        return (self.config.duration_s + 0.25 * self.config.drain_s) * self.config.num_gpus


def _format_errors(err: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        field = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or "scenario")
        msg = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"{field}: {msg}")
    return "; ".join(parts)


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source} must hold a mapping, got {type(data).__name__}")
    try:
        scenario = Scenario(**data)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc)) from None
    # the base must make a valid config with every system and point
    probe = {**scenario.base}
    if scenario.sweep is not None:
        probe[scenario.sweep.field] = scenario.sweep.values[0]
    try:
        SimConfig(system=scenario.entries[0].name, **probe)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc, "base.")) from None
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    return parse_scenario(read_yaml(p, "scenario", ScenarioError), str(p))


def resolve_trace(trace: str, scenario_path: Path | None) -> str:
    """A relative trace path is read from the working directory (the repo root), else
    from the scenario file's directory's parent (benchmarks/ sits in the repo root)."""
    p = Path(trace)
    if p.is_absolute() or p.exists() or scenario_path is None:
        return trace
    alt = scenario_path.resolve().parent.parent / p
    return str(alt) if alt.exists() else trace


def quick_base(base: dict[str, Any]) -> dict[str, Any]:
    """The base with shortened times for `--quick`."""
    defaults = SimConfig.model_fields
    duration = float(base.get("duration_s", defaults["duration_s"].default))
    warmup = float(base.get("warmup_s", defaults["warmup_s"].default))
    drain = float(base.get("drain_s", defaults["drain_s"].default))
    new_duration = max(min(QUICK_MIN_DURATION_S, duration), duration * QUICK_TIME_SCALE)
    out = dict(base)
    out["duration_s"] = new_duration
    out["warmup_s"] = min(warmup * new_duration / duration, 0.5 * new_duration)
    out["drain_s"] = min(drain, QUICK_MAX_DRAIN_S)
    return out


def _fmt_value(value: float) -> str:
    return f"{value:.6g}"


def make_run(
    scenario: Scenario,
    entry: SystemEntry,
    seed: int,
    point: tuple[str, float] | None,
    *,
    quick: bool = False,
    scenario_path: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> RunSpec:
    """`extra`: config fields set over the base and the system's (a goodput search's stop
    rule)."""
    base = quick_base(scenario.base) if quick else dict(scenario.base)
    if base.get("trace"):
        base["trace"] = resolve_trace(str(base["trace"]), scenario_path)
        base["workload"] = None  # a trace replaces the generator (as in `evinfra sim`)
    data: dict[str, Any] = {**base, "system": entry.name, "seed": seed}
    data["system_options"] = dict(entry.system_options)
    data.update(extra or {})
    run_id = f"{entry.display}__seed{seed}"
    if point is not None:
        field, value = point
        if not math.isfinite(value) or value <= 0:
            raise ScenarioError(f"{field}: run point must be positive, got {value}")
        ann = SimConfig.model_fields[field].annotation
        data[field] = round(value) if ann in (int, int | None) else value
        run_id = f"{entry.display}__{field}={_fmt_value(value)}__seed{seed}"
    try:
        cfg = SimConfig(**data)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(exc, f"{entry.display}: ")) from None
    return RunSpec(run_id, entry.display, seed, point, cfg)


def seeds_for(scenario: Scenario, quick: bool) -> list[int]:
    return scenario.seeds[:1] if quick else list(scenario.seeds)


def main_runs(
    scenario: Scenario, *, quick: bool = False, scenario_path: Path | None = None
) -> list[RunSpec]:
    """The runs of the scenario's point (or of every sweep point), every system and seed."""
    points: list[tuple[str, float] | None]
    if scenario.sweep is None:
        points = [None]
    else:
        points = [(scenario.sweep.field, v) for v in scenario.sweep.values]
    return [
        make_run(scenario, entry, seed, point, quick=quick, scenario_path=scenario_path)
        for point in points
        for entry in scenario.entries
        for seed in seeds_for(scenario, quick)
    ]
