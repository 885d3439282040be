"""The evolving router (placement by predicted latency) and the online PD planner."""

from dataclasses import dataclass

from evinfra.core.types import AgentHints, Request, Role, SwitchMode
from evinfra.policy.base import RequestFinished
from evinfra.policy.evolving.planner import EvolvingPlanner, PlannerConfig, mixed_layout
from evinfra.policy.evolving.rates import NodeRates
from evinfra.policy.evolving.router import EvolvingRouter, RouterConfig
from evinfra.policy.evolving.sessions import SessionTable
from tests.unit.policy.dynamo_fakes import FakeNode, cached, cluster

RATES = NodeRates(
    prefill_tok_s=10_000.0,  # 1.6 ms a 16-token block
    decode_step_s_at=((1, 0.01), (64, 0.02), (256, 0.05)),
    bytes_per_block=16 * 1000,
    link_bytes_s=1e9,  # 16 us a block
    link_overhead_s=1e-3,
    max_num_seqs=256,
    kv_capacity_blocks=1000,
)


def request(num_blocks: int, extra_tokens: int = 0, rid: int = 7) -> Request:
    return Request(
        rid, tuple(range(num_blocks)), num_blocks * 16 + extra_tokens, 32, (), AgentHints("s")
    )


def test_next_turn_prefills_locally_where_its_context_lives() -> None:
    router = EvolvingRouter(SessionTable(), RATES, RouterConfig())
    view = cluster(
        FakeNode(0, Role.PREFILL, device_hashes=cached(2)),
        FakeNode(1, Role.DECODE, device_hashes=cached(200), num_running_decodes=8),
        FakeNode(2, Role.DECODE, num_running_decodes=8),
    )
    # equal decode load; 200 cached blocks on node 1 and 100 new tokens: prefill them
    # there and decode there, moving nothing
    route = router.route(request(200, extra_tokens=100), view, 0.0)
    assert (route.prefill_node, route.decode_node, route.pull_from_node) == (1, 1, None)


def test_large_new_input_goes_to_a_prefill_node_which_pulls_the_prefix() -> None:
    router = EvolvingRouter(SessionTable(), RATES, RouterConfig(max_local_prefill_tokens=64))
    view = cluster(
        FakeNode(0, Role.PREFILL),
        FakeNode(1, Role.DECODE, device_hashes=cached(200), num_running_decodes=8),
        FakeNode(2, Role.DECODE, num_running_decodes=8),
    )
    route = router.route(request(200, extra_tokens=5000), view, 0.0)
    # moving 200 blocks (~4 ms) beats recomputing 3,200 tokens (320 ms)
    assert route.prefill_node == 0 and route.pull_from_node == 1
    # and decode goes back to node 1, which holds the prefix: fewer blocks to move
    assert route.decode_node == 1
    no_pull = EvolvingRouter(SessionTable(), RATES, RouterConfig(False, 64))
    assert no_pull.route(request(200, 5000), view, 0.0).pull_from_node is None


def test_queued_prefill_node_loses_to_an_idle_one() -> None:
    router = EvolvingRouter(SessionTable(), RATES, RouterConfig(max_local_prefill_tokens=0))
    view = cluster(
        FakeNode(0, Role.PREFILL, num_waiting_prefill_tokens=50_000),
        FakeNode(1, Role.PREFILL),
        FakeNode(2, Role.DECODE),
    )
    route = router.route(request(10, extra_tokens=8), view, 0.0)
    assert (route.prefill_node, route.decode_node) == (1, 2)


def test_large_cluster_predicts_a_few_decode_nodes_and_keeps_the_least_loaded() -> None:
    """32 decode nodes: decode costs are predicted for at most 2 x max_candidates of them
    (O(candidates) per request, not O(nodes)), and the least loaded and the one holding
    the prompt are among them."""
    calls: list[int] = []

    class CountingRates(NodeRates):
        def decode_step_s(self, num_seqs: int) -> float:
            calls.append(num_seqs)
            return super().decode_step_s(num_seqs)

    rates = CountingRates(**{f: getattr(RATES, f) for f in RATES.__dataclass_fields__})
    router = EvolvingRouter(SessionTable(), rates, RouterConfig(max_local_prefill_tokens=0))
    nodes = [FakeNode(0, Role.PREFILL)]
    nodes += [FakeNode(i, Role.DECODE, num_running_decodes=50 + i) for i in range(1, 33)]
    nodes[20] = FakeNode(20, Role.DECODE, num_running_decodes=2)  # least loaded
    route = router.route(request(10, extra_tokens=8), cluster(*nodes), 0.0)
    assert len(calls) <= 2 * RouterConfig().max_candidates
    assert (route.prefill_node, route.decode_node) == (0, 20)


