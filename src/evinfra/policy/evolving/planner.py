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
from evinfra.policy.evolving.latency import (
    ObservedLoad,
    carried_share,
    fastest_split,
    mixed_call_s,
    mixed_tpot_s,
    split_call_s,
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
    mixed_below_utilisation: float = 0.5
    """Below this share of the cluster's capacity in use, every node is mixed; 0: never
    mixed by load."""
    mixed_by_latency: bool = True
    """Past that share, nodes still all mixed stay mixed while mixing is predicted no
    slower than the split, within `split_hysteresis` (`latency.py`); a split in force is
    left only when load falls below the share's band, past the split's capacity
    (`mixed_past_split_capacity`) or past the ITL target (`mixed_past_split_itl`)."""
    mixed_in_overload: bool = False
    """In an overload, the layout that carries more of it. With every node mixed and
    neither layout predicted to carry the load (the mixed one nor the split the demands
    balance), nodes stay mixed while they are predicted to carry at least the split's
    share of it (`latency.carried_share`); without it such an overload splits, which
    halves the nodes that prefill (GLM-5 mixed at 64 GPUs, 7.5 sessions/s: 4/4 then 5/3
    at 540 s as computer-use took over, 53 -> 566 calls waiting in 40 s, every node mixed
    again at 590 s). Off by default until the goodput searches it can change are rerun;
    preset `evolving-overload` (with `mixed_past_split_overload`)."""
    mixed_past_split_overload: bool = False
    """A split in force predicted not to carry the offered load, whose observed P95 TTFT
    passes `ttft_target_s`, is left for every node mixed where mixed nodes are predicted
    to carry more of it, whatever their TPOT (`_split_overloaded`). A trade, off by
    default: the split's queue stops growing at the cost of mixed TPOT, and mean e2e can
    rise; preset `evolving-overload`."""
    mixed_past_split_capacity: bool = True
    """Every node is mixed, a split in force left, where no split carries the offered load
    (at every prefill count the prefill pool past its full rate or the decode pool past
    its targets, by `split_capacity_margin`, averaged over `capacity_window_s`) and every
    node mixed is predicted to keep TPOT within `itl_target_s`: mixed nodes pool prefill
    over every node while the decodes ride in the chunk steps."""
    split_capacity_margin: float = 0.1
    """How far past its capacity a split in force runs before it is left; nodes all mixed
    stay mixed from capacity on, so the margin is also the band between the two."""
    capacity_window_s: float = 120.0
    """The split's load past capacity is averaged over this trailing window, so a burst
    does not leave a split that carries the load on the whole."""
    mixed_past_split_itl: bool = True
    """A split in force whose observed mean TPOT (calls finished over `window_s`) passes
    `itl_target_s` is left for every node mixed where mixed TPOT is predicted within the
    target, and nodes then stay mixed for `capacity_window_s`: past its decode pool's
    batch slots a split queues decodes for a slot, which the latency model does not see."""
    mixed_past_split_ttft: bool = True
    """The same as `mixed_past_split_itl` for the first token: a split in force whose
    observed P95 TTFT (calls finished over `window_s`) passes `ttft_target_s` is left for
    every node mixed where mixed TPOT is predicted within `itl_target_s`, and nodes then
    stay mixed for `capacity_window_s`. A split halves (or worse) the nodes that prefill,
    and its prefill queue's tail, which bursts and the spread of prompt sizes build, is
    not in the latency model (on by default since 2026-12-05, once every goodput search
    and reference run it could change had been rerun with it; off: `evolving-no-ttft`)."""
    ttft_target_s: float = 2.0
    split_by_latency: bool = False
    """Split at the prefill count predicted fastest (`latency.fastest_split`) instead of the
    one balancing the two demands' load per node (an experiment, off by default)."""
    split_hysteresis: float = 0.05
    """A split keeps its prefill count while the busier pool's load is within this
    fraction of the best count's, so demand near a boundary does not flip a node."""
    mixed_prefill_fraction: float = 0.0
    """The share of nodes kept prefill-only (rounded, at least one node left mixed) while
    the rest run mixed, where the planner would make every node mixed. A prefill that
    lands on a node running decodes first waits for the step in flight; a prefill-only
    node has none, so long uncached prompts start at once there (the router sees that wait
    with `inflight_step_wait`). 0: every node mixed, the default."""
    switch_mode: SwitchMode = SwitchMode.IN_PLACE


def mixed_layout(num_nodes: int, prefill_fraction: float) -> tuple[int, int, int]:
    """(prefill, decode, mixed) nodes of the layout the planner calls mixed: every node
    mixed, or `prefill_fraction` of them (rounded, at least one node left mixed)
    prefill-only."""
    p = min(round(num_nodes * prefill_fraction), num_nodes - 1) if num_nodes > 1 else 0
    return p, 0, num_nodes - p


@dataclass(slots=True)
class EvolvingPlanner:
    table: SessionTable
    rates: NodeRates
    block_size: int
    config: PlannerConfig = field(default_factory=PlannerConfig)
    _finished: deque[tuple[float, int, int, int, float, float]] = field(default_factory=deque)
    """(time, uncached prompt tokens, output tokens, prompt tokens, TPOT, TTFT) of the
    calls finished within `window_s` (trimmed by `_observed_calls`, which `demand` runs)."""
    _last_switch_s: dict[int, float] = field(default_factory=dict)
    _pending_target: tuple[int, int, int] | None = None
    _split: bool = True
    _pending_count: int = 0
    prediction_log: list[tuple[float, float, float]] = field(default_factory=list)
    """(time, prefill tokens/s predicted for the next interval, observed over it)."""
    _last_prediction: tuple[float, float] | None = None
    targets: list[tuple[float, int, int]] = field(default_factory=list)
    """(time, prefill nodes wanted, decode nodes wanted), for plots."""
    _need_d_kv: float = 0.0
    """Decode nodes the running decodes' KV fills, from the last `demand`."""
    _load: ObservedLoad | None = None
    """The load the last `demand` saw, for the latency comparison."""
    _offered: ObservedLoad | None = None
    """`_load` without the queued backlog, which a split's own prefill pool builds."""
    _capacity_loads: deque[tuple[float, float]] = field(default_factory=deque)
    """(time, the best split's load against its capacity) of recent plans."""
    _plan_s: float = 0.0
    """The time of the plan being made."""
    _left_split_s: float = -math.inf
    """When a split was last left on its observed TPOT or TTFT (`_mixed_past_split_latency`)."""
    overload_holds: int = 0
    """Plans at which `mixed_in_overload` or `mixed_past_split_overload` chose every node
    mixed where the planner would otherwise have split or kept a split (summary.json's
    `planner_overload_holds`): 0 means the run is the one it would be with both off."""

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def observe(self, observation: PlannerObservation) -> None:
        if isinstance(observation, RequestFinished):
            req = observation.request
            uncached = max(req.num_prompt_tokens - observation.num_cached_prompt_tokens, 0)
            self._finished.append(
                (
                    observation.now_s,
                    uncached,
                    req.max_output_tokens,
                    req.num_prompt_tokens,
                    observation.tpot_s,
                    observation.ttft_s,
                )
            )

    def _observed(self, now_s: float, span_s: float) -> tuple[float, float]:
        """Uncached prompt and output tokens per second over the last `span_s`."""
        pre, out, _, _ = self._observed_calls(now_s, span_s)
        return pre, out

    def _observed_calls(self, now_s: float, span_s: float) -> tuple[float, float, float, float]:
        """Uncached prompt tokens, output tokens, calls and prompt tokens per second over
        the last `span_s`."""
        while self._finished and self._finished[0][0] < now_s - self.config.window_s:
            self._finished.popleft()
        pre = out = calls = prompt = 0
        for t, u, o, n, _, _ in self._finished:
            if t >= now_s - span_s:
                pre += u
                out += o
                calls += 1
                prompt += n
        span = max(min(span_s, now_s), 1e-9)
        return pre / span, out / span, calls / span, prompt / span

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
        pre_obs, out_obs, calls_s, prompt_tok_s = self._observed_calls(now_s, cfg.window_s)
        pre = pre_obs
        if cfg.use_forecast:
            pre = max(pre, self._forecast_prefill_tok_s(now_s))
        self._score_prediction(now_s, pre)
        nodes = [n for n in view.nodes if n.is_serving]
        queued = sum(n.num_waiting_prefill_tokens for n in nodes)
        offered = pre
        # a backlog must drain within the horizon too
        pre += queued / cfg.horizon_s
        self._load = self._offered = None
        if calls_s > 0:
            blocks = prompt_tok_s / calls_s / self.block_size
            self._load = ObservedLoad(pre, out_obs, calls_s, blocks)
            self._offered = ObservedLoad(offered, out_obs, calls_s, blocks)
        need_p = pre / (rates.prefill_tok_s * cfg.prefill_utilisation)
        need_d_tok = out_obs / rates.decode_tok_s_at_itl(cfg.itl_target_s)
        decode_blocks = sum(n.num_decode_blocks for n in nodes)
        need_d_kv = decode_blocks / (rates.kv_capacity_blocks * cfg.kv_utilisation)
        self._need_d_kv = need_d_kv
        running = sum(n.num_running_decodes for n in nodes)
        need_d_seq = running / rates.max_num_seqs
        return need_p, max(need_d_tok, need_d_kv, need_d_seq)

    def _score_prediction(self, now_s: float, predicted: float) -> None:
        if self._last_prediction is not None:
            t0, p0 = self._last_prediction
            observed, _ = self._observed(now_s, now_s - t0)
            self.prediction_log.append((t0, p0, observed))
        self._last_prediction = (now_s, predicted)

    def target_prefill_nodes(
        self, need_p: float, need_d: float, num_nodes: int, current_p: int | None = None
    ) -> int:
        """Prefill nodes for a split: the count whose busier pool carries the least load
        per node, need_p / p against need_d / (n - p). The balance point x = n * need_p /
        (need_p + need_d) lies between two counts; rounding x to the nearest one overloads
        the smaller pool (16 nodes, x = 12.5: 13/3 loads decode to 117% of its target,
        12/4 loads prefill to 104%), so the smaller pool gets the node until x passes
        p * n / (n - 1). `current_p`, the split in force, is kept while its load is within
        `split_hysteresis` of the best count's."""
        if num_nodes <= 1:
            return 0
        last = num_nodes - 1
        total = need_p + need_d
        if total <= 0:
            return min(max(num_nodes // 2, 1), last)

        def load(p: int) -> float:
            return max(need_p / p, need_d / (num_nodes - p))

        x = num_nodes * need_p / total
        low = min(max(math.floor(x), 1), last)
        high = min(max(math.ceil(x), 1), last)
        best = high if load(high) < load(low) else low
        band = load(best) * (1 + self.config.split_hysteresis)
        if current_p is not None and 1 <= current_p <= last and load(current_p) <= band:
            return current_p
        return best

    def target_roles(
        self, need_p: float, need_d: float, num_nodes: int, current_p: int | None = None
    ) -> tuple[int, int, int]:
        """(prefill, decode, mixed) nodes wanted. Under light load every node is mixed:
        prefill interference costs little there and any node can take a session back where
        its context lives; past `mixed_below_utilisation` the split disaggregates, unless
        prefill's share of the work rounds to no node, the running decodes' KV would
        not fit on the split's decode nodes, or no split carries the load, or the split in
        force serves calls past the ITL target, where every node mixed is predicted to
        carry it (`_mixed_past_split_capacity`, `_mixed_past_split_latency`). The mixed
        layout keeps `mixed_prefill_fraction` of the nodes prefill-only."""
        threshold = self.config.mixed_below_utilisation
        if self._split:
            threshold *= 0.8  # a band, so load near the threshold does not flap the roles
        if num_nodes <= 1 or (need_p + need_d) / num_nodes < threshold:
            return self._mixed_layout(num_nodes)
        p = self.target_prefill_nodes(need_p, need_d, num_nodes, current_p)
        if self.config.split_by_latency and self._load is not None:
            p = self._fastest_prefill_nodes(self._load, num_nodes, current_p, p)
        share_p = num_nodes * need_p / (need_p + need_d)
        mixing = self.config.mixed_below_utilisation > 0  # 0: never mixed by load
        if mixing and (share_p < 0.5 or self._need_d_kv > num_nodes - p):
            # prefill's share rounds to no node: a split would give a whole node to a
            # fraction of one's work and take it from decode; or the running decodes' KV
            # would not fit on the split's decode nodes, where mixed nodes hold it
            # together (hand-offs would queue for KV room)
            return self._mixed_layout(num_nodes)
        if mixing and self._mixed_past_split_capacity(num_nodes, current_p is not None):
            return self._mixed_layout(num_nodes)
        if mixing and self._mixed_past_split_latency(num_nodes, current_p is not None):
            return self._mixed_layout(num_nodes)
        if mixing and current_p is not None and self._split_overloaded(p, num_nodes):
            return self._mixed_layout(num_nodes)
        # the latency rule keeps nodes mixed but never leaves a split in force: under a
        # split its inputs (prefill queues, small prefills on decode nodes) are the
        # split's own, and leaving on them flapped GLM-5 computer-use at 64 GPUs between
        # 6/2 and all mixed every 50 s; a split is left when load falls below the band,
        # past the split's capacity or past the ITL target (above)
        if mixing and current_p is None and self._mixing_is_faster(p, num_nodes):
            return self._mixed_layout(num_nodes)
        self._split = True
        return p, num_nodes - p, 0

    def _mixed_layout(self, num_nodes: int) -> tuple[int, int, int]:
        self._split = False
        return mixed_layout(num_nodes, self.config.mixed_prefill_fraction)

    def _fastest_prefill_nodes(
        self, load: ObservedLoad, num_nodes: int, current_p: int | None, fallback: int
    ) -> int:
        """The prefill count predicted fastest; the split in force while its prediction
        is within `split_hysteresis` of the best; `fallback` when no split carries the
        load."""
        best, best_s = fastest_split(self.rates, load, num_nodes)
        if not math.isfinite(best_s):
            return fallback
        if current_p is not None and 1 <= current_p < num_nodes:
            now_s = split_call_s(self.rates, load, current_p, num_nodes - current_p)
            if now_s <= best_s * (1 + self.config.split_hysteresis):
                return current_p
        return best

    def _note_split_capacity(self, need_d: float, num_nodes: int, now_s: float) -> None:
        """Record the least, over prefill counts p, of the busier pool's load against its
        capacity: offered prefill tokens/s over p nodes' full rate, decode demand over
        n - p nodes."""
        window = self._capacity_loads
        while window and window[0][0] <= now_s - self.config.capacity_window_s:
            window.popleft()
        load = self._offered
        if load is None or num_nodes <= 1:
            return
        rate = self.rates.prefill_tok_s
        least = min(
            max(load.prefill_tok_s / (p * rate), need_d / (num_nodes - p))
            for p in range(1, num_nodes)
        )
        window.append((now_s, least))

    def _mixed_past_split_capacity(self, num_nodes: int, split: bool) -> bool:
        """No split carries the offered load and every node mixed is predicted to: the
        best split's load against its capacity (`_note_split_capacity`), averaged over
        `capacity_window_s`, passes 1 (1 plus `split_capacity_margin` with a split in
        force), and mixed TPOT stays within the ITL target. Past the split's capacity
        the demands push nodes back and forth between the two pools while the queue
        grows (Kimi-K2 computer-use at 64 GPUs, 4 sessions/s: 1.1 past capacity from
        335 s, 5/3 and 6/2 in turn every 30-50 s from 550 s, 571 calls waiting at the
        end), and mixed nodes carry what the split cannot; at 3 sessions/s, where the
        split serves calls sooner, the average stays under 1.07. The offered load
        leaves out the queued backlog, which the split's own prefill pool builds."""
        cfg, load, window = self.config, self._offered, self._capacity_loads
        if not cfg.mixed_past_split_capacity or load is None or not window:
            return False
        bound = 1 + cfg.split_capacity_margin if split else 1.0
        if sum(least for _, least in window) / len(window) <= bound:
            return False
        return mixed_tpot_s(self.rates, load, num_nodes) <= cfg.itl_target_s

    def _observed_tpot_s(self) -> float:
        """Mean TPOT of the calls with two or more output tokens finished within
        `window_s` (`demand` trims the window first); 0 without any."""
        tpots = [tpot for _, _, out, _, tpot, _ in self._finished if out >= 2]
        return sum(tpots) / len(tpots) if tpots else 0.0

    def _observed_ttft_p95_s(self) -> float:
        """P95 TTFT of the calls finished within `window_s` (nearest rank); 0 without any."""
        ttfts = sorted(ttft for *_, ttft in self._finished)
        if not ttfts:
            return 0.0
        return ttfts[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)) - 1)]

    def _mixed_past_split_latency(self, num_nodes: int, split: bool) -> bool:
        """A split in force serves calls slower than the ITL target (observed mean TPOT)
        or, with `mixed_past_split_ttft`, past the TTFT target (observed P95 TTFT), or one
        was left so within `capacity_window_s`, and every node mixed is predicted
        within the target. The latency model takes the running decodes from Little's law
        on the output rate, and a split whose decode pool is short of batch slots queues
        the rest for one (Kimi-K2 coding at 64 GPUs, 7.5 sessions/s: 2/6 from 900 s with
        1,780-2,150 running decodes against 1,536 slots, calls' TPOT 78-124 ms where
        27.6 ms was predicted); mixed nodes batch on every node."""
        cfg, load = self.config, self._offered
        if not (cfg.mixed_past_split_itl or cfg.mixed_past_split_ttft) or load is None:
            return False
        now_s = self._plan_s
        leave = split and (
            (cfg.mixed_past_split_itl and self._observed_tpot_s() > cfg.itl_target_s)
            or (cfg.mixed_past_split_ttft and self._observed_ttft_p95_s() > cfg.ttft_target_s)
        )
        held = now_s - self._left_split_s < cfg.capacity_window_s
        if not (leave or held) or mixed_tpot_s(self.rates, load, num_nodes) > cfg.itl_target_s:
            return False
        if leave:
            self._left_split_s = now_s
        return True

    def _split_overloaded(self, num_prefill: int, num_nodes: int) -> bool:
        """With `mixed_past_split_overload`, under a split in force: the split the demands
        balance is predicted not to carry the offered load (its prefill pool past its full
        rate or its decode pool past its batch slots: a queue that only grows), its calls'
        P95 TTFT over `window_s` passes the target, and every node mixed is predicted to
        carry more of the load (`latency.carried_share`), whatever mixed TPOT (the
        latency rules ask it within target, so a split past its capacity stayed:
        Kimi-K2 computer-use at 64 GPUs, 5.5 sessions/s, seed 1: 6/2 and 5/3 in turn from
        240 s, the offered load 6-25% past their capacity while mixed nodes carried all of
        it at a predicted 51-67 ms TPOT, P95 TTFT 5.65 s). The offered load leaves out the
        backlog, which the split's own prefill pool builds."""
        load = self._offered
        if not self.config.mixed_past_split_overload or load is None:
            return False
        num_decode = num_nodes - num_prefill
        if math.isfinite(split_call_s(self.rates, load, num_prefill, num_decode)):
            return False
        if self._observed_ttft_p95_s() <= self.config.ttft_target_s:
            return False  # the split still serves first tokens within the target
        mixed_share, split_share = self._carried_shares(load, num_prefill, num_nodes)
        if mixed_share <= split_share:
            return False
        self.overload_holds += 1
        return True

    def _carried_shares(
        self, load: ObservedLoad, num_prefill: int, num_nodes: int
    ) -> tuple[float, float]:
        """(every node mixed, the split with `num_prefill` prefill nodes): the share of
        `load` each is predicted to carry (`latency.carried_share`)."""
        rates, num_decode = self.rates, num_nodes - num_prefill
        mixed_share = carried_share(lambda x: mixed_call_s(rates, x, num_nodes), load)
        split_share = carried_share(lambda x: split_call_s(rates, x, num_prefill, num_decode), load)
        return mixed_share, split_share

    def _mixing_is_faster(self, num_prefill: int, num_nodes: int) -> bool:
        """Every node mixed is predicted to serve a call no later than the split with
        `num_prefill` prefill nodes, within `split_hysteresis` (mixed is in force)."""
        load = self._load
        if not self.config.mixed_by_latency or load is None:
            return False
        rates, num_decode = self.rates, num_nodes - num_prefill
        mixed = mixed_call_s(rates, load, num_nodes)
        if not math.isfinite(mixed) and not self.config.mixed_in_overload:
            return False
        split = split_call_s(rates, load, num_prefill, num_decode)
        if math.isfinite(mixed):
            return mixed <= split * (1 + self.config.split_hysteresis)
        if math.isfinite(split):
            return False
        # an overload neither layout carries: stay with the one that carries more
        mixed_share, split_share = self._carried_shares(load, num_prefill, num_nodes)
        if mixed_share < split_share:
            return False
        self.overload_holds += 1
        return True

    def plan(self, view: ClusterView, now_s: float) -> list[RoleChange]:
        if self.config.switch_mode is SwitchMode.RESTART and not all(
            n.is_serving for n in view.nodes
        ):
            # a restart in progress: plan again once every worker is back (as Dynamo's
            # planner does), so restarts never take the whole cluster offline
            return []
        nodes = [n for n in view.nodes if n.is_serving]
        self._plan_s = now_s
        need_p, need_d = self.demand(view, now_s)
        self._note_split_capacity(need_d, len(nodes), now_s)
        current = tuple(sum(1 for n in nodes if n.role is r) for r in _ROLES)
        split_p = current[0] if current[0] and not current[2] else None
        target = self.target_roles(need_p, need_d, len(nodes), split_p)
        self.targets.append((now_s, target[0], target[1] + target[2]))
        if target == current:
            self._pending_target, self._pending_count = None, 0
            return []
        if target != self._pending_target:
            self._pending_target, self._pending_count = target, 0
        self._pending_count += 1
        if self._pending_count < self.config.confirm_ticks:
            return []
        return self._switch(nodes, dict(zip(_ROLES, target, strict=True)), now_s)

    def _switch(
        self, nodes: list[NodeView], target: dict[Role, int], now_s: float
    ) -> list[RoleChange]:
        """Move nodes from roles over their target to roles under it, picking the nodes
        that strand the least work, at most `max_switches_per_tick`."""
        cfg = self.config

        def free(n: NodeView) -> bool:
            return now_s - self._last_switch_s.get(n.node_id, -math.inf) >= cfg.min_dwell_s

        surplus: list[NodeView] = []
        for role in _ROLES:
            have = [n for n in nodes if n.role is role]
            extra = len(have) - target[role]
            if extra > 0:
                # a decode-capable node strands running decodes, a prefill one its queue
                have = [n for n in have if free(n)]
                have.sort(key=lambda n: (_work(n, role), n.node_id))
                surplus += have[:extra]
        count = {r: sum(1 for n in nodes if n.role is r) for r in _ROLES}
        deficits = [r for r in _ROLES for _ in range(target[r] - count[r])]
        changes: list[RoleChange] = []
        for node, role in zip(surplus, deficits, strict=False):
            if len(changes) >= cfg.max_switches_per_tick:
                break
            self._last_switch_s[node.node_id] = now_s
            changes.append(RoleChange(node.node_id, role, cfg.switch_mode))
        return changes


_ROLES = (Role.PREFILL, Role.DECODE, Role.MIXED)


def _work(node: NodeView, role: Role) -> tuple[int, int]:
    if role is Role.PREFILL:
        return node.num_waiting_prefill_tokens, 0
    return node.num_running_decodes, node.num_decode_blocks
