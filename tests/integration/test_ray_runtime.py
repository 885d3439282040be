"""The `ray` runtime against the `local` one, on one shared Ray session (2 CPUs, no
dashboard, a 100 MiB object store; node actors declare half a CPU each).

- Parity: one workload (shared prefixes, a role swap in the middle) through both
  runtimes makes the same routing decisions, the same outputs, moves the same KV bytes.
- KV through the object store: a disaggregated output equals an aggregated one.
- Failure: a node actor killed mid-stream: its requests are resumed on the survivor and
  finish with the same tokens as without the failure (or, with no retries allowed, fail
  with a clear error), none hangs, roles are covered again, and integrity passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from evinfra.core.types import AgentHints, Request, Role, Route  # noqa: E402
from evinfra.policy.base import ClusterView, Router  # noqa: E402
from evinfra.serve.executors import ExecutorSpec, node_cost_model  # noqa: E402
from evinfra.serve.ray_runtime.cluster import RayCluster  # noqa: E402
from evinfra.serve.ray_runtime.options import RayOptions  # noqa: E402
from evinfra.serve.ray_runtime.recovery import depends_on  # noqa: E402
from evinfra.serve.requests import RequestHandle  # noqa: E402
from evinfra.serve.runtime import ClusterConfig, LocalCluster  # noqa: E402

TIMED = ExecutorSpec(kind="timed", model="tiny")
DISAGG = {"num_prefill_nodes": 1, "conditional_disagg": False, "planner": "none"}
NODE_OPTIONS = RayOptions(num_cpus_per_node=0.5)
TIMEOUT_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def ray_session() -> Iterator[None]:
    if ray.is_initialized():  # an earlier module's implicit session: start ours clean
        ray.shutdown()
    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
        log_to_driver=False,
    )  # fmt: skip
    yield
    ray.shutdown()


class RecordingRouter:
    """The bundle's router, remembering each decision."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.routes: list[Route] = []

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        route = self.inner.route(request, view, now_s)
        self.routes.append(route)
        return route


def prompt(seed: int, length: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % 250 for i in range(length)]