def planner(**kw: object) -> EvolvingPlanner:
    args: dict[str, object] = {"interval_s": 5.0, "confirm_ticks": 2, "min_dwell_s": 0.0, **kw}
    cfg = PlannerConfig(**args)  # type: ignore[arg-type]
    return EvolvingPlanner(SessionTable(), RATES, 16, cfg)


def finished(now_s: float, prompt: int, cached_tokens: int, out: int) -> RequestFinished:
    req = Request(int(now_s * 1000), (), prompt, out)
    return RequestFinished(req, now_s, cached_tokens, 0.1, 1.0, 0.02)


def test_planner_moves_nodes_to_decode_when_work_turns_decode_heavy() -> None:
    p = planner(mixed_below_utilisation=0.0)
    nodes = [FakeNode(i, Role.PREFILL if i < 3 else Role.DECODE) for i in range(4)]
    view = cluster(*nodes)
    for t in range(30):
        p.observe(finished(float(t), prompt=1000, cached_tokens=900, out=3000))
    # 100 uncached tokens/s needs no prefill node; 3000 tokens/s of decode needs several
    assert p.plan(view, 30.0) == []  # first sighting: hysteresis holds
    changes = p.plan(view, 35.0)
    assert [c.node_id for c in changes] == [0, 1]
    assert all(c.new_role is Role.DECODE and c.mode is SwitchMode.IN_PLACE for c in changes)


def test_planner_respects_dwell_time_and_scores_its_predictions() -> None:
    p = planner(min_dwell_s=60.0, mixed_below_utilisation=0.0)
    view = cluster(*[FakeNode(i, Role.DECODE) for i in range(4)])
    for t in range(30):
        p.observe(finished(float(t), prompt=50_000, cached_tokens=0, out=10))
    p.plan(view, 30.0)
    first = p.plan(view, 35.0)
    assert len(first) >= 1 and first[0].new_role is Role.PREFILL
    moved = {c.node_id for c in first}
    view2 = cluster(*[FakeNode(i, Role.PREFILL if i in moved else Role.DECODE) for i in range(4)])
    for t in range(40, 60):
        p.observe(finished(float(t), prompt=100, cached_tokens=0, out=5000))
    p.plan(view2, 60.0)
    # the switched nodes may not flip back within their dwell time
    back = p.plan(view2, 65.0)
    assert not moved & {c.node_id for c in back}
    assert len(p.prediction_log) >= 3


def test_light_load_makes_every_node_mixed_and_heavy_load_splits_again() -> None:
    p = planner()
    nodes = [FakeNode(i, Role.PREFILL if i < 2 else Role.DECODE) for i in range(4)]
    for t in range(30):
        p.observe(finished(float(t), prompt=1000, cached_tokens=900, out=300))
    p.plan(cluster(*nodes), 30.0)
    changes = p.plan(cluster(*nodes), 35.0)
    assert sorted(c.node_id for c in changes) == [0, 1, 2, 3]
    assert all(c.new_role is Role.MIXED for c in changes)
    mixed = [FakeNode(i, Role.MIXED) for i in range(4)]
    for t in range(40, 70):
        p.observe(finished(float(t), prompt=60_000, cached_tokens=0, out=6000))
    p.plan(cluster(*mixed), 70.0)
    split = p.plan(cluster(*mixed), 75.0)
    roles = sorted(c.new_role.value for c in split)
    assert len(split) == 4 and "prefill" in roles and "decode" in roles


