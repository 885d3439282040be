"""The planner actor's replica, without Ray: seeded with a copy of the frontend's KV
manager and planner (pickled as Ray pickles actor arguments) and fed the control events
in the frontend's order, it makes exactly the role changes the in-process planner makes,
on compact snapshots instead of the frontend's node states."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

cloudpickle = pytest.importorskip("ray.cloudpickle")
pytestmark = pytest.mark.ray

from evinfra.core.types import AgentHints, Request, Role, RoleChange  # noqa: E402
from evinfra.policy.base import RequestArrived, RequestFinished  # noqa: E402
from evinfra.policy.bundle import ClusterShape, SystemBundle, make_system  # noqa: E402
from evinfra.serve.executors import ExecutorSpec, node_cost_model  # noqa: E402
from evinfra.serve.protocol import NodeStats  # noqa: E402
from evinfra.serve.ray_runtime.control import (  # noqa: E402
    Arrived,
    ClusterSnapshot,
    ControlEvent,
    ControlReplica,
    Finished,
    NodeSnapshot,
    Ticked,
)
from evinfra.serve.view import ClusterState, NodeState  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def no_ray_session_left() -> Iterator[None]:
    """A handle's restart path may start Ray implicitly (`ray.kill` on a dead actor): end
    it with the module, so a later module's own `ray.init` does not find one running."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


BLOCK = 16
NUM_NODES = 4
SHAPE = ClusterShape(
    num_nodes=NUM_NODES, block_size=BLOCK, num_device_blocks_per_node=4096,
    num_host_blocks_per_node=0, kv_bytes_per_token=1024, max_num_batched_tokens=2048,
    max_num_seqs=64, cost_model=node_cost_model(ExecutorSpec(kind="timed", model="tiny"), BLOCK),
)  # fmt: skip
# the planner's light-load rule (every node mixed below half load) is off so that this
# decode-heavy minute makes it switch roles both ways
OPTIONS: dict[str, object] = {
    "planner_interval_s": 1.0,
    "min_dwell_s": 0.0,
    "mixed_below_utilisation": 0.0,
}


def make_bundle() -> SystemBundle:
    bundle = make_system("evolving", SHAPE, dict(OPTIONS))
    for node_id in range(NUM_NODES):  # as the runtime does when it builds the workers
        bundle.kv_manager.eviction_for(node_id)
    return bundle


def node_state(node_id: int, role: Role, waiting_tokens: int, decodes: int) -> NodeState:
    stats = NodeStats(
        node_id, role, True, BLOCK, 4096, 4096 - 40 * decodes, 40 * decodes, waiting_tokens,
        waiting_tokens // 2000, decodes, 40 * decodes, 640 * decodes, frozenset({1, 2, 3}),
        0, 0, 0, 0, 0, 0, 0, 0.0,
    )  # fmt: skip
    return NodeState(node_id, stats)


@dataclass
class Scenario:
    """A minute of agent traffic: sessions that prefill long prompts, wait on tools
    (hinted), come back; the load swings from prefill-heavy to decode-heavy."""

    steps: list[tuple[list[ControlEvent], list[tuple[int, int]]]] = field(default_factory=list)
    """Per second: the events, then each node's (waiting prefill tokens, decodes)."""


def scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    out = Scenario()
    rid = 0
    pending: list[tuple[float, Request]] = []
    for second in range(60):
        now = float(second)
        events: list[ControlEvent] = []
        for _ in range(rng.randint(2, 6)):
            rid += 1
            session = f"s{rng.randint(0, 15)}"
            num_blocks = rng.randint(20, 200)
            hints = AgentHints(session, expected_tool_s=rng.uniform(2.0, 12.0))
            request = Request(rid, tuple(range(rid * 1000, rid * 1000 + num_blocks)),
                              num_blocks * BLOCK, rng.randint(50, 400), hints=hints)  # fmt: skip
            events.append(Arrived(RequestArrived(request, now + 0.1)))
            pending.append((now + rng.uniform(0.5, 4.0), request))
        for done_at, request in [p for p in pending if p[0] <= now]:
            pending.remove((done_at, request))
            finished = RequestFinished(request, done_at, rng.randint(0, 64), 0.2, 2.0, 0.02)
            events.append(Finished(rng.randrange(NUM_NODES), finished))
        heavy_prefill = second < 30
        loads = [
            (rng.randint(20000, 60000) if heavy_prefill else 0,
             rng.randint(0, 4) if heavy_prefill else rng.randint(40, 64))
            for _ in range(NUM_NODES)
        ]  # fmt: skip
        out.steps.append((events, loads))
    return out


