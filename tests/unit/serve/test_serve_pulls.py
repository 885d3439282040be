"""The servers move prefixes between workers (`Submit.pull_from`), so their evolving router
plans prefix pulls, as the simulator's does; `evolving-no-pull` plans none."""

from evinfra.policy.bundle import ClusterShape, make_system
from evinfra.policy.evolving.router import EvolvingRouter
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.runtime import ClusterConfig, LocalCluster


def _router_pulls(bundle_router: object) -> bool:
    assert isinstance(bundle_router, EvolvingRouter)
    return bundle_router.config.pull_prefix


def test_server_bundle_plans_prefix_pulls_like_the_simulator() -> None:
    spec = ExecutorSpec(kind="timed", model="tiny")
    cost = node_cost_model(spec, 16)
    cluster = LocalCluster(ClusterConfig(spec, 2, "evolving", cost_model=cost))
    # (not started: no process is spawned)
    assert _router_pulls(cluster.bundle.router)
    no_pull = LocalCluster(ClusterConfig(spec, 2, "evolving-no-pull", cost_model=cost))
    assert not _router_pulls(no_pull.bundle.router)
    shape = ClusterShape(2, 16, 1000, 0, 1024, 2048, 64, cost_model=cost)
    assert _router_pulls(make_system("evolving", shape, {}).router)
