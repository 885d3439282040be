"""Dynamo's SLA planner: every adjustment interval (180 s), predict the next interval's
load, correct the profile by observed TTFT/ITL, and size prefill and decode pools.

Source: `docs/architecture/sla_planner.md` ("Scaling Algorithm", steps 1-5) and
`components/src/dynamo/planner/utils/planner_core.py`:

    p_correction  = observed TTFT / profiled TTFT at the observed ISL
    d_correction  = observed ITL / profiled ITL at the observed per-worker concurrency
                    (request rate * request duration / decode workers), context ISL + OSL/2
    prefill load  = next_num_req * next_isl / interval * min(1, p_correction)
    num_prefill   = ceil(prefill load / prefill tok/s per worker at the TTFT target)
    num_decode    = ceil(next_num_req * next_osl / interval
                         / decode tok/s per worker at (ITL target / d_correction, ISL + OSL/2))

each at least `min_endpoint` (1), then clamped to the GPU budget (here, the pool size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evinfra.core.types import Role, RoleChange
from evinfra.policy.base import ClusterView, PlannerObservation, RequestArrived
from evinfra.policy.dynamo.predictors import make_predictor
from evinfra.policy.dynamo.profile import WorkerProfile
from evinfra.policy.dynamo.scaling import apply_gpu_budget, fill_pool, restarts_to


@dataclass(frozen=True, slots=True)
class SlaPlannerConfig:
    """Defaults from Dynamo's `planner/config/defaults.py` (SLAPlannerDefaults)."""

    interval_s: float = 180.0
    ttft_target_s: float = 0.5
    itl_target_s: float = 0.05
    predictor: str = "arima"
    min_endpoint: int = 1
    correction: bool = True


@dataclass(frozen=True, slots=True)
class IntervalMetrics:
    """What the frontend reports for one interval (means over the interval's requests)."""

    num_requests: float
    isl_tokens: float
    osl_tokens: float
    ttft_s: float
    itl_s: float
    request_duration_s: float


@dataclass(frozen=True, slots=True)
class ReplicaTarget:
    num_prefill: int
    num_decode: int


def prefill_correction(metrics: IntervalMetrics, profile: WorkerProfile) -> float:
    return metrics.ttft_s / profile.expected_ttft_s(metrics.isl_tokens)


def decode_correction(
    metrics: IntervalMetrics, profile: WorkerProfile, interval_s: float, num_decode: int
) -> float:
    concurrency = (
        metrics.num_requests / interval_s * metrics.request_duration_s / max(num_decode, 1)
    )
    context = metrics.isl_tokens + metrics.osl_tokens / 2
    return metrics.itl_s / profile.expected_itl_s(concurrency, context)


def compute_replicas(
    next_num_req: float,
    next_isl: float,
    next_osl: float,
    p_correction: float,
    d_correction: float,
    profile: WorkerProfile,
    config: SlaPlannerConfig,
) -> ReplicaTarget:
    """The replica formulas of the module docstring (before the budget)."""
    prefill_load = next_num_req * next_isl / config.interval_s * min(1.0, p_correction)
    prefill_rate = profile.prefill_tokens_per_s_at_ttft(config.ttft_target_s)
    num_prefill = math.ceil(prefill_load / prefill_rate)
    corrected_itl_s = config.itl_target_s / d_correction
    decode_rate = profile.decode_tokens_per_s_at_itl(corrected_itl_s, next_isl + next_osl / 2)
    num_decode = math.ceil(next_num_req * next_osl / config.interval_s / decode_rate)
    return ReplicaTarget(
        max(num_prefill, config.min_endpoint), max(num_decode, config.min_endpoint)
    )


class _IntervalStats:
    def __init__(self) -> None:
        self.num_arrivals = 0
        self.sum_isl = 0.0
        self.num_finished = 0
        self.sum_osl = 0.0
        self.sum_ttft_s = 0.0
        self.sum_itl_s = 0.0
        self.sum_e2e_s = 0.0

    def metrics(self) -> IntervalMetrics | None:
        """None when the interval saw no arrival or no finished request (Dynamo skips)."""
        if self.num_arrivals == 0 or self.num_finished == 0:
            return None
        n = self.num_finished
        return IntervalMetrics(
            num_requests=float(self.num_arrivals),
            isl_tokens=self.sum_isl / self.num_arrivals,
            osl_tokens=self.sum_osl / n,
            ttft_s=self.sum_ttft_s / n,
            itl_s=self.sum_itl_s / n,
            request_duration_s=self.sum_e2e_s / n,
        )


class SlaPlanner:
    """`observe` accumulates the interval's frontend metrics; `plan` closes the interval."""

    def __init__(self, profile: WorkerProfile, config: SlaPlannerConfig | None = None) -> None:
        self.profile = profile
        self.config = config if config is not None else SlaPlannerConfig()
        self._num_req = make_predictor(self.config.predictor)
        self._isl = make_predictor(self.config.predictor)
        self._osl = make_predictor(self.config.predictor)
        self._stats = _IntervalStats()
        self.last_target: ReplicaTarget | None = None

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def observe(self, observation: PlannerObservation) -> None:
        stats = self._stats
        if isinstance(observation, RequestArrived):
            stats.num_arrivals += 1
            stats.sum_isl += observation.request.num_prompt_tokens
            return
        stats.num_finished += 1
        stats.sum_ttft_s += observation.ttft_s
        stats.sum_itl_s += observation.tpot_s
        stats.sum_e2e_s += observation.e2e_s
        if observation.tpot_s > 0:
            num_output = round((observation.e2e_s - observation.ttft_s) / observation.tpot_s) + 1
        else:
            num_output = 1
        stats.sum_osl += num_output

    def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        metrics = self._stats.metrics()
        num_arrivals = self._stats.num_arrivals
        self._stats = _IntervalStats()
        self._num_req.add_data_point(float(num_arrivals))
        if metrics is not None:
            self._isl.add_data_point(metrics.isl_tokens)
            self._osl.add_data_point(metrics.osl_tokens)
        nodes = list(view.nodes)
        # a scaling still in progress (a worker cold-starting) holds the planner, as
        # Dynamo's connector reports the deployment unstable during a rollout
        if metrics is None or any(not n.is_serving for n in nodes):
            return []
        target = self.target(metrics, sum(1 for n in nodes if n.role is Role.DECODE), len(nodes))
        self.last_target = target
        return restarts_to(nodes, target.num_prefill)

    def target(self, metrics: IntervalMetrics, num_decode: int, num_workers: int) -> ReplicaTarget:
        """Prefill and decode counts for the next interval on a pool of `num_workers`."""
        cfg = self.config
        p_corr = d_corr = 1.0
        if cfg.correction:
            p_corr = _usable(prefill_correction(metrics, self.profile))
            d_corr = _usable(decode_correction(metrics, self.profile, cfg.interval_s, num_decode))
        raw = compute_replicas(
            self._num_req.predict_next(),
            self._isl.predict_next(),
            self._osl.predict_next(),
            p_corr,
            d_corr,
            self.profile,
            cfg,
        )
        num_p, num_d = apply_gpu_budget(
            raw.num_prefill, raw.num_decode, num_workers, cfg.min_endpoint
        )
        num_p = fill_pool(num_p, num_d, num_workers, cfg.min_endpoint)
        return ReplicaTarget(num_p, num_workers - num_p)


def _usable(factor: float) -> float:
    """A correction factor that cannot be applied (no ITL observed: every output was one
    token) is left out, as Dynamo skips a failed correction."""
    return factor if factor > 0.0 and math.isfinite(factor) else 1.0