def run_in_process(bundle: SystemBundle, sc: Scenario) -> list[list[RoleChange]]:
    """What the local runtime does: hooks, observations, a KV tick, then a plan."""
    planner = bundle.planner
    assert planner is not None
    roles = list(bundle.initial_roles)
    plans = []
    for second, (events, loads) in enumerate(sc.steps):
        for event in events:
            if isinstance(event, Arrived):
                a = event.request_arrived
                bundle.kv_manager.on_arrival(a.request, a.now_s)
                planner.observe(a)
            elif isinstance(event, Finished):
                f = event.request_finished
                bundle.kv_manager.on_finish(f.request, event.node_id, f.now_s)
                planner.observe(f)
        view = ClusterState([node_state(i, roles[i], *loads[i]) for i in range(NUM_NODES)])
        bundle.kv_manager.on_tick(view, second + 0.5)
        changes = planner.plan(view, second + 0.9)
        for c in changes:
            roles[c.node_id] = c.new_role
        plans.append(changes)
    return plans


def run_replica(bundle: SystemBundle, sc: Scenario) -> list[list[RoleChange]]:
    """What the ray runtime does: the events shipped with each tick, a snapshot planned."""
    assert bundle.planner is not None
    replica: ControlReplica = cloudpickle.loads(
        cloudpickle.dumps(ControlReplica(bundle.kv_manager, bundle.planner))
    )
    roles = list(bundle.initial_roles)
    plans = []
    for second, (events, loads) in enumerate(sc.steps):
        view = ClusterState([node_state(i, roles[i], *loads[i]) for i in range(NUM_NODES)])
        replica.replay([*events, Ticked(ClusterSnapshot.of(view), second + 0.5)])
        changes = replica.plan([], ClusterSnapshot.of(view), second + 0.9)
        for c in changes:
            roles[c.node_id] = c.new_role
        plans.append(changes)
    return plans


def test_replica_plans_exactly_what_the_in_process_planner_plans() -> None:
    sc = scenario(seed=5)
    local = run_in_process(make_bundle(), sc)
    remote = run_replica(make_bundle(), sc)
    assert remote == local
    switches = [c for plan in local for c in plan]
    # the scenario does exercise the planner: it splits for prefill, then for decode
    assert {c.new_role for c in switches} >= {Role.PREFILL, Role.DECODE}


def test_replica_without_the_kv_manager_replay_forecasts_differently() -> None:
    """The session table the KV manager keeps feeds the planner's forecast: the replica
    must replay the KV manager's hooks, not only the planner's observations."""
    sc = scenario(seed=5)
    bundle = make_bundle()
    replica = ControlReplica(bundle.kv_manager, bundle.planner)  # type: ignore[arg-type]
    local = make_bundle()
    for events, _ in sc.steps[:20]:
        replica.replay(events)
        for event in events:
            if isinstance(event, Arrived):
                local.planner.observe(event.request_arrived)  # type: ignore[union-attr]
            elif isinstance(event, Finished):
                local.planner.observe(event.request_finished)  # type: ignore[union-attr]
    with_table = replica.planner._forecast_prefill_tok_s(19.5)  # type: ignore[attr-defined]
    without = local.planner._forecast_prefill_tok_s(19.5)  # type: ignore[union-attr]
    assert with_table > 0.0 == without
    assert replica.counts() == (sum(len(e) for e, _ in sc.steps[:20]), 0)


