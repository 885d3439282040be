"""The planner's latency comparison of every node mixed against a split: hand-computed
predictions, overload as infinity, the rates' mixed steps from the cost model, and the
planner keeping nodes mixed past the utilisation threshold where mixing is faster, and
leaving a split past its capacity, or serving past the ITL target, for mixed nodes that
carry the load."""

import math
from dataclasses import replace

import pytest

from evinfra.core.types import Request, Role
from evinfra.costmodel.base import BatchShape
from evinfra.policy.base import RequestFinished
from evinfra.policy.bundle import ClusterShape
from evinfra.policy.evolving.bundle import monotone_decode
from evinfra.policy.evolving.latency import (
    ObservedLoad,
    carried_share,
    fastest_split,
    mixed_call_s,
    mixed_tpot_s,
    split_call_s,
)
from evinfra.policy.evolving.planner import EvolvingPlanner, PlannerConfig
from evinfra.policy.evolving.rates import node_rates
from evinfra.policy.evolving.sessions import SessionTable
from tests.unit.policy.dynamo_fakes import FakeNode, cluster
from tests.unit.policy.test_evolving_router_planner import RATES

# compute bound like a large MoE: a 512-token chunk takes 51.2 ms and a step that also
# carries decodes barely more, while a decode-only step takes 10 to 50 ms
MOE = replace(RATES, chunk_tokens=512, mixed_step_s_at=((1, 0.052), (64, 0.055), (256, 0.07)))
LOAD = ObservedLoad(
    prefill_tok_s=2000.0, output_tok_s=400.0, calls_s=2.0, prompt_blocks_per_call=100
)


def test_split_prediction_by_hand() -> None:
    # prefill: 1,000 tokens at 10,000/s, at utilisation 0.2, then 100 blocks over the link
    ttft = 0.1 / 0.8 + (1e-3 + 100 * 16_000 / 1e9)
    # decode: R = 400 tok/s x step(R) settles at R = 4.19, step(4) = 0.01 + 0.01 * 3 / 63
    tpot = 0.01 + 0.01 * 3 / 63
    assert split_call_s(MOE, LOAD, 1, 1) == pytest.approx(ttft + 200 * tpot, rel=1e-9)


def test_mixed_prediction_by_hand() -> None:
    # two nodes, 1,000 prefill tokens/s each; 2 decodes a node at the fixed point
    step = 0.01 + 0.01 / 63
    mixed_step = 0.052 + 0.003 / 63
    chunks_s = 1000 / 510
    steps_s = (1 - chunks_s * (mixed_step - step)) / step
    share = chunks_s / steps_s
    ttft = 1000 / 510 * mixed_step / (1 - share)
    expected = ttft + 200 / steps_s
    assert mixed_call_s(MOE, LOAD, 2) == pytest.approx(expected, rel=1e-9)


def test_a_load_a_configuration_cannot_carry_predicts_infinity() -> None:
    heavy_prefill = replace(LOAD, prefill_tok_s=25_000.0, calls_s=25.0)
    assert split_call_s(MOE, heavy_prefill, 2, 2) == math.inf  # 20,000 tok/s of prefill
    assert math.isfinite(split_call_s(MOE, heavy_prefill, 3, 1))
    # a mixed step carries 511 prefill tokens in 52 ms: 4 nodes take 39,000 tok/s
    assert math.isfinite(mixed_call_s(MOE, heavy_prefill, 4))
    assert mixed_call_s(MOE, replace(LOAD, prefill_tok_s=45_000.0), 4) == math.inf
    # 256 decodes a node at most: 30,000 output tok/s at 50 ms steps needs 1,500
    heavy_decode = replace(LOAD, output_tok_s=30_000.0)
    assert split_call_s(MOE, heavy_decode, 1, 3) == math.inf
    assert mixed_call_s(MOE, heavy_decode, 4) == math.inf
    assert split_call_s(MOE, LOAD, 0, 4) == math.inf


class _BentCost:
    """Prefill at 10,000 tok/s overlapping a decode step that bends back past 8 sequences
    (as a polynomial fitted on a range does)."""

    kv_capacity_tokens = 1 << 20
    kv_bytes_per_token = 1000

    def step_time_s(self, batch: BatchShape) -> float:
        b = batch.num_decode_seqs
        decode = 0.01 * b if b <= 8 else 0.001
        return max(batch.num_prefill_tokens * 1e-4, decode)

    def decode_run_time_s(self, num_seqs: int, ctx: int, kv: int, num_steps: int) -> float:
        return num_steps * self.step_time_s(BatchShape((), num_seqs, ctx, kv))


