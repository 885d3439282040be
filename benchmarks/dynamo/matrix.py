"""What a side-by-side run runs: the workloads, the deployments, and the argv of
`evinfra replay`, `evinfra sim` (its config) and `aiperf profile` for each.

Pure: builds commands and configs, starts nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launch import MOCKER_KV_ALLOCATION, Deployment, EngineShape

MOONCAKE_TRACE = "traces/mooncake_fast25/conversation_trace.jsonl"
REPLAY_VOCAB_SIZE = 512
"""evinfra's timed executor draws below 512; both servers get the same token ids."""


@dataclass(frozen=True, slots=True)
class WorkloadRun:
    """One workload: closed-loop sessions (`kind` a generator) or an open-loop trace."""

    name: str
    kind: str | None = None
    trace: Path | None = None
    concurrency: int | None = None
    params: tuple[tuple[str, str], ...] = ()
    """Generator parameters (`--workload-param KEY=VALUE`; the simulator gets them too)."""
    shape: EngineShape = field(default_factory=EngineShape)
    max_requests: int = 400
    max_context_tokens: int | None = None
    """The context limit `evinfra replay` cuts every call to for every server
    (`--max-context-tokens`) and the simulator cuts its calls to (`sim_cut.py`); None:
    each server's own listed `max_model_len` (evinfra lists its KV, Dynamo none)."""

    def replay_flags(self) -> list[str]:
        if self.trace is not None:
            return ["--trace", str(self.trace)]
        assert self.kind is not None
        params = [f for k, v in self.params for f in ("--workload-param", f"{k}={v}")]
        return ["--workload", self.kind, "--concurrency", str(self.concurrency), *params]


@dataclass(frozen=True, slots=True)
class Limits:
    duration_s: float = 20.0
    drain_s: float = 20.0
    seed: int = 0


def default_workloads(shared_dir: Path, quick: bool = False) -> list[WorkloadRun]:
    """Coding and mixed sessions (closed loop, KV under pressure: 4,096 blocks of 16 per
    node) and the Mooncake conversation trace (open loop at its timestamps; 16,384 blocks,
    since its prompts reach 120k tokens)."""
    agent = EngineShape(num_blocks=4096)
    runs = [
        WorkloadRun("coding", kind="coding", concurrency=12, shape=agent),
        WorkloadRun("mixed", kind="mixed", concurrency=12, shape=agent),
        WorkloadRun(
            "mooncake", trace=shared_dir / MOONCAKE_TRACE, shape=EngineShape(num_blocks=16384)
        ),
    ]
    if quick:
        return [replace(runs[0], concurrency=4, max_requests=40)]
    return runs


def default_deployments(
    num_nodes: int = 2, evinfra_systems: tuple[str, ...] = ("evolving",)
) -> list[Deployment]:
    """evinfra (one deployment per bundle, e.g. `evolving` and its `evolving-lru`
    ablation), then aggregated and disaggregated Dynamo."""
    evinfra = [Deployment("evinfra", num_nodes=num_nodes, system=s) for s in evinfra_systems]
    dynamo = [Deployment(kind, num_nodes=num_nodes) for kind in ("dynamo-agg", "dynamo-disagg")]
    return [*evinfra, *dynamo]


def replay_argv(
    evinfra_bin: str, url: str, model: str, run: WorkloadRun, limits: Limits, label: str,
    out: Path, hints: bool = True,
) -> list[str]:  # fmt: skip
    return [
        evinfra_bin, "replay", "--url", url, "--model", model,
        *run.replay_flags(),
        "--vocab-size", str(REPLAY_VOCAB_SIZE), "--seed", str(limits.seed),
        "--max-requests", str(run.max_requests), "--max-duration-s", str(limits.duration_s),
        "--drain-s", str(limits.drain_s), "--label", label, "--out", str(out),
        *([] if hints else ["--no-hints"]),
        *context_flags(run),
    ]  # fmt: skip


def context_flags(run: WorkloadRun) -> list[str]:
    if run.max_context_tokens is None:
        return []
    return ["--max-context-tokens", str(run.max_context_tokens)]