def config(system: str, options: dict[str, object], **kwargs: object) -> ClusterConfig:
    return ClusterConfig(
        TIMED, num_nodes=2, system=system, system_options=dict(options), num_blocks=128,
        check_integrity=True, cost_model=node_cost_model(TIMED, 16),
        kv_bytes_per_token=TIMED.kv_bytes_per_token, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip


async def collect(handle: RequestHandle) -> tuple[list[int], str | None]:
    tokens: list[int] = []
    error = None
    async with asyncio.timeout(TIMEOUT_S):
        async for event in handle.stream():
            tokens.extend(event.token_ids)
            error = event.error or error
    return tokens, error


async def settle(cluster: LocalCluster) -> None:
    """Wait until every live node's snapshot is idle, and three more snapshots after that
    (so cached hashes are current before the next routing decision)."""
    async with asyncio.timeout(TIMEOUT_S):
        while not all(
            not n.alive or (n.stats.num_waiting_requests == 0 and n.stats.num_running_decodes
                            == 0 and not n.sent and not n.incoming)
            for n in cluster.nodes
        ):  # fmt: skip
            await asyncio.sleep(0.01)
        # counted, not slept for 3 intervals: on a slow machine snapshots come later
        # than every `stats_interval_s` (each one replaces its node's `stats`)
        for _ in range(3):
            seen = [n.stats for n in cluster.nodes]
            while any(
                n.alive and n.stats is old for n, old in zip(cluster.nodes, seen, strict=True)
            ):
                await asyncio.sleep(0.01)


@dataclass
class Run:
    outputs: list[list[int]] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    roles: list[list[Role]] = field(default_factory=list)
    kv_bytes: int = 0
    cached_tokens: int = 0


PARITY_CASES = [
    (prompt(1, 5), 12),
    (prompt(2, 40), 20),
    (prompt(2, 40) + prompt(3, 30), 20),  # a cached prefix on both nodes
    (prompt(4, 100), 1),  # ends on the prefill node: no handoff
    (prompt(5, 33), 24),  # after the role swap: prefill on node 1, decode on node 0
    (prompt(2, 40) + prompt(6, 17), 16),
]
SWAP_AT = 4


async def run_parity(cluster: LocalCluster, cases: Sequence[tuple[list[int], int]]) -> Run:
    await cluster.start()
    recorder = RecordingRouter(cluster.bundle.router)
    cluster.bundle.router = recorder
    run = Run()
    try:
        for i, (ids, num_tokens) in enumerate(cases):
            if i == SWAP_AT:
                assert cluster.set_role(0, Role.DECODE) and cluster.set_role(1, Role.PREFILL)
                await settle(cluster)
            run.roles.append([n.role for n in cluster.nodes])
            tokens, error = await collect(cluster.generate(ids, num_tokens))
            assert error is None
            run.outputs.append(tokens)
            await settle(cluster)
        reports = await cluster.check_integrity()
        assert all(r.ok and r.is_idle for r in reports), reports
        run.routes = recorder.routes
        run.kv_bytes = cluster.metrics.num_kv_bytes_moved
        run.cached_tokens = cluster.metrics.num_cached_prompt_tokens
        return run
    finally:
        await cluster.stop()


def test_ray_runtime_matches_local_decisions_and_outputs() -> None:
    cfg = config("dynamo", DISAGG)
    local = asyncio.run(run_parity(LocalCluster(cfg), PARITY_CASES))
    on_ray = asyncio.run(run_parity(RayCluster(cfg, NODE_OPTIONS), PARITY_CASES))
    assert on_ray.outputs == local.outputs
    assert on_ray.routes == local.routes
    assert on_ray.roles == local.roles
    assert on_ray.kv_bytes == local.kv_bytes > 0
    assert on_ray.cached_tokens == local.cached_tokens > 0
    assert [len(o) for o in on_ray.outputs] == [n for _, n in PARITY_CASES]
    assert on_ray.routes[0] == Route(0, 1) and on_ray.routes[SWAP_AT] == Route(1, 0)


def test_kv_through_the_object_store_gives_the_aggregated_output() -> None:
    cases = [(prompt(7, 50), 30), (prompt(8, 64), 10)]

    async def run(cluster: RayCluster) -> tuple[list[list[int]], int]:
        await cluster.start()
        try:
            outs = [(await collect(cluster.generate(ids, n)))[0] for ids, n in cases]
            return outs, cluster.metrics.num_kv_bytes_moved
        finally:
            await cluster.stop()

    disagg, moved = asyncio.run(run(RayCluster(config("dynamo", DISAGG), NODE_OPTIONS)))
    aggregated, none_moved = asyncio.run(run(RayCluster(config("round-robin", {}), NODE_OPTIONS)))
    assert disagg == aggregated
    # every block of each prompt (the last one partial), 16 tokens of 16 bytes a block
    assert moved == sum(-(-len(ids) // 16) * 16 * 16 for ids, _ in cases)
    assert none_moved == 0


class ScriptedRouter:
    """Call i prefilled and decoded on `plan[i][0]`, pulling its prefix from `plan[i][1]`."""

    def __init__(self, plan: Sequence[tuple[int, int | None]]) -> None:
        self.plan = list(plan)
        self.num_calls = 0

    def route(self, request: Request, view: ClusterView, now_s: float) -> Route:
        node, src = self.plan[self.num_calls]
        self.num_calls += 1
        return Route(node, node, src)


PULL_CASES = [(prompt(9, 64), 12), (prompt(9, 64) + prompt(10, 20), 12)]


async def run_scripted(cluster: LocalCluster, plan: Sequence[tuple[int, int | None]]) -> Run:
    """`run_parity` over `PULL_CASES` (too few to reach its role swap) on scripted routes."""
    cluster.bundle.router = ScriptedRouter(plan)
    return await run_parity(cluster, PULL_CASES)


@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_prefix_pulled_from_the_holder_is_reused_with_the_same_output(runtime: str) -> None:
    """The second call's prefix (4 blocks) lives on node 0; placed on node 1 with a pull,
    node 1 receives those blocks and computes only the rest; the tokens equal one node
    serving both calls."""

    def make(cfg: ClusterConfig) -> LocalCluster:
        return LocalCluster(cfg) if runtime == "local" else RayCluster(cfg, NODE_OPTIONS)

    cfg = config("round-robin", {})
    pulled = asyncio.run(run_scripted(make(cfg), [(0, None), (1, 0)]))
    one_node = asyncio.run(run_scripted(make(cfg), [(0, None), (0, None)]))
    recomputed = asyncio.run(run_scripted(make(cfg), [(0, None), (1, None)]))
    assert pulled.outputs == one_node.outputs == recomputed.outputs
    assert pulled.cached_tokens == one_node.cached_tokens == 64
    assert recomputed.cached_tokens == 0
    assert pulled.kv_bytes == 4 * 16 * TIMED.kv_bytes_per_token  # 4 blocks of 16 tokens
    assert one_node.kv_bytes == recomputed.kv_bytes == 0


# -- failures ------------------------------------------------------------------------------
FAIL_CASES = [(prompt(21, 70), 200), (prompt(22, 45), 200)]


async def stream_into(handle: RequestHandle, tokens: list[int]) -> str | None:
    error = None
    async with asyncio.timeout(TIMEOUT_S):
        async for event in handle.stream():
            tokens.extend(event.token_ids)
            error = event.error or error
    return error


async def wait_streaming(streams: Sequence[list[int]], min_tokens: int) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while min(len(s) for s in streams) < min_tokens:
            await asyncio.sleep(0.005)


@dataclass
class Killed:
    refs: list[list[int]]
    """Each request's output in an undisturbed run."""
    errors: list[str | None]
    outputs: list[list[int]]
    num_dependent: int
    """Requests that needed the node when it was killed."""


async def kill_mid_stream(cluster: RayCluster, victim: int | None) -> Killed:
    """References first (no failure), then the same requests again with `victim` killed
    once both have streamed a few tokens (None: the node most of them need, for routers
    whose choice between idle nodes depends on timing). Returns references, errors,
    outputs."""
    await cluster.start()
    try:
        refs = [(await collect(cluster.generate(ids, n)))[0] for ids, n in FAIL_CASES]
        await settle(cluster)
        streams: list[list[int]] = [[] for _ in FAIL_CASES]
        tasks = [
            asyncio.create_task(stream_into(cluster.generate(ids, n), out))
            for (ids, n), out in zip(FAIL_CASES, streams, strict=True)
        ]
        await wait_streaming(streams, 5)
        assert max(len(s) for s in streams) < 150, "too late: the requests nearly finished"
        # the requests that need the victim (the routers decide; evolving may decode
        # one of them on the other node)
        if victim is None:
            victim = max(
                (0, 1), key=lambda v: sum(depends_on(r, v) for r in cluster._live.values())
            )
        num_dependent = sum(depends_on(r, victim) for r in cluster._live.values())
        ray.kill(cluster.actors[victim])
        errors = list(await asyncio.gather(*tasks))  # bounded: each stream times out
        # the survivor serves alone, roles covered, its pool and scheduler intact
        assert [n.alive for n in cluster.nodes] == [victim != 0, victim != 1]
        survivor = cluster.nodes[1 - victim]
        assert survivor.role is Role.MIXED
        assert not cluster.nodes[victim].stats.cached_hashes
        after, error = await collect(cluster.generate(FAIL_CASES[0][0], 20))
        assert error is None and after == refs[0][:20]
        await settle(cluster)
        reports = await cluster.check_integrity()
        assert [r.node_id for r in reports] == [1 - victim]
        assert all(r.ok and r.is_idle for r in reports), reports
        assert cluster.metrics.num_node_failures == 1 and cluster.num_live_requests == 0
        if cluster.planner is not None:  # the planner actor re-planned without the node
            await wait_until(lambda: cluster.num_replans == 1)
            assert cluster.planner.num_restarts == 0
        return Killed(refs, errors, streams, num_dependent)
    finally:
        await cluster.stop()


@pytest.mark.parametrize(
    ("system", "options"), [("dynamo", DISAGG), ("evolving", {"planner_interval_s": 0.5})]
)
def test_killed_decode_node_requests_resume_on_the_survivor_with_the_same_output(
    system: str, options: dict[str, object]
) -> None:
    cluster = RayCluster(config(system, options), NODE_OPTIONS)
    # dynamo's node 1 is its decode node; evolving's nodes are both mixed and its router
    # may put both requests on either, so the node they need is the one killed
    killed = asyncio.run(kill_mid_stream(cluster, victim=1 if system == "dynamo" else None))
    assert killed.errors == [None, None]
    assert killed.outputs == killed.refs
    assert cluster.num_resumed == killed.num_dependent >= 1
    if system == "dynamo":
        assert killed.num_dependent == 2


def test_killed_prefill_node_leaves_decoding_requests_alone() -> None:
    cluster = RayCluster(config("dynamo", DISAGG), NODE_OPTIONS)
    killed = asyncio.run(kill_mid_stream(cluster, victim=0))
    assert killed.errors == [None, None] and killed.outputs == killed.refs
    assert killed.num_dependent == 0
    assert cluster.num_resumed == 0 and cluster.metrics.num_retried == 0


def test_without_retries_requests_of_a_killed_node_fail_with_a_clear_error() -> None:
    cluster = RayCluster(config("dynamo", DISAGG, max_retries=0), NODE_OPTIONS)
    killed = asyncio.run(kill_mid_stream(cluster, victim=1))
    assert killed.num_dependent == 2
    for error, out, ref in zip(killed.errors, killed.outputs, killed.refs, strict=True):
        assert error is not None and error.startswith("node 1 died (ActorDiedError")
        assert 5 <= len(out) < len(ref) and out == ref[: len(out)]
    assert cluster.metrics.num_failed == 2 and cluster.num_resumed == 0


# -- the planner actor ----------------------------------------------------------------------
async def wait_until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not check():
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("max_restarts", [3, 0])
def test_killed_planner_actor_is_replaced_and_requests_still_complete(
    caplog: pytest.LogCaptureFixture, max_restarts: int
) -> None:
    """The planner runs in its own actor, fed by the frontend; killing it does not touch
    the request path, and the frontend starts a new one (seeded from its KV manager), or,
    with no restarts allowed, plans in its own process from then on."""
    cfg = config("evolving", {"planner_interval_s": 0.2}, kv_tick_s=0.1)
    options = replace(NODE_OPTIONS, max_planner_restarts=max_restarts)

    async def run(cluster: RayCluster) -> None:
        await cluster.start()
        try:
            planner = cluster.planner
            assert planner is not None and planner.actor is not None
            ref, error = await collect(cluster.generate(prompt(41, 30), 20))
            assert error is None and len(ref) == 20
            await wait_until(lambda: planner.num_plan_calls >= 3)
            events, plans = await planner.counts()
            assert events >= 3 and plans >= 1  # the arrival, the finish, KV ticks
            old = planner.actor
            ray.kill(old)
            tokens, error = await collect(cluster.generate(prompt(41, 30), 20))
            assert error is None and tokens == ref
            if max_restarts == 0:
                await wait_until(lambda: planner.in_process)
                assert planner.actor is None and planner.num_restarts == 0
            else:
                await wait_until(lambda: planner.num_restarts == 1)
                assert planner.actor is not old and not planner.in_process
                num_calls = planner.num_plan_calls
                await wait_until(lambda: planner.num_plan_calls >= num_calls + 2)
                assert (await planner.counts())[1] >= 1  # the new actor plans
            tokens, error = await collect(cluster.generate(prompt(42, 30), 20))
            assert error is None and len(tokens) == 20
            assert cluster.metrics.num_failed == 0 and cluster.metrics.num_node_failures == 0
        finally:
            await cluster.stop()

    with caplog.at_level("WARNING"):
        asyncio.run(run(RayCluster(cfg, options)))
    assert "planner actor died (ActorDiedError" in caplog.text
    if max_restarts == 0:
        assert "planning in the frontend from now on" in caplog.text
    else:
        assert "restart 1 of 3" in caplog.text


def test_a_planner_actor_ray_cannot_place_leaves_the_planning_to_the_frontend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = config("evolving", {"planner_interval_s": 0.2})
    options = replace(NODE_OPTIONS, num_cpus_for_planner=64.0, planner_ready_timeout_s=1.0)

    async def run(cluster: RayCluster) -> None:
        await cluster.start()
        try:
            assert cluster.planner is not None and cluster.planner.in_process
            tokens, error = await collect(cluster.generate(prompt(43, 30), 10))
            assert error is None and len(tokens) == 10
        finally:
            await cluster.stop()

    with caplog.at_level("WARNING"):
        asyncio.run(run(RayCluster(cfg, options)))
    assert "planner actor not ready after 1 s" in caplog.text
    assert "it declares 64 CPUs" in caplog.text


# -- the KV manager actor -------------------------------------------------------------------
async def eviction_call(cluster: RayCluster, tokens: list[int], sid: str, tool_s: float) -> int:
    """One call of a session; returns its cached prompt tokens once the KV manager actor
    has sent the actions of its finish to the node. The wait is long: a replacement actor
    answers first after its process starts, which a loaded CI machine can stretch past the
    default 10 s (a restart counted for a slow start, not a death)."""
    handle = cluster.generate(tokens, 1, hints=AgentHints(sid, expected_tool_s=tool_s))
    _, error = await collect(handle)
    assert error is None
    assert cluster.kv_remote is not None
    await cluster.kv_remote.drain(timeout_s=60.0)
    return handle.num_cached_tokens


def test_kv_manager_actor_sends_tiers_to_the_nodes_and_is_replaced_when_it_dies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The KV manager's decisions come from its actor: the tiers it sends keep the context
    of a session expected back while a session gone for ten minutes is evicted (16-block
    node, 4 + 4 cached blocks, a 12-block call). Killed, it is replaced by one seeded
    from the frontend's KV manager, which keeps deciding."""
    spec = ExecutorSpec(kind="timed", model="tiny", cost_options=(("speedup_ratio", 50.0),))
    cfg = ClusterConfig(
        spec, num_nodes=1, system="evolving", num_blocks=16, check_integrity=True,
        cost_model=node_cost_model(spec, 16),
    )  # fmt: skip

    async def run(cluster: RayCluster) -> None:
        await cluster.start()
        try:
            remote = cluster.kv_remote
            assert remote is not None and remote.actor is not None
            await eviction_call(cluster, [3] * 64, "soon", 1.0)
            await eviction_call(cluster, [4] * 64, "away", 600.0)  # freed last
            await eviction_call(cluster, [6] * 192, "filler", 1.0)
            assert await eviction_call(cluster, [3] * 80, "soon", 1.0) == 64
            events, actions, messages, tiers = await remote.counts()
            assert events >= 12 and actions >= 1 and messages >= 1 and tiers >= 4
            assert cluster.metrics.num_kv_score_messages == 0  # none from the frontend
            old = remote.actor
            ray.kill(old)
            await eviction_call(cluster, [7] * 64, "later", 600.0)  # lost with the actor
            assert remote.num_restarts == 1 and remote.actor is not old
            await eviction_call(cluster, [8] * 64, "last", 1.0)
            assert (await remote.counts())[0] >= 2  # the new actor replays events
            assert all(r.ok for r in await cluster.check_integrity())
        finally:
            await cluster.stop()

    with caplog.at_level("WARNING"):
        asyncio.run(run(RayCluster(cfg, NODE_OPTIONS)))
    assert "KV manager actor failed (ActorDiedError" in caplog.text
    assert "restart 1 of 3" in caplog.text


# -- the HTTP frontend -----------------------------------------------------------------------
def test_openai_frontend_serves_from_ray_node_actors() -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from evinfra.serve.cli import free_port
    from evinfra.serve.ray_runtime.server import build_ray_frontend
    from evinfra.serve.server import ServerThread, ServeSettings

    settings = ServeSettings(
        TIMED, num_nodes=2, system="dynamo", system_options=dict(DISAGG),
        port=free_port(), num_blocks=128, check_integrity=True,
    )  # fmt: skip
    frontend = build_ray_frontend(settings, NODE_OPTIONS)
    assert isinstance(frontend.cluster, RayCluster)
    with ServerThread(frontend, settings) as server:
        body = {"model": "tiny", "prompt": prompt(31, 40), "max_tokens": 9, "ignore_eos": True}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30.0)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 9
        health = httpx.get(f"{server.url}/health", timeout=10.0).json()
        assert health["status"] == "ready"
        assert [n["role"] for n in health["nodes"]] == ["prefill", "decode"]
        nodes = httpx.get(f"{server.url}/admin/nodes", timeout=10.0).json()["nodes"]
        assert len({n["pid"] for n in nodes}) == 2
        integrity = httpx.get(f"{server.url}/admin/integrity", timeout=10.0).json()
        assert integrity["ok"], integrity
        metrics = httpx.get(f"{server.url}/metrics", timeout=10.0).text
        moved = [ln for ln in metrics.splitlines() if ln.startswith("evinfra_kv_transfer_bytes")]
        assert moved and float(moved[0].split()[1]) == 3 * 16 * 16
