"""Where a benchmark keeps each run: `OUT/runs/<run_id>/` with the files of `evinfra sim`
(summary.json, config.json, timeseries.json), the per-request latencies (records.npz),
or error.json when the run failed. A run whose summary and config are there, with the same
config, is not run again (`--resume`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic_core import to_json

from evinfra.sim.cli import write_result
from evinfra.sim.config import SimConfig
from evinfra.sim.metrics import NO_QUEUE_TREND, QUEUE_KEYS, queue_trend
from evinfra.sim.runner import SimResult

RUNS_DIR = "runs"


@dataclass(frozen=True, slots=True)
class Latencies:
    """Per-request values of the requests that arrived in the measured window and finished
    (tpot is NaN for single-token outputs)."""

    arrival_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    tpot_s: np.ndarray
    kind: np.ndarray


def run_dir(out: Path, run_id: str) -> Path:
    return out / RUNS_DIR / run_id


def latencies_of(result: SimResult) -> Latencies:
    cfg = result.config
    done = [
        r
        for r in result.metrics.records.values()
        if cfg.warmup_s <= r.arrival_s < cfg.duration_s and r.finish_s is not None
    ]
    done.sort(key=lambda r: r.arrival_s)
    nan = float("nan")
    return Latencies(
        arrival_s=np.array([r.arrival_s for r in done], dtype=float),
        ttft_s=np.array([r.ttft_s for r in done], dtype=float),
        e2e_s=np.array([r.e2e_s for r in done], dtype=float),
        tpot_s=np.array([nan if (t := r.tpot_s) is None else t for r in done], dtype=float),
        kind=np.array([r.kind for r in done], dtype=str),
    )


def save_run(out: Path, run_id: str, result: SimResult) -> None:
    d = run_dir(out, run_id)
    write_result(result, d)
    lat = latencies_of(result)
    np.savez_compressed(
        d / "records.npz",
        arrival_s=lat.arrival_s,
        ttft_s=lat.ttft_s,
        e2e_s=lat.e2e_s,
        tpot_s=lat.tpot_s,
        kind=lat.kind,
    )
    (d / "error.json").unlink(missing_ok=True)


def save_error(out: Path, run_id: str, config: SimConfig, error: str) -> None:
    d = run_dir(out, run_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").unlink(missing_ok=True)
    (d / "config.json").write_text(config.model_dump_json(indent=2))
    (d / "error.json").write_text(json.dumps({"error": error}, indent=2))


def read_summary(d: Path) -> dict[str, Any]:
    """A run directory's summary.json; for a run stored before the summary had the waiting
    queue's trend (`QUEUE_KEYS`), those from its timeseries.json (NaN for a run stopped
    early, as the simulator gives). Raises OSError or ValueError as reading the summary
    does."""
    summary: dict[str, Any] = json.loads((d / "summary.json").read_text())
    if all(k in summary for k in QUEUE_KEYS):
        return summary
    if summary.get("stopped_s") is not None:
        return {**summary, **NO_QUEUE_TREND}
    try:
        samples = json.loads((d / "timeseries.json").read_text())
        warmup_s = float(summary["warmup_s"])
        queue = queue_trend(
            [float(x["time_s"]) for x in samples],
            [int(x["num_waiting_requests"]) for x in samples],
            warmup_s=warmup_s,
            end_s=warmup_s + float(summary["window_s"]),
            num_requests=int(summary.get("num_requests", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return summary
    return {**summary, **queue}


def load_summary(out: Path, run_id: str, config: SimConfig) -> dict[str, Any] | None:
    """The stored summary of a finished run with this exact config, else None."""
    d = run_dir(out, run_id)
    try:
        summary = read_summary(d)
        stored = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not same_config(stored, json.loads(config.model_dump_json())):
        return None
    if not (d / "timeseries.json").is_file() or not (d / "records.npz").is_file():
        return None
    return dict(summary)


def same_config(stored: dict[str, Any], current: dict[str, Any]) -> bool:
    """Equal configs, where a field added to SimConfig since the run was stored counts as
    equal when the current value is that field's default (the behaviour before it existed)."""
    fields = SimConfig.model_fields
    for key in current.keys() - stored.keys():
        field = fields.get(key)
        if field is None or field.is_required():
            return False
        default = json.loads(to_json(field.get_default(call_default_factory=True)))
        if current[key] != default:
            return False
    return stored.keys() <= current.keys() and all(stored[k] == current[k] for k in stored)


def load_timeseries(out: Path, run_id: str) -> list[dict[str, Any]]:
    try:
        data = json.loads((run_dir(out, run_id) / "timeseries.json").read_text())
    except (OSError, ValueError):
        return []
    return list(data)


def load_latencies(out: Path, run_id: str) -> Latencies | None:
    try:
        with np.load(run_dir(out, run_id) / "records.npz") as z:
            return Latencies(
                arrival_s=z["arrival_s"],
                ttft_s=z["ttft_s"],
                e2e_s=z["e2e_s"],
                tpot_s=z["tpot_s"],
                kind=z["kind"],
            )
    except (OSError, KeyError, ValueError):
        return None