def test_split_gives_the_node_at_the_half_to_the_smaller_pool() -> None:
    p = planner()
    # x = 16 * 12.5 / 16 = 12.5: 13/3 would load decode to 3.5/3 = 117%, 12/4 prefill 104%
    assert p.target_prefill_nodes(12.5, 3.5, 16) == 12
    # past p * n / (n - 1) = 12.8 the thirteenth prefill node is the better one
    assert p.target_prefill_nodes(12.9, 3.1, 16) == 13
    # the same rule at the other end: prefill is the smaller pool
    assert p.target_prefill_nodes(1.5, 14.5, 16) == 2
    assert p.target_prefill_nodes(1.05, 14.95, 16) == 1
    # clamped to one node each
    assert p.target_prefill_nodes(0.0, 5.0, 4) == 1
    assert p.target_prefill_nodes(5.0, 0.0, 4) == 3


def test_split_in_force_holds_near_the_boundary_and_moves_past_it() -> None:
    p = planner()
    # best is 13 (load 1.033 against 12's 1.075), within 5% of it: 12 holds
    assert p.target_prefill_nodes(12.9, 3.1, 16, current_p=12) == 12
    assert p.target_prefill_nodes(12.9, 3.1, 16, current_p=None) == 13
    # further out, 12 is 8% worse than 13 and gives way
    assert p.target_prefill_nodes(13.1, 2.9, 16, current_p=12) == 13
    no_band = planner(split_hysteresis=0.0)
    assert no_band.target_prefill_nodes(12.9, 3.1, 16, current_p=12) == 13


class _FixedDemand(EvolvingPlanner):
    """A planner told its demand, to drive plan() at chosen points."""

    need: tuple[float, float] = (0.0, 0.0)

    def demand(self, view: object, now_s: float) -> tuple[float, float]:
        return self.need


def test_plan_keeps_a_split_near_the_boundary_instead_of_flipping() -> None:
    # 16 nodes at 12/4 with demand just either side of 12.8, where rounding to the
    # nearest node asked for 13/3 every time
    cfg = PlannerConfig(mixed_below_utilisation=0.0, min_dwell_s=0.0, confirm_ticks=2)
    p = _FixedDemand(SessionTable(), RATES, 16, cfg)
    nodes = [FakeNode(i, Role.PREFILL if i < 12 else Role.DECODE) for i in range(16)]
    changes = []
    for t in range(6):
        p.need = (12.7, 3.3) if t % 2 else (12.9, 3.1)
        changes += p.plan(cluster(*nodes), 5.0 * t)
    assert changes == []
    assert {target[1] for target in p.targets} == {12}
    # demand well past the boundary still moves a node
    p.need = (13.6, 2.4)
    moved = p.plan(cluster(*nodes), 30.0) + p.plan(cluster(*nodes), 35.0)
    assert [c.new_role for c in moved] == [Role.PREFILL]


def test_remote_decode_counts_the_prefill_queued_on_a_mixed_decode_node() -> None:
    """A mixed node with few decodes but a long prefill queue: the chunks it works through
    ride in every step a request handed to it decodes in. Counted (`remote_decode_stall`),
    the request decodes where it prefills; a queue that drains while the request itself
    prefills costs nothing."""
    # 255 decode steps expected (the table's default): 3.4 s at node 0's 21 decodes, 2.6 s
    # at node 1's one
    view = cluster(
        FakeNode(0, Role.MIXED, num_running_decodes=20),
        FakeNode(1, Role.MIXED, num_waiting_prefill_tokens=20_000),  # 2 s of prefill
    )
    req = request(62, extra_tokens=8)  # 1,000 uncached tokens: 0.1 s to prefill
    plain = EvolvingRouter(SessionTable(), RATES, RouterConfig())
    route = plain.route(req, view, 0.0)
    assert (route.prefill_node, route.decode_node) == (0, 1)
    stall = EvolvingRouter(SessionTable(), RATES, RouterConfig(remote_decode_stall=True))
    route = stall.route(req, view, 0.0)
    assert (route.prefill_node, route.decode_node) == (0, 0)
    short_queue = cluster(
        FakeNode(0, Role.MIXED, num_running_decodes=20),
        FakeNode(1, Role.MIXED, num_waiting_prefill_tokens=1_000),  # 0.1 s
    )
    route = stall.route(request(312, extra_tokens=8), short_queue, 0.0)  # 0.5 s prefill
    assert (route.prefill_node, route.decode_node) == (0, 1)