def test_rates_probe_mixed_steps_and_monotone_keeps_them_above_decode() -> None:
    shape = ClusterShape(2, 16, 1024, 0, 1000, 256, 64, cost_model=_BentCost())
    rates = node_rates(shape)
    assert rates.chunk_tokens == 256
    # the chunk (the budget less the decodes) or the decode step, whichever is longer
    raw = ((1, 0.0255), (2, 0.0254), (4, 0.04), (8, 0.08), (16, 0.024), (32, 0.0224), (64, 0.0192))
    assert [b for b, _ in rates.mixed_step_s_at] == [b for b, _ in raw]
    assert [t for _, t in rates.mixed_step_s_at] == pytest.approx([t for _, t in raw])
    fixed = monotone_decode(rates)
    for b, t in fixed.mixed_step_s_at:
        assert t >= fixed.decode_step_s(b)
    times = [t for _, t in fixed.mixed_step_s_at]
    assert times == sorted(times)


def test_carried_share_is_the_layouts_capacity_against_the_load() -> None:
    # 25,000 prefill tokens/s: 2 prefill nodes of 10,000 carry 80% of it, 3 carry it all
    heavy_prefill = replace(LOAD, prefill_tok_s=25_000.0, calls_s=25.0)
    share = carried_share(lambda x: split_call_s(MOE, x, 2, 2), heavy_prefill)
    assert 0.8 - 1 / 512 < share < 0.8
    assert carried_share(lambda x: split_call_s(MOE, x, 3, 1), heavy_prefill) == 1.0
    # 4 mixed nodes carry about 39,000 prefill tokens/s of 45,000
    mixed = carried_share(lambda x: mixed_call_s(MOE, x, 4), replace(LOAD, prefill_tok_s=45_000.0))
    assert 0.8 < mixed < 0.9
    assert carried_share(lambda x: split_call_s(MOE, x, 0, 4), LOAD) == 0.0


def _planner(
    mixed_by_latency: bool,
    split_by_latency: bool = False,
    past_capacity: bool = True,
    in_overload: bool = False,
    split_overload: bool = False,
) -> EvolvingPlanner:
    cfg = PlannerConfig(
        min_dwell_s=0.0,
        mixed_by_latency=mixed_by_latency,
        split_by_latency=split_by_latency,
        mixed_past_split_capacity=past_capacity,
        mixed_in_overload=in_overload,
        mixed_past_split_overload=split_overload,
    )
    return EvolvingPlanner(SessionTable(), MOE, 16, cfg)


def _plan_twice(
    p: EvolvingPlanner,
    uncached: int,
    out: int,
    roles: list[Role],
    *,
    tpot_s: float = 0.02,
    ttft_s: float = 0.1,
    start_s: float = 0.0,
) -> list[Role]:
    """Ten calls a second from `start_s` for 30 s, first token at `ttft_s`, finishing at
    `tpot_s`, then two plans (a target must hold twice)."""
    for t in range(30):
        for j in range(10):
            now_s = start_s + t + j / 10
            req = Request(int(now_s * 1000), (), uncached + 100, out)
            p.observe(RequestFinished(req, now_s, 100, ttft_s, ttft_s + out * tpot_s, tpot_s))
    view = cluster(*(FakeNode(i, role) for i, role in enumerate(roles)))
    p.plan(view, start_s + 30.0)
    return sorted((c.new_role for c in p.plan(view, start_s + 30.5)), key=lambda r: r.value)


def test_planner_stays_mixed_past_the_threshold_where_mixing_is_faster() -> None:
    # 30,000 prefill tokens/s on 4 nodes: the split's 3 prefill nodes would run at
    # utilisation 1, while mixed steps carry the decodes almost for free
    mixed = [Role.MIXED] * 4
    by_load = _plan_twice(_planner(False), 3000, 200, mixed)
    assert by_load == [Role.DECODE, Role.PREFILL, Role.PREFILL, Role.PREFILL]
    p = _planner(True)
    assert _plan_twice(p, 3000, 200, mixed) == []
    load = p._load
    assert load is not None and mixed_call_s(MOE, load, 4) < split_call_s(MOE, load, 3, 1)