def test_a_snapshot_carries_every_load_figure_and_no_index() -> None:
    state = node_state(2, Role.DECODE, 3000, 5)
    state.incoming[9] = 7  # a hand-off on its way: the view counts it, so must the snapshot
    snap = NodeSnapshot.of(state)
    for name in NodeSnapshot.__slots__:
        if name != "match_prefix":
            assert getattr(snap, name) == getattr(state, name), name
    assert state.match_prefix([1, 2, 3]).num_blocks == 3
    assert snap.match_prefix([1, 2, 3]).num_blocks == 0
    assert len(cloudpickle.dumps(snap)) < 400


def test_a_second_failure_of_an_actor_already_replaced_restarts_nothing() -> None:
    """A plan and a replay in flight on the same dead actor both fail: one death, one
    restart (it used to restart twice, killing the fresh actor). No Ray session needed:
    the failures come in by hand and the restart is recorded instead of spawned."""
    from evinfra.serve.ray_runtime.planner_actor import RemotePlanner

    started: list[int] = []

    class Recording(RemotePlanner):
        def start(self) -> None:
            started.append(1)
            self.actor = f"actor-{len(started)}"

    remote = Recording(make_bundle(), max_restarts=3)
    remote.start()
    dead = remote.actor
    remote._on_death(RuntimeError("gone"), dead)  # the replay noticed it
    assert remote.num_restarts == 1 and remote.actor == "actor-2"
    remote._on_death(RuntimeError("gone"), dead)  # the plan call on it failed too
    assert remote.num_restarts == 1 and remote.actor == "actor-2"
    remote._on_death(RuntimeError("gone"), remote.actor)  # the new one dies: restart
    assert remote.num_restarts == 2 and remote.actor == "actor-3"


def test_kv_replica_decides_exactly_the_actions_of_the_frontends_kv_manager() -> None:
    """The KV manager actor's replica, seeded with a copy of the servers' evolving KV
    manager (tiers published to the nodes) and fed arrivals, routes, finishes and ticks in
    the frontend's order, returns the very actions the frontend's own manager returns."""
    from dataclasses import replace

    from evinfra.policy.base import KVAction, ScoreBlocks
    from evinfra.serve.ray_runtime.control import KVEvent, KVReplica, Routed

    shape = replace(SHAPE, eviction_in_process=False)
    local = make_system("evolving", shape, {}).kv_manager
    replica = KVReplica(
        cloudpickle.loads(cloudpickle.dumps(make_system("evolving", shape, {}).kv_manager))
    )
    rng = random.Random(3)

    def away(request: Request) -> Request:
        """A few sessions announce long tools: their blocks are marked away."""
        assert request.hints is not None
        if request.hints.session_id not in ("s0", "s1", "s2"):
            return request
        return replace(request, hints=replace(request.hints, expected_tool_s=120.0))

    expected: list[KVAction] = []
    got: list[KVAction] = []
    for second, (events, loads) in enumerate(scenario(seed=3).steps):
        shipped: list[KVEvent] = []
        for event in events:
            if isinstance(event, Arrived):
                a = replace(event.request_arrived, request=away(event.request_arrived.request))
                event = Arrived(a)
                expected += local.on_arrival(a.request, a.now_s)
                node = rng.randrange(NUM_NODES)
                local.table.note_route(a.request.request_id, (node, node))  # type: ignore[attr-defined]
                shipped += [event, Routed(a.request.request_id, (node, node))]
            elif isinstance(event, Finished):
                f = replace(event.request_finished, request=away(event.request_finished.request))
                event = Finished(event.node_id, f)
                expected += local.on_finish(f.request, event.node_id, f.now_s)
                shipped.append(event)
        view = ClusterState([node_state(i, Role.MIXED, *loads[i]) for i in range(NUM_NODES)])
        expected += local.on_tick(view, second + 0.5)
        got += replica.apply([*shipped, Ticked(ClusterSnapshot.of(view), second + 0.5)])
    assert got == expected
    assert sum(isinstance(a, ScoreBlocks) for a in got) > 10  # sessions went overdue
    assert replica.num_actions == len(got)
