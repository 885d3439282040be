"""The online PD planner: every few seconds, match the number of prefill and decode nodes
to the prefill and decode work arriving now and about to arrive.

Prefill demand is the uncached prompt tokens per second observed, or, when larger, the
tokens that sessions waiting on tools are expected to bring back within the horizon (their
expected return times and new context come from the session table). Decode demand is the
larger of the nodes needed for output tokens per second at the ITL target, for the KV of
running decodes, and for their batch slots. Switches are in place (KV kept); a target must
hold for `confirm_ticks` plans, and a node keeps its role at least `min_dwell_s`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from evinfra.core.types import Role, RoleChange, SessionState, SwitchMode
from evinfra.policy.base import (
    ClusterView,
    NodeView,
    PlannerObservation,
    RequestFinished,
)
from evinfra.policy.evolving.rates import NodeRates
from evinfra.policy.evolving.sessions import SessionTable


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    interval_s: float = 5.0
    window_s: float = 30.0
    """Observed demand is averaged over this trailing window."""
    horizon_s: float = 15.0
    """Expected returns from tool waits within this horizon count as demand now."""
    itl_target_s: float = 0.05
    prefill_utilisation: float = 0.7
    kv_utilisation: float = 0.85
    min_dwell_s: float = 15.0
    confirm_ticks: int = 2
    max_switches_per_tick: int = 4
    use_forecast: bool = True
    switch_mode: SwitchMode = SwitchMode.IN_PLACE


@dataclass(slots=True)
class EvolvingPlanner:
    table: SessionTable
    rates: NodeRates
    block_size: int
    config: PlannerConfig = field(default_factory=PlannerConfig)
    _finished: deque[tuple[float, int, int]] = field(default_factory=deque)
    """(time, uncached prompt tokens, output tokens) of recent finishes."""
    _last_switch_s: dict[int, float] = field(default_factory=dict)
    _pending_target: int | None = None
    _pending_count: int = 0
    prediction_log: list[tuple[float, float, float]] = field(default_factory=list)
    """(time, prefill tokens/s predicted for the next interval, observed over it)."""
    _last_prediction: tuple[float, float] | None = None
    targets: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, prefill nodes wanted, decode nodes wanted), for plots."""

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def observe(self, observation: PlannerObservation) -> None:
        if isinstance(observation, RequestFinished):
            req = observation.request
            uncached = max(req.num_prompt_tokens - observation.num_cached_prompt_tokens, 0)
            self._finished.append((observation.now_s, uncached, req.max_output_tokens))

    def _observed(self, now_s: float, span_s: float) -> tuple[float, float]:
        """Uncached prompt and output tokens per second over the last `span_s`."""
        while self._finished and self._finished[0][0] < now_s - self.config.window_s:
            self._finished.popleft()
        pre = out = 0
        for t, u, o in self._finished:
            if t >= now_s - span_s:
                pre += u
                out += o
        span = max(min(span_s, now_s), 1e-9)
        return pre / span, out / span

    def _forecast_prefill_tok_s(self, now_s: float) -> float:
        horizon = self.config.horizon_s
        tokens = 0.0
        for entry in self.table.sessions.values():
            waiting = entry.state is SessionState.WAITING_TOOL and not entry.is_last_turn
            if waiting and entry.expected_return_s() <= now_s + horizon:
                tokens += entry.new_blocks_ewma * self.block_size
        return tokens / horizon

    def demand(self, view: ClusterView, now_s: float) -> tuple[float, float]:
        """(prefill nodes, decode nodes) the current and coming work needs."""
        cfg, rates = self.config, self.rates
        pre_obs, out_obs = self._observed(now_s, cfg.window_s)
        pre = pre_obs
        if cfg.use_forecast:
            pre = max(pre, self._forecast_prefill_tok_s(now_s))
        self._score_prediction(now_s, pre)
        nodes = [n for n in view.nodes if n.is_serving]
        queued = sum(n.num_waiting_prefill_tokens for n in nodes)
        # a backlog must drain within the horizon too
        pre += queued / cfg.horizon_s
        need_p = pre / (rates.prefill_tok_s * cfg.prefill_utilisation)
        need_d_tok = out_obs / rates.decode_tok_s_at_itl(cfg.itl_target_s)
        decode_blocks = sum(n.num_decode_blocks for n in nodes)
        need_d_kv = decode_blocks / (rates.kv_capacity_blocks * cfg.kv_utilisation)
        running = sum(n.num_running_decodes for n in nodes)
        need_d_seq = running / rates.max_num_seqs
        return need_p, max(need_d_tok, need_d_kv, need_d_seq)

    def _score_prediction(self, now_s: float, predicted: float) -> None:
        if self._last_prediction is not None:
            t0, p0 = self._last_prediction
            observed, _ = self._observed(now_s, now_s - t0)
            self.prediction_log.append((t0, p0, observed))
        self._last_prediction = (now_s, predicted)

    def target_prefill_nodes(self, need_p: float, need_d: float, num_nodes: int) -> int:
        if num_nodes <= 1:
            return 0
        total = need_p + need_d
        share = 0.5 if total <= 0 else need_p / total
        target = math.floor(num_nodes * share + 0.5)
        return min(max(target, 1), num_nodes - 1)

    def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        nodes = [n for n in view.nodes if n.is_serving]
        need_p, need_d = self.demand(view, now_s)
        target = self.target_prefill_nodes(need_p, need_d, len(nodes))
        self.targets.append((now_s, target, len(nodes) - target))
        current = sum(1 for n in nodes if n.role is Role.PREFILL)
        if target == current:
            self._pending_target, self._pending_count = None, 0
            return []
        if target != self._pending_target:
            self._pending_target, self._pending_count = target, 0
        self._pending_count += 1
        if self._pending_count < self.config.confirm_ticks:
            return []
        return self._switch(nodes, target - current, now_s)

    def _switch(self, nodes: list[NodeView], delta: int, now_s: float) -> list[RoleChange]:
        cfg = self.config

        def free(n: NodeView) -> bool:
            return now_s - self._last_switch_s.get(n.node_id, -math.inf) >= cfg.min_dwell_s

        if delta > 0:
            # to prefill: the decode nodes that would strand the least work
            cands = [n for n in nodes if n.role is not Role.PREFILL and free(n)]
            cands.sort(key=lambda n: (n.num_running_decodes, n.num_decode_blocks, n.node_id))
            new_role = Role.PREFILL
        else:
            cands = [n for n in nodes if n.role is Role.PREFILL and free(n)]
            cands.sort(key=lambda n: (n.num_waiting_prefill_tokens, n.node_id))
            new_role = Role.DECODE
        picked = cands[: min(abs(delta), cfg.max_switches_per_tick)]
        for n in picked:
            self._last_switch_s[n.node_id] = now_s
        return [RoleChange(n.node_id, new_role, cfg.switch_mode) for n in picked]
