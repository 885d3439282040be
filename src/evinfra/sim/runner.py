"""Build a simulation from a config and run it: nodes, cost models, the system bundle,
the workload; returns the summary with the fixed metric names."""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evinfra.core.allocation import parse_allocation
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig
from evinfra.costmodel.base import CostModel
from evinfra.costmodel.catalog import get_gpu, get_model
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.registry import make_cost_model
from evinfra.costmodel.spec import Dtype
from evinfra.policy.bundle import ClusterShape, SystemBundle, make_system
from evinfra.sim.config import ConfigError, SimConfig
from evinfra.sim.failure_stop import FailureStop, num_calls_before
from evinfra.sim.links import LinkModel
from evinfra.sim.metrics import NO_QUEUE_TREND, Metrics, summarize
from evinfra.sim.node import SimNode
from evinfra.sim.simulation import Progress, SimSettings, Simulation
from evinfra.workloads.requests import PrefixHashCache, make_request
from evinfra.workloads.types import SessionPlan, Workload


def link_domain(node_id: int, gpus_per_node: int, domain_gpus: int) -> int:
    """The NVLink domain of a node (the GPU's `nvlink_domain_size` GPUs: an NVL72 rack, an
    8-GPU HGX board), by its first GPU; transfers leave a domain over the NICs."""
    return node_id * gpus_per_node // domain_gpus


def same_domain_share(num_nodes: int, gpus_per_node: int, domain_gpus: int) -> float:
    """Of the ordered pairs of distinct nodes, the share inside one NVLink domain (1 with
    fewer than two nodes)."""
    if num_nodes < 2:
        return 1.0
    sizes = Counter(link_domain(i, gpus_per_node, domain_gpus) for i in range(num_nodes))
    return sum(n * (n - 1) for n in sizes.values()) / (num_nodes * (num_nodes - 1))


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    summary: dict[str, Any]
    metrics: Metrics
    node_spec: NodeSpec


def build_node_spec(cfg: SimConfig) -> NodeSpec:
    try:
        model = get_model(cfg.model)
    except KeyError as exc:
        raise ConfigError(f"model: {exc.args[0]}") from None
    try:
        gpu = get_gpu(cfg.gpu)
    except KeyError as exc:
        raise ConfigError(f"gpu: {exc.args[0]}") from None
    try:
        kv_dtype = Dtype(cfg.kv_dtype)
    except ValueError:
        raise ConfigError(f"kv_dtype: {cfg.kv_dtype!r} is not one of bf16, fp8") from None
    try:
        return NodeSpec(model, gpu, cfg.gpus_per_node, kv_dtype=kv_dtype, block_size=cfg.block_size)
    except ValueError as exc:
        raise ConfigError(f"node: {exc}") from None


def num_device_blocks(cfg: SimConfig, spec: NodeSpec) -> int:
    return max(1, int(spec.num_device_blocks * cfg.kv_capacity_scale))


def build_workload(cfg: SimConfig) -> Workload:
    from evinfra.workloads.factory import load_trace, make_workload

    try:
        if cfg.trace is not None:
            return load_trace(cfg.trace, rate_scale=cfg.rate_scale, fmt=None)
        assert cfg.workload is not None
        return make_workload(
            cfg.workload,
            seed=cfg.seed,
            session_rate_per_s=cfg.session_rate,
            concurrency=cfg.concurrency,
            num_sessions=cfg.num_sessions,
            duration_s=cfg.duration_s,
            hints=cfg.hints,
            params=dict(cfg.workload_params),
        )
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"workload: {exc}") from None


def expected_transfer_time_s(cfg: SimConfig, spec: NodeSpec) -> Callable[[int], float]:
    """What the policies are told a KV transfer takes (`ClusterShape.transfer_time_s`,
    which names no nodes): to another node drawn at random, inside its NVLink domain or
    over the NICs, by the share of node pairs inside one."""
    share = same_domain_share(cfg.num_nodes, cfg.gpus_per_node, spec.gpu.nvlink_domain_size)

    def transfer_time_s(num_bytes: int) -> float:
        inside = spec.transfer_time_s(num_bytes, same_rack=True)
        if share == 1.0:
            return inside
        across = spec.transfer_time_s(num_bytes, same_rack=False)
        if across == inside:  # descriptor-bound both ways: exactly as before
            return inside
        return share * inside + (1.0 - share) * across

    return transfer_time_s


def build_bundle(cfg: SimConfig, spec: NodeSpec, cost: CostModel) -> SystemBundle:
    transfer_time_s = expected_transfer_time_s(cfg, spec)

    shape = ClusterShape(
        num_nodes=cfg.num_nodes,
        block_size=cfg.block_size,
        num_device_blocks_per_node=num_device_blocks(cfg, spec),
        num_host_blocks_per_node=spec.num_host_blocks,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        cost_model=cost,
        transfer_time_s=transfer_time_s,
    )
    options = dict(cfg.system_options)
    try:
        return make_system(cfg.system, shape, options)
    except KeyError as exc:
        raise ConfigError(f"system: {exc.args[0]}") from None
    except ValueError as exc:
        raise ConfigError(f"system_options: {exc}") from None


