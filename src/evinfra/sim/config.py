"""The simulation config: YAML file and CLI flags, validated at the edge (pydantic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A bad config value; the message names the field."""


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str = "evolving"
    system_options: dict[str, Any] = Field(default_factory=dict)
    workload: str | None = "coding"
    trace: str | None = None
    rate_scale: float = Field(1.0, gt=0)
    session_rate: float | None = Field(None, gt=0, description="new sessions per second")
    concurrency: int | None = Field(None, gt=0, description="sessions kept running")
    num_sessions: int | None = Field(None, gt=0)
    hints: bool = True
    workload_params: dict[str, Any] = Field(default_factory=dict)
    model: str = "kimi-k2"
    gpu: str = "gb300"
    num_gpus: int = Field(64, gt=0)
    gpus_per_node: int = Field(8, gt=0)
    kv_dtype: str = "fp8"
    block_size: int = Field(64, gt=0)
    cost_model: str = "roofline"
    cost_options: dict[str, Any] = Field(default_factory=dict)
    kv_capacity_scale: float = Field(
        1.0, gt=0, description="multiplies each node's device KV (below 1: KV pressure)"
    )
    max_num_batched_tokens: int = Field(8192, gt=0)
    max_num_seqs: int = Field(256, gt=0)
    kv_allocation: Literal["prompt", "chunk", "chunk-when-prompt-fits"] = Field(
        "prompt",
        description="when a prefill gets its KV blocks: the whole prompt at admission, or"
        " chunk by chunk (vLLM; -when-prompt-fits: admitted once the whole prompt would fit,"
        " as Dynamo's mocker); see evinfra.core.allocation",
    )
    duration_s: float = Field(600.0, gt=0)
    warmup_s: float = Field(60.0, ge=0)
    drain_s: float = Field(600.0, ge=0)
    seed: int = 0
    sample_interval_s: float = Field(10.0, gt=0)
    kv_tick_s: float = Field(1.0, gt=0)
    check_integrity: bool = False
    api_overhead_s: float = Field(
        0.0, ge=0, description="fixed per-request time in the API/frontend (TTFT and e2e)"
    )
    handoff_overhead_s: float = Field(
        0.0, ge=0, description="fixed time per disaggregated hand-off, after its KV transfer"
    )
    first_token_on_decode_step: bool = Field(
        False, description="after a hand-off, the first token comes from the first decode step"
    )
    stop_past_ttft_p95_s: float | None = Field(
        None,
        gt=0,
        description="stop the run once its P95 TTFT is certain to pass this, or more than"
        " stop_max_unfinished_frac of its calls to be left unfinished (a goodput search's"
        " failing loads; the summary then says stopped_s and why)",
    )
    stop_max_unfinished_frac: float = Field(0.01, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.num_gpus % self.gpus_per_node:
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be a multiple of gpus_per_node"
                f" ({self.gpus_per_node})"
            )
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s}) must be < duration_s")
        if self.trace is None and self.workload is None:
            raise ValueError("set workload or trace")
        if self.session_rate is not None and self.concurrency is not None:
            raise ValueError("set session_rate or concurrency, not both")
        if self.stop_past_ttft_p95_s is not None and self.concurrency is not None:
            raise ValueError(
                "stop_past_ttft_p95_s needs sessions that arrive by rate or trace, not a"
                " concurrency (the calls a run could send must be countable)"
            )
        return self

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node


def _format_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = ".".join(str(x) for x in e["loc"]) or "config"
        parts.append(f"{field}: {e['msg']}")
    return "; ".join(parts)


def read_yaml(path: Path, what: str, error: type[Exception]) -> Any:
    """The parsed YAML file at `path`; `error` naming the file as `what` ("config",
    "scenario") when it is missing or not YAML."""
    if not path.is_file():
        raise error(f"{what} file {path} does not exist")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{what} file {path} is not valid YAML: {exc}") from None


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> SimConfig:
    """Read a YAML file (optional) and apply flag overrides (None values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        loaded = read_yaml(p, "config", ConfigError)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return SimConfig(**data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None