def test_planner_splits_where_the_split_is_predicted_faster() -> None:
    # 20,000 prefill tokens/s and 200-token outputs on 4 nodes: chunks on every node would
    # stall every decode, while 3 prefill nodes run at utilisation 0.67; a split in force
    # stays and a mixed start splits, as the utilisation rule alone would
    split = [Role.PREFILL] * 3 + [Role.DECODE]
    p = _planner(True)
    assert _plan_twice(p, 2000, 200, split) == []
    load = p._load
    assert load is not None
    assert split_call_s(MOE, load, 3, 1) < 0.9 * mixed_call_s(MOE, load, 4)
    from_mixed = _plan_twice(_planner(True), 2000, 200, [Role.MIXED] * 4)
    assert from_mixed == [Role.DECODE, Role.PREFILL, Role.PREFILL, Role.PREFILL]


def test_split_by_latency_takes_the_prefill_count_predicted_fastest() -> None:
    # 8,000 prefill and 8,000 output tokens/s on 4 nodes: balancing the demands gives 2
    # prefill nodes, predicted slower than every node mixed; 1 prefill node is predicted
    # faster than both
    mixed = [Role.MIXED] * 4
    p = _planner(True)
    assert _plan_twice(p, 800, 800, mixed) == []
    load = p._load
    assert load is not None
    assert fastest_split(MOE, load, 4)[0] == 1
    assert (
        split_call_s(MOE, load, 1, 3) < mixed_call_s(MOE, load, 4) < split_call_s(MOE, load, 2, 2)
    )
    by_latency = _plan_twice(_planner(True, split_by_latency=True), 800, 800, mixed)
    assert by_latency == [Role.DECODE, Role.DECODE, Role.DECODE, Role.PREFILL]


def test_latency_rule_never_leaves_a_split_in_force() -> None:
    # the load where mixing is predicted faster from a mixed start: a 3/1 split in force
    # stays (under a split the comparison's inputs are the split's own; leaving on them
    # flapped between the two)
    p = _planner(True)
    assert _plan_twice(p, 3000, 200, [Role.PREFILL] * 3 + [Role.DECODE]) == []
    load = p._load
    assert load is not None and mixed_call_s(MOE, load, 4) < split_call_s(MOE, load, 3, 1)


def test_a_split_past_its_capacity_is_left_where_mixed_nodes_carry_the_load() -> None:
    # 34,000 prefill tokens/s on 4 nodes of 10,000: a 3/1 split's prefill pool runs at
    # 113% (and 2/2 at 170%), past the 10% margin, so no split carries it; mixed steps
    # carry 511 prefill tokens in 52 ms, 39,000 tok/s on 4 nodes, with TPOT within 50 ms
    split = [Role.PREFILL] * 3 + [Role.DECODE]
    p = _planner(True)
    assert _plan_twice(p, 3400, 100, split) == [Role.MIXED] * 4
    offered = p._offered
    assert offered is not None
    assert split_call_s(MOE, offered, 3, 1) == math.inf
    assert mixed_tpot_s(MOE, offered, 4) < 0.05
    # without the rule the split in force stays
    assert _plan_twice(_planner(True, past_capacity=False), 3400, 100, split) == []
    # and a mixed start stays mixed
    assert _plan_twice(_planner(True), 3400, 100, [Role.MIXED] * 4) == []


def test_a_split_past_its_capacity_stays_where_mixed_nodes_would_not_carry_it() -> None:
    # the same prefill with 600-token outputs: mixed nodes would decode 6,000 tok/s
    # between chunks that fill most steps, which they cannot
    split = [Role.PREFILL] * 3 + [Role.DECODE]
    p = _planner(True)
    assert _plan_twice(p, 3400, 600, split) == []
    offered = p._offered
    assert offered is not None and mixed_tpot_s(MOE, offered, 4) == math.inf


def test_a_split_within_its_capacity_margin_stays() -> None:
    # 31,500 prefill tokens/s: the 3/1 split's prefill pool at 105%, within the margin
    # (`split_capacity_margin`, 10%), so it stays, while nodes all mixed stay mixed
    split = [Role.PREFILL] * 3 + [Role.DECODE]
    assert _plan_twice(_planner(True), 3200, 100, split) == []
    assert _plan_twice(_planner(True), 3200, 100, [Role.MIXED] * 4) == []


SPLIT_3_1 = [Role.PREFILL] * 3 + [Role.DECODE]