def with_max_context(run: WorkloadRun, limit: str) -> WorkloadRun:
    """The script's `--max-context-tokens`: `kv` (a node's KV in tokens, so no call exceeds
    a node; what evinfra's server lists), `server` (each server's own listed limit: evinfra
    cuts, Dynamo's frontend lists none and its mocker rejects what does not fit), or a
    number of tokens."""
    if limit == "server":
        return replace(run, max_context_tokens=None)
    if limit == "kv":
        return replace(run, max_context_tokens=run.shape.kv_capacity_tokens)
    return replace(run, max_context_tokens=int(limit))


SIM_SYSTEMS: dict[str, tuple[str, dict[str, Any]]] = {
    # the serve runtime's workers have no host tier and move no prefixes between them
    # (its router plans no pulls): the simulated evolving gets neither
    "evinfra": ("evolving", {"host_tier": False, "pull_prefix": False}),
    # Dynamo's frontend over aggregated mocker workers: KV router, every node mixed, LRU
    "dynamo-agg": ("aggregated", {}),
    # 1 prefill + 1 decode mocker, no planner process runs; conditional disaggregation is
    # off by default in 1.6.1 (`--router-conditional-disagg`, experimental)
    "dynamo-disagg": (
        "dynamo",
        {"num_prefill_nodes": 1, "planner": "none", "conditional_disagg": False},
    ),
}


@dataclass(frozen=True, slots=True)
class FixedCosts:
    """What a server adds around its engines, per request (`probe.py`)."""

    api_overhead_s: float
    handoff_overhead_s: float


FIXED_COSTS: dict[str, FixedCosts] = {
    # medians measured at zero load by `run_side_by_side.sh --probe` (30 requests of 512 to
    # 4,096 tokens each, one every 0.6 s; results/probe/probe.json): measured minus
    # simulated TTFT, aggregated deployments for the API, disaggregated minus aggregated
    # for the hand-off. Three probes against this model spread by about 1.5 ms (evinfra
    # API 5.5-7.1 ms, hand-off 8.3-9.3 ms; Dynamo API 4.3-4.7 ms, hand-off 0.4-1.1 ms on
    # top of the decode pass the simulator models); the last (407868d) is used
    "evinfra": FixedCosts(api_overhead_s=0.0064, handoff_overhead_s=0.0093),
    "dynamo": FixedCosts(api_overhead_s=0.0043, handoff_overhead_s=0.0004),
}
FIRST_TOKEN_ON_DECODE_STEP = {"evinfra": False, "dynamo": True}
"""After a hand-off Dynamo's client sees the decode worker's first pass's token; evinfra's
decode node streams the prefill's token as soon as the KV is in."""