def build_simulation(
    cfg: SimConfig, progress: Progress | None = None
) -> tuple[Simulation, NodeSpec]:
    spec = build_node_spec(cfg)
    try:
        cost = make_cost_model(cfg.cost_model, spec, **cfg.cost_options)
    except KeyError as exc:
        raise ConfigError(f"cost_model: {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cost_options: {exc}") from None
    bundle = build_bundle(cfg, spec, cost)
    if len(bundle.initial_roles) != cfg.num_nodes:
        raise ConfigError(f"system {cfg.system} gave {len(bundle.initial_roles)} roles")
    sched_cfg = SchedulerConfig(
        cfg.block_size,
        cfg.max_num_batched_tokens,
        cfg.max_num_seqs,
        allocation=parse_allocation(cfg.kv_allocation),
    )
    nodes = []
    for i, role in enumerate(bundle.initial_roles):
        pool = KVPool(
            max(1, int(num_device_blocks(cfg, spec) * bundle.kv_capacity_scale)),
            spec.num_host_blocks if bundle.host_tier else 0,
            bundle.kv_manager.eviction_for(i),
        )
        host_bw = spec.host_transfer_time_s(1 << 30)
        nodes.append(SimNode(NodeScheduler(i, pool, sched_cfg, role), cost, (1 << 30) / host_bw))
    domain_of = [
        link_domain(i, cfg.gpus_per_node, spec.gpu.nvlink_domain_size) for i in range(cfg.num_nodes)
    ]

    def transfer_time_s(src: int, dst: int, num_bytes: int, num_blocks: int) -> float:
        return spec.transfer_time_s(num_bytes, domain_of[src] == domain_of[dst])

    workload = build_workload(cfg)
    cache = PrefixHashCache()
    block_size = cfg.block_size
    hints = cfg.hints

    def factory(rid: int, plan: SessionPlan, index: int) -> Any:
        return make_request(rid, plan, index, block_size, hints, cache=cache)

    sim = Simulation(
        nodes=nodes,
        bundle=bundle,
        workload=workload,
        links=LinkModel(len(nodes), transfer_time_s),
        make_request=factory,
        settings=SimSettings(
            horizon_s=cfg.duration_s,
            warmup_s=cfg.warmup_s,
            drain_s=cfg.drain_s,
            sample_interval_s=cfg.sample_interval_s,
            kv_tick_s=cfg.kv_tick_s,
            check_integrity=cfg.check_integrity,
            api_overhead_s=cfg.api_overhead_s,
            handoff_overhead_s=cfg.handoff_overhead_s,
            first_token_on_decode_step=cfg.first_token_on_decode_step,
        ),
        progress=progress,
        failure_stop=_failure_stop(cfg, workload),
    )
    return sim, spec


def _failure_stop(cfg: SimConfig, workload: Workload) -> FailureStop | None:
    if cfg.stop_past_ttft_p95_s is None:
        return None
    return FailureStop(
        ttft_p95_s=cfg.stop_past_ttft_p95_s,
        max_unfinished_frac=cfg.stop_max_unfinished_frac,
        warmup_s=cfg.warmup_s,
        horizon_s=cfg.duration_s,
        count_calls=lambda: num_calls_before(workload.arrivals(), cfg.duration_s),
    )


def run_sim(
    cfg: SimConfig,
    progress: Progress | None = None,
    prepare: Callable[[Simulation], None] | None = None,
) -> SimResult:
    """Build and run the simulation of `cfg`; `prepare` may adjust it before it runs (a
    benchmark wrapping how requests are made, for example)."""
    start = time.perf_counter()
    sim, spec = build_simulation(cfg, progress)
    if prepare is not None:
        prepare(sim)
    metrics = _run_without_cyclic_gc(sim)
    wall_s = time.perf_counter() - start
    summary: dict[str, Any] = {"system": cfg.system}
    summary.update(
        summarize(metrics, warmup_s=cfg.warmup_s, end_s=cfg.duration_s, num_gpus=cfg.num_gpus)
    )
    summary["sim_events"] = sim.events.num_processed
    summary["sim_end_s"] = sim.events.now_s
    summary["wall_s"] = wall_s
    summary["events_per_s"] = sim.events.num_processed / max(wall_s, 1e-9)
    summary["sim_s_per_wall_s"] = sim.events.now_s / max(wall_s, 1e-9)
    summary["kv_link_bytes"] = sim.links.num_bytes_moved
    summary["switch_cost_s"] = metrics.switch_cost_s
    summary["planner_prediction_error"] = prediction_error(sim.bundle.planner)
    summary["planner_overload_holds"] = getattr(sim.bundle.planner, "overload_holds", None)
    if sim.failure_stop is not None:
        # the figures above are the run's up to this time, not the whole window's
        summary["stopped_s"] = sim.stopped[0] if sim.stopped else None
        summary["stopped_reason"] = sim.stopped[1] if sim.stopped else None
        if sim.stopped:  # its samples end at the stop: no trend over the whole window
            summary.update(NO_QUEUE_TREND)
    return SimResult(cfg, summary, metrics, spec)


def _run_without_cyclic_gc(sim: Simulation) -> Metrics:
    """`sim.run()` with Python's cyclic garbage collector paused: each of its full passes
    walks every long-lived object (block lists, indexes, sequences: millions) to find the
    few hundred cycles a run leaves, about a tenth of the run's CPU. Reference counting
    still frees everything else at once; the cycles wait for the collector's next pass
    after the run. Nothing in the simulation depends on when objects are collected."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return sim.run()
    finally:
        if was_enabled:
            gc.enable()


def prediction_error(planner: object) -> float:
    """Mean absolute error of a planner's prefill-demand predictions, relative to the mean
    observed demand (NaN when the planner keeps no `prediction_log`)."""
    log = getattr(planner, "prediction_log", None)
    if not log:
        return math.nan
    observed = [float(o) for _, _, o in log]
    scale = sum(observed) / len(observed)
    if scale <= 0:
        return math.nan
    return (
        float(sum(abs(float(p) - o) for (_, p, _), o in zip(log, observed, strict=True)))
        / len(log)
        / scale
    )
