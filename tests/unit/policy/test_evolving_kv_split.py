"""Evolving under KV pressure on a small cluster: the planner keeps nodes mixed when the
running decodes' KV would not fit on a split's decode nodes, and the router's decode
step times never fall with batch size (a bent cost model would pile work on one node)."""

from evinfra.core.types import Role
from evinfra.policy.evolving.bundle import monotone_decode
from evinfra.policy.evolving.rates import NodeRates
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable
from tests.unit.policy.dynamo_fakes import FakeNode, cluster
from tests.unit.policy.test_evolving_router_planner import RATES, finished, planner, request

# Dynamo's mocker polynomial probed past its fitted range: 34 ms at 4 sequences, then the
# 1 ms floor at 16
BENT = NodeRates(
    prefill_tok_s=10_000.0,
    decode_step_s_at=((1, 0.018), (2, 0.026), (4, 0.034), (8, 0.011), (16, 0.001)),
    bytes_per_block=16 * 1000,
    link_bytes_s=1e9,
    link_overhead_s=1e-3,
    max_num_seqs=64,
    kv_capacity_blocks=1000,
)


def test_monotone_decode_never_lets_a_bigger_batch_step_faster() -> None:
    fixed = monotone_decode(BENT)
    assert fixed.decode_step_s_at == ((1, 0.018), (2, 0.026), (4, 0.034), (8, 0.034), (16, 0.034))
    assert fixed.prefill_tok_s == BENT.prefill_tok_s
    assert monotone_decode(RATES) == RATES  # already monotone: unchanged


def test_router_does_not_pile_decodes_on_the_busiest_node_with_bent_rates() -> None:
    # both nodes hold nothing of the prompt; node 0 runs 7 decodes, node 1 runs 2
    view = cluster(
        FakeNode(0, Role.MIXED, num_running_decodes=7),
        FakeNode(1, Role.MIXED, num_running_decodes=2),
    )
    bent = EvolvingRouter(SessionTable(), BENT, RouterConfig())
    assert bent.route(request(10), view, 0.0).decode_node == 0  # the bug, read literally
    fixed = EvolvingRouter(SessionTable(), monotone_decode(BENT), RouterConfig())
    assert fixed.route(request(10), view, 0.0).decode_node == 1


def _loaded_planner_view(decode_blocks: int) -> tuple[list[FakeNode], object]:
    p = planner()
    nodes = [
        FakeNode(i, Role.MIXED, num_running_decodes=6, num_decode_blocks=decode_blocks)
        for i in range(2)
    ]
    for t in range(30):
        # heavy uncached prefill and decode: past the mixed threshold
        p.observe(finished(float(t), prompt=8000, cached_tokens=0, out=400))
    return nodes, p


def test_planner_splits_when_decode_kv_fits_on_the_decode_node() -> None:
    nodes, p = _loaded_planner_view(decode_blocks=200)  # 400 of 850 usable on one node
    p.plan(cluster(*nodes), 30.0)  # type: ignore[attr-defined]
    changes = p.plan(cluster(*nodes), 35.0)  # type: ignore[attr-defined]
    assert sorted(c.new_role.value for c in changes) == ["decode", "prefill"]


def test_planner_stays_mixed_when_decode_kv_would_not_fit_on_the_decode_node() -> None:
    nodes, p = _loaded_planner_view(decode_blocks=600)  # 1,200 blocks > 850 on one node
    assert p.plan(cluster(*nodes), 30.0) == []  # type: ignore[attr-defined]
    assert p.plan(cluster(*nodes), 35.0) == []  # type: ignore[attr-defined]


def test_planner_stays_mixed_when_prefill_work_rounds_to_no_node() -> None:
    # decode-heavy load past the mixed threshold, little uncached prefill: a split would
    # dedicate one of the two nodes to a sliver of prefill work
    p = planner()
    nodes = [FakeNode(i, Role.MIXED, num_running_decodes=40) for i in range(2)]
    for t in range(30):
        p.observe(finished(float(t), prompt=1000, cached_tokens=900, out=9000))
    assert p.plan(cluster(*nodes), 30.0) == []
    assert p.plan(cluster(*nodes), 35.0) == []
    # the same load with mixing switched off (threshold 0) still splits
    off = planner(mixed_below_utilisation=0.0)
    for t in range(30):
        off.observe(finished(float(t), prompt=1000, cached_tokens=900, out=9000))
    off.plan(cluster(*nodes), 30.0)
    assert {c.new_role for c in off.plan(cluster(*nodes), 35.0)} == {Role.PREFILL, Role.DECODE}