def test_inflight_step_wait_sends_a_prefill_to_an_idle_prefill_node() -> None:
    """Two mixed nodes each running 100 decodes and an idle prefill node: a prefill on a
    mixed node first waits for its step in flight (half of a 24 ms step); counted, the
    prefill-only node wins, moving the KV back (2 ms) instead; not counted, it stays local."""
    view = cluster(
        FakeNode(0, Role.PREFILL),
        FakeNode(1, Role.MIXED, num_running_decodes=100),
        FakeNode(2, Role.MIXED, num_running_decodes=100),
    )
    req = request(60, extra_tokens=8)
    plain = EvolvingRouter(SessionTable(), RATES, RouterConfig()).route(req, view, 0.0)
    assert plain.prefill_node == plain.decode_node != 0
    waits = EvolvingRouter(SessionTable(), RATES, RouterConfig(inflight_step_wait=True))
    route = waits.route(req, view, 0.0)
    assert route.prefill_node == 0 and route.decode_node in (1, 2)
    idle = cluster(FakeNode(0, Role.PREFILL), FakeNode(1, Role.MIXED), FakeNode(2, Role.MIXED))
    # no decodes running: no step in flight to wait for, so the local prefill wins again
    route = waits.route(req, idle, 0.0)
    assert route.prefill_node == route.decode_node != 0


def test_mixed_prefill_fraction_keeps_some_nodes_prefill_only_under_light_load() -> None:
    assert mixed_layout(8, 0.25) == (2, 0, 6)
    assert mixed_layout(8, 0.0) == (0, 0, 8)
    assert mixed_layout(4, 1.0) == (3, 0, 1)  # at least one node left mixed
    assert mixed_layout(1, 0.5) == (0, 0, 1)
    p = planner(mixed_prefill_fraction=0.25, max_switches_per_tick=8)
    nodes = [FakeNode(i, Role.PREFILL if i < 4 else Role.DECODE) for i in range(8)]
    for t in range(30):
        p.observe(finished(float(t), prompt=1000, cached_tokens=900, out=300))
    p.plan(cluster(*nodes), 30.0)
    changes = p.plan(cluster(*nodes), 35.0)
    after = {n.node_id: n.role for n in nodes} | {c.node_id: c.new_role for c in changes}
    roles = sorted(r.value for r in after.values())
    assert roles == ["mixed"] * 6 + ["prefill"] * 2
    # the layout holds: planned again, nothing moves
    hybrid = [FakeNode(i, r) for i, r in after.items()]
    p.observe(finished(36.0, prompt=1000, cached_tokens=900, out=300))
    assert p.plan(cluster(*hybrid), 40.0) == []
    assert p.plan(cluster(*hybrid), 45.0) == []


@dataclass(frozen=True)
class PhasedCluster:
    """A cluster view that reports where each node's step in flight stands."""

    nodes: tuple[FakeNode, ...]
    remaining_s: dict[int, float]

    def step_remaining_s(self, node_id: int, now_s: float) -> float:
        return self.remaining_s[node_id]


def test_step_phase_wait_sends_a_prefill_to_the_node_whose_step_ends_first() -> None:
    """Two mixed nodes alike but for their steps in flight (20 ms left on node 0, 1 ms on
    node 1): by the half-step estimate they tie and the lower id wins; with the phase the
    prefill starts on node 1 19 ms sooner. A view without phases falls back to the
    estimate."""
    nodes = (
        FakeNode(0, Role.MIXED, num_running_decodes=64),
        FakeNode(1, Role.MIXED, num_running_decodes=64),
    )
    view = PhasedCluster(nodes, {0: 0.020, 1: 0.001})
    req = request(60, extra_tokens=8)
    half = EvolvingRouter(SessionTable(), RATES, RouterConfig(inflight_step_wait=True))
    assert half.route(req, view, 0.0).prefill_node == 0
    phase = RouterConfig(inflight_step_wait=True, step_phase_wait=True)
    route = EvolvingRouter(SessionTable(), RATES, phase).route(req, view, 0.0)
    assert (route.prefill_node, route.decode_node) == (1, 1)
    blind = EvolvingRouter(SessionTable(), RATES, phase).route(req, cluster(*nodes), 0.0)
    assert blind.prefill_node == 0
