"""The servers do not move prefixes between workers, so their routers plan no pulls."""

from evinfra.policy.bundle import ClusterShape, make_system
from evinfra.policy.evolving.router import EvolvingRouter
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.runtime import ClusterConfig, LocalCluster


def _router_pulls(bundle_router: object) -> bool:
    assert isinstance(bundle_router, EvolvingRouter)
    return bundle_router.config.pull_prefix


def test_server_bundle_plans_no_prefix_pulls_and_the_simulator_shape_does() -> None:
    spec = ExecutorSpec(kind="timed", model="tiny")
    cost = node_cost_model(spec, 16)
    cluster = LocalCluster(ClusterConfig(spec, 2, "evolving", cost_model=cost))
    # (not started: no process is spawned)
    assert not _router_pulls(cluster.bundle.router)
    shape = ClusterShape(2, 16, 1000, 0, 1024, 2048, 64, cost_model=cost)
    assert _router_pulls(make_system("evolving", shape, {}).router)
    assert not _router_pulls(make_system("evolving-no-pull", shape, {}).router)