def test_a_split_serving_past_the_itl_target_is_left_for_mixed_nodes() -> None:
    # the load where the 3/1 split is predicted faster and stays (above), its calls
    # observed at 80 ms a token against the 50 ms target (decodes queued for batch
    # slots, which the prediction does not see); mixed TPOT is predicted within it
    p = _planner(True)
    assert _plan_twice(p, 2000, 200, SPLIT_3_1, tpot_s=0.08) == [Role.MIXED] * 4
    assert p._offered is not None and mixed_tpot_s(MOE, p._offered, 4) < 0.05
    # within the target, or with the rule off, the split stays
    assert _plan_twice(_planner(True), 2000, 200, SPLIT_3_1, tpot_s=0.04) == []
    off = EvolvingPlanner(
        SessionTable(), MOE, 16, replace(_planner(True).config, mixed_past_split_itl=False)
    )
    assert _plan_twice(off, 2000, 200, SPLIT_3_1, tpot_s=0.08) == []


def _ttft_rule(on: bool, target_s: float = 2.0) -> EvolvingPlanner:
    cfg = replace(_planner(True).config, mixed_past_split_ttft=on, ttft_target_s=target_s)
    return EvolvingPlanner(SessionTable(), MOE, 16, cfg)


def test_a_split_serving_past_the_ttft_target_is_left_for_mixed_nodes() -> None:
    # the load where the 3/1 split is predicted faster and stays, its calls within the
    # ITL target but their first tokens at 3 s against a 2 s target (a prefill queue's
    # tail, which the latency model does not see); mixed TPOT is predicted within target
    assert _plan_twice(_ttft_rule(True), 2000, 200, SPLIT_3_1, ttft_s=3.0) == [Role.MIXED] * 4
    # the rule is on by default
    assert _plan_twice(_planner(True), 2000, 200, SPLIT_3_1, ttft_s=3.0) == [Role.MIXED] * 4
    # within the target, with the rule off or a looser target, it stays
    assert _plan_twice(_ttft_rule(True), 2000, 200, SPLIT_3_1, ttft_s=1.5) == []
    assert _plan_twice(_ttft_rule(False), 2000, 200, SPLIT_3_1, ttft_s=3.0) == []
    assert _plan_twice(_ttft_rule(True, 4.0), 2000, 200, SPLIT_3_1, ttft_s=3.0) == []
    # where mixed nodes would miss the ITL target (1,200-token outputs) it stays split
    # and moves a node to decode, as without the rule
    got = _plan_twice(_ttft_rule(True), 2000, 1200, SPLIT_3_1, ttft_s=3.0)
    assert got == [Role.DECODE]


def test_the_ttft_rule_reads_the_95th_percentile_not_the_mean() -> None:
    # 5% of calls at 10 s and the rest at 0.1 s: a mean of 0.6 s, a P95 at the fast calls
    # (the 95th of 100 in rank) and so within target; 6% slow puts the P95 at 10 s
    p = _ttft_rule(True)
    for i in range(100):
        req = Request(i, (), 1000, 100)
        p.observe(RequestFinished(req, 10.0, 0, 10.0 if i < 5 else 0.1, 12.0, 0.02))
    assert p._observed_ttft_p95_s() == 0.1
    p.observe(RequestFinished(Request(100, (), 1000, 100), 10.0, 0, 10.0, 12.0, 0.02))
    assert p._observed_ttft_p95_s() == 10.0


def test_nodes_stay_mixed_for_the_capacity_window_after_leaving_a_split_on_its_itl() -> None:
    # from every node mixed this load splits (above); after the split was left on its TPOT
    # the nodes stay mixed for 120 s (`capacity_window_s`), then split again
    p = _planner(True)
    assert _plan_twice(p, 2000, 200, SPLIT_3_1, tpot_s=0.08) == [Role.MIXED] * 4
    mixed = [Role.MIXED] * 4
    # plans at 90 and 90.5 s, then at 160 and 160.5 s
    assert _plan_twice(p, 2000, 200, mixed, start_s=60.0) == []
    assert _plan_twice(p, 2000, 200, mixed, start_s=130.0) == [Role.DECODE] + [Role.PREFILL] * 3


def test_a_split_past_the_itl_target_stays_where_mixed_nodes_would_be_slower_still() -> None:
    # 1,200-token outputs: mixed TPOT is predicted at 64 ms, so a split observed at 80 ms
    # is not left; the planner moves a node to decode as it does at 20 ms
    p = _planner(True)
    assert _plan_twice(p, 2000, 1200, SPLIT_3_1, tpot_s=0.08) == [Role.DECODE]
    assert p._offered is not None and mixed_tpot_s(MOE, p._offered, 4) > 0.05
    assert _plan_twice(_planner(True), 2000, 1200, SPLIT_3_1, tpot_s=0.02) == [Role.DECODE]


