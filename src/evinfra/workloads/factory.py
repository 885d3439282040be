"""Building workloads by name: the generators' factory and the trace loaders' dispatch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from evinfra.workloads.arrivals import (
    ArrivalKind,
    ArrivalProcess,
    GeneratedWorkload,
    Picker,
    SessionGenerator,
)
from evinfra.workloads.coding import PROFILES, CodingGenerator, CodingParams
from evinfra.workloads.computer_use import ComputerUseGenerator, ComputerUseParams
from evinfra.workloads.math_agent import MathGenerator, MathParams
from evinfra.workloads.mixed import MixedParams, MixedPicker, parse_phases
from evinfra.workloads.session_jsonl import load_session_jsonl
from evinfra.workloads.traces import TraceWorkload, load_azure, load_mooncake

KINDS = ("coding", "math", "computer-use", "mixed")
TRACE_FORMATS = ("mooncake", "azure", "session")
DEFAULT_SESSION_RATE_PER_S = 1.0
_ARRIVAL_KEYS = ("arrival", "burstiness")

P = TypeVar("P")


def make_params(cls: type[P], values: Mapping[str, Any], kind: str) -> P:
    """`cls` (a params dataclass) with `values` applied; strings (from the command line) are
    converted to the field's type. Unknown names raise ValueError naming them."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    converted: dict[str, Any] = {}
    for name, value in values.items():
        field = fields.get(name)
        if field is None:
            known = ", ".join(sorted(fields))
            raise ValueError(f"unknown parameter {name!r} for {kind}; known: {known}")
        converted[name] = _convert(value, field.default, name, kind)
    return cls(**converted)


def _convert(value: Any, default: Any, name: str, kind: str) -> Any:
    if not isinstance(value, str) or isinstance(default, str):
        if isinstance(default, bool) or not isinstance(default, int | float):
            return value
        if isinstance(default, int) and isinstance(value, float) and value.is_integer():
            return int(value)
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ValueError(f"parameter {name!r} for {kind}: cannot read {value!r}") from None
    if name == "phases":
        return parse_phases(value)
    return value


def _split(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


def _coding(params: Mapping[str, Any], seed: int) -> CodingGenerator:
    values = dict(params)
    profile = str(values.pop("profile", "default"))
    if profile not in PROFILES:
        raise ValueError(f"unknown coding profile {profile!r}; known: {', '.join(PROFILES)}")
    values = {**PROFILES[profile], **values}
    return CodingGenerator(make_params(CodingParams, values, "coding"), seed)


def _math(params: Mapping[str, Any], seed: int) -> MathGenerator:
    return MathGenerator(make_params(MathParams, params, "math"), seed)


def _computer_use(params: Mapping[str, Any], seed: int) -> ComputerUseGenerator:
    return ComputerUseGenerator(make_params(ComputerUseParams, params, "computer-use"), seed)


def _arrival_process(params: Mapping[str, Any], rate_per_s: float) -> ArrivalProcess:
    name = str(params.get("arrival", "poisson"))
    try:
        kind = ArrivalKind(name)
    except ValueError:
        raise ValueError(f"unknown arrival process {name!r}; known: poisson, bursty") from None
    burstiness = float(params.get("burstiness", 4.0))
    return ArrivalProcess(rate_per_s, kind, burstiness)


def make_workload(
    kind: str,
    *,
    seed: int,
    session_rate_per_s: float | None = None,
    concurrency: int | None = None,
    num_sessions: int | None = None,
    duration_s: float | None = None,
    hints: bool = True,
    params: Mapping[str, Any] | None = None,
) -> GeneratedWorkload:
    """A generated workload of `kind` (coding, math, computer-use, mixed).

    Sessions arrive at `session_rate_per_s` (default 1/s when no concurrency is given) or
    `concurrency` sessions are kept running; generation stops after `num_sessions` or at
    `duration_s` (neither: endless). `params` holds the generator's parameters by field
    name, plus `arrival` (poisson, bursty) and `burstiness`; for `coding` also `profile`
    (default, swe, tracelab); for `mixed` the sub-generators' parameters as
    `coding.NAME`, `math.NAME`, `computer-use.NAME`.
    """
    params = dict(params or {})
    if session_rate_per_s is not None and concurrency is not None:
        raise ValueError("give a session rate or a concurrency, not both")
    if session_rate_per_s is None and concurrency is None:
        session_rate_per_s = DEFAULT_SESSION_RATE_PER_S
    process = None
    if session_rate_per_s is not None:
        process = _arrival_process(params, session_rate_per_s)
    own = {k: v for k, v in params.items() if k not in _ARRIVAL_KEYS}
    pick: Picker
    if kind == "coding":
        pick = _constant(_coding(own, seed))
    elif kind == "math":
        pick = _constant(_math(own, seed))
    elif kind == "computer-use":
        pick = _constant(_computer_use(own, seed))
    elif kind == "mixed":
        subs: list[SessionGenerator] = [
            _coding(_split(own, "coding."), seed),
            _math(_split(own, "math."), seed),
            _computer_use(_split(own, "computer-use."), seed),
        ]
        mixed = {k: v for k, v in own.items() if "." not in k}
        pick = MixedPicker(
            make_params(MixedParams, mixed, "mixed"), subs, seed, by_time=process is not None
        )
    else:
        raise ValueError(f"unknown workload kind {kind!r}; known: {', '.join(KINDS)}")
    return GeneratedWorkload(
        kind,
        pick,
        seed,
        process=process,
        concurrency=concurrency,
        num_sessions=num_sessions,
        duration_s=duration_s,
        hints=hints,
    )


def _constant(generator: Any) -> Picker:
    return lambda index, start_s: generator


def detect_format(path: Path) -> str:
    """azure for .csv; for JSON lines, session when the first row has a session_id."""
    if path.suffix.lower() == ".csv":
        return "azure"
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return "session" if '"session_id"' in line else "mooncake"
    return "mooncake"


def load_trace(
    path: str | Path,
    *,
    rate_scale: float = 1.0,
    fmt: str | None = None,
    closed_loop: bool = True,
) -> TraceWorkload:
    """A trace file as a workload. `fmt`: mooncake, azure or session (None: detected).
    `rate_scale` X divides session arrival times (X > 1: more load). Session files replay
    closed-loop unless `closed_loop` is False; Mooncake and Azure rows are open-loop."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file not found: {path}")
    fmt = fmt or detect_format(path)
    if fmt == "mooncake":
        return load_mooncake(path, rate_scale=rate_scale)
    if fmt == "azure":
        return load_azure(path, rate_scale=rate_scale)
    if fmt == "session":
        return load_session_jsonl(path, rate_scale=rate_scale, closed_loop=closed_loop)
    raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}")