def sim_config(
    dep: Deployment, run: WorkloadRun, limits: Limits, num_device_blocks_per_node: int,
    sim_system: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`evinfra sim` config matching the measured run: the `tiny` catalog model on one H200
    per node, then the KV pool scaled to the mocker's block count (the catalog's pool for
    tiny is far larger), the mocker's polynomial with its speed-up ratio and KV capacity,
    the same batch limits, workload, seed, duration and drain."""
    system, options = SIM_SYSTEMS[dep.kind]
    if dep.kind == "evinfra":
        system = dep.system
        options = {**options, **{k: _option_value(v) for k, v in dep.system_options}}
    if dep.kind == "dynamo-disagg":  # launch.dynamo_commands' split
        options = {**options, "num_prefill_nodes": dep.num_nodes // 2}
    if sim_system is not None:
        system, options = sim_system, {}
    shape = run.shape
    cfg: dict[str, Any] = {
        "system": system,
        "system_options": options,
        "model": "tiny",
        "gpu": "h200",
        "num_gpus": dep.num_nodes,
        "gpus_per_node": 1,
        "block_size": shape.block_size,
        "kv_capacity_scale": (shape.num_blocks + 0.5) / num_device_blocks_per_node,
        "max_num_batched_tokens": shape.max_num_batched_tokens,
        "max_num_seqs": shape.max_num_seqs,
        # each server's own: evinfra's setting, the mocker's scheduler for Dynamo
        "kv_allocation": shape.kv_allocation if dep.kind == "evinfra" else MOCKER_KV_ALLOCATION,
        "cost_model": "dynamo-polynomial",
        "cost_options": {
            "speedup_ratio": shape.speedup_ratio,
            "kv_capacity_tokens": shape.kv_capacity_tokens,
            "utilisation_source": shape.utilisation_source,
        },
        "duration_s": limits.duration_s,
        "warmup_s": 0.0,
        "drain_s": limits.drain_s,
        "seed": limits.seed,
        "hints": dep.sends_hints,
    }
    family = "evinfra" if dep.kind == "evinfra" else "dynamo"
    costs = FIXED_COSTS[family]
    cfg["api_overhead_s"] = costs.api_overhead_s
    cfg["handoff_overhead_s"] = costs.handoff_overhead_s
    cfg["first_token_on_decode_step"] = FIRST_TOKEN_ON_DECODE_STEP[family]
    if run.trace is not None:
        cfg["trace"] = str(run.trace)
        cfg["workload"] = None
    else:
        cfg["workload"] = run.kind
        cfg["concurrency"] = run.concurrency
        if run.params:
            cfg["workload_params"] = {k: _option_value(v) for k, v in run.params}
    return cfg


def _option_value(text: str) -> Any:
    """A `--system-option` value as the simulator's config holds it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def write_sim_config(path: Path, cfg: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML


# -- aiperf cross-check -------------------------------------------------------------------
def write_crosscheck_trace(
    path: Path, *, num_requests: int = 40, interval_ms: int = 250, num_prefix_blocks: int = 2,
    num_own_blocks: int = 2, output_tokens: int = 64, block_tokens: int = 512,
) -> None:  # fmt: skip
    """A small Mooncake-format trace both clients read: every request shares a
    `num_prefix_blocks` prefix and has its own blocks; one every `interval_ms`."""
    rows = []
    next_id = num_prefix_blocks
    for i in range(num_requests):
        own = list(range(next_id, next_id + num_own_blocks))
        next_id += num_own_blocks
        hash_ids = [*range(num_prefix_blocks), *own]
        rows.append({
            "timestamp": i * interval_ms,
            "input_length": len(hash_ids) * block_tokens,
            "output_length": output_tokens,
            "hash_ids": hash_ids,
        })  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


AIPERF_TOKENIZER_REPO = "local/evinfra-mock"
_SNAPSHOT = "0" * 40


def make_hf_cache(hf_home: Path, model_dir: Path, repo: str = AIPERF_TOKENIZER_REPO) -> None:
    """Lay the local model dir out as a Hugging Face cache entry `repo` under `hf_home`.

    aiperf 0.13 decodes prompts in worker processes that force `HF_HUB_OFFLINE=1`, and in
    offline mode it resolves the tokenizer name through the hub cache
    (`snapshot_download(..., local_files_only=True)`), which rejects a directory path.
    A cache entry resolves offline; nothing is downloaded."""
    entry = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / _SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(_SNAPSHOT)
    for f in model_dir.iterdir():
        if f.is_file():
            (snapshot / f.name).write_bytes(f.read_bytes())


def aiperf_env(hf_home: Path) -> dict[str, str]:
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def aiperf_argv(
    aiperf_bin: str, url: str, model: str, trace: Path, tokenizer: str, out: Path
) -> list[str]:
    return [
        aiperf_bin, "profile", "--model", model, "--url", url,
        "--endpoint-type", "completions", "--streaming", "--use-server-token-count",
        "--tokenizer", tokenizer,
        "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace",
        "--fixed-schedule", "--extra-inputs", "ignore_eos:true",
        "--random-seed", "0", "--ui-type", "none", "--no-server-metrics",
        "--no-gpu-telemetry", "--output-artifact-dir", str(out),
    ]  # fmt: skip