def test_an_overload_neither_layout_carries_keeps_the_mixed_nodes_that_carry_more() -> None:
    # 45,000 prefill tokens/s on 4 nodes of 10,000: every node mixed carries about 87% of
    # it, the 3/1 split the demands balance 67%; without the rule the overload splits
    mixed = [Role.MIXED] * 4
    p = _planner(True, in_overload=True)
    assert _plan_twice(p, 4500, 100, mixed) == []
    load = p._load
    assert load is not None
    assert mixed_call_s(MOE, load, 4) == math.inf == split_call_s(MOE, load, 3, 1)
    mixed_share = carried_share(lambda x: mixed_call_s(MOE, x, 4), load)
    split_share = carried_share(lambda x: split_call_s(MOE, x, 3, 1), load)
    assert mixed_share > split_share
    assert p.overload_holds == 2  # both plans of the confirmation kept every node mixed
    off = _planner(True)
    without = _plan_twice(off, 4500, 100, mixed)
    assert without == [Role.DECODE, Role.PREFILL, Role.PREFILL, Role.PREFILL]
    assert off.overload_holds == 0


def test_an_overload_the_split_carries_more_of_still_splits() -> None:
    # the same 45,000 prefill tokens/s where a chunk step takes 200 ms: mixed nodes
    # prefill 2,500 tok/s each, 22% of the load on 4, where the 3/1 split carries 67%
    slow_mixing = replace(MOE, mixed_step_s_at=((1, 0.2), (64, 0.21), (256, 0.25)))
    cfg = PlannerConfig(min_dwell_s=0.0, mixed_in_overload=True)
    p = EvolvingPlanner(SessionTable(), slow_mixing, 16, cfg)
    roles = _plan_twice(p, 4500, 100, [Role.MIXED] * 4)
    assert roles == [Role.DECODE, Role.PREFILL, Role.PREFILL, Role.PREFILL]
    load = p._load
    assert load is not None
    assert mixed_call_s(slow_mixing, load, 4) == math.inf == split_call_s(slow_mixing, load, 3, 1)
    mixed_share = carried_share(lambda x: mixed_call_s(slow_mixing, x, 4), load)
    assert mixed_share < carried_share(lambda x: split_call_s(slow_mixing, x, 3, 1), load)
    assert p.overload_holds == 0


def test_a_split_in_force_past_its_capacity_is_left_where_mixed_nodes_carry_more() -> None:
    # the 45,000 prefill tokens/s above under a 3/1 split in force whose calls wait 2.5 s
    # for a first token: its prefill pool runs past its full rate (a queue that only
    # grows), mixed nodes would carry 87% of the load against its 67%; without
    # `mixed_past_split_overload` no rule leaves it (mixed TPOT is not within the target,
    # the latency rules' condition), `mixed_in_overload` alone included (it acts with
    # every node mixed); nor while the split's P95 TTFT is within the target
    on = _planner(True, split_overload=True)
    assert _plan_twice(on, 4500, 100, SPLIT_3_1, ttft_s=2.5) == [Role.MIXED] * 4
    assert on.overload_holds == 2
    off = _planner(True, in_overload=True)
    assert _plan_twice(off, 4500, 100, SPLIT_3_1, ttft_s=2.5) == []
    within = _planner(True, split_overload=True)
    assert _plan_twice(within, 4500, 100, SPLIT_3_1, ttft_s=1.9) == []
    assert within.overload_holds == 0
    assert off.overload_holds == 0
    load = off._offered
    assert load is not None and split_call_s(MOE, load, 3, 1) == math.inf


def test_a_split_in_force_past_its_capacity_stays_where_it_carries_more() -> None:
    # chunk steps of 200 ms: mixed nodes carry 22% of the same load, the split 67%
    slow_mixing = replace(MOE, mixed_step_s_at=((1, 0.2), (64, 0.21), (256, 0.25)))
    cfg = PlannerConfig(min_dwell_s=0.0, mixed_past_split_overload=True)
    p = EvolvingPlanner(SessionTable(), slow_mixing, 16, cfg)
    assert _plan_twice(p, 4500, 100, SPLIT_3_1, ttft_s=2.5) == []
    assert p.overload_holds == 0
