"""KV transfers inside an NVLink domain use NVLink, across domains the NICs: the domain
is the GPU's (an NVL72 rack, an 8-GPU HGX board), in the links and in the routers' view."""

import pytest

from evinfra.policy.evolving.router import EvolvingRouter
from evinfra.sim.config import SimConfig
from evinfra.sim.runner import (
    build_simulation,
    expected_transfer_time_s,
    link_domain,
    same_domain_share,
)

GIB = 1 << 30


def config(gpu: str, model: str, num_gpus: int) -> SimConfig:
    return SimConfig(
        system="evolving",
        workload="coding",
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        session_rate=1.0,
        duration_s=20.0,
        warmup_s=5.0,
    )


def test_domains_and_the_share_of_node_pairs_inside_one() -> None:
    # GB300 NVL72: nodes of 8 GPUs, 9 to a rack; HGX: each node its own domain
    assert [link_domain(i, 8, 72) for i in (0, 8, 9, 17, 18, 31)] == [0, 0, 1, 1, 2, 3]
    assert same_domain_share(8, 8, 72) == 1.0
    assert same_domain_share(32, 8, 72) == pytest.approx((3 * 9 * 8 + 5 * 4) / (32 * 31))
    assert same_domain_share(4, 8, 8) == 0.0
    assert same_domain_share(1, 8, 8) == 1.0


@pytest.mark.parametrize(
    ("gpu", "model", "num_gpus", "inside"),
    [("h100", "llama-3-70b", 16, False), ("gb300", "glm-5", 64, True)],
)
def test_links_and_the_routers_estimate_use_the_gpus_domain(
    gpu: str, model: str, num_gpus: int, inside: bool
) -> None:
    # an HGX node is its own NVLink domain: node to node is over the NICs; 64 GB300 GPUs
    # are one NVL72 rack
    cfg = config(gpu, model, num_gpus)
    sim, spec = build_simulation(cfg, None)
    wire_s = spec.transfer_time_s(GIB, same_rack=inside)
    assert wire_s != spec.transfer_time_s(GIB, same_rack=not inside)
    assert sim.links.schedule(0.0, 0, 1, GIB, 100) == pytest.approx(wire_s)
    assert expected_transfer_time_s(cfg, spec)(GIB) == pytest.approx(wire_s)


def test_across_racks_the_routers_estimate_weighs_the_node_pairs() -> None:
    # 256 GB300 GPUs: 32 nodes in 4 racks, so most node pairs are across racks
    cfg = config("gb300", "glm-5", 256)
    sim, spec = build_simulation(cfg, None)
    inside = spec.transfer_time_s(GIB, same_rack=True)
    across = spec.transfer_time_s(GIB, same_rack=False)
    assert across > inside
    assert sim.links.schedule(0.0, 0, 8, GIB, 100) == pytest.approx(inside)
    assert sim.links.schedule(0.0, 9, 31, GIB, 100) == pytest.approx(across)
    share = same_domain_share(32, 8, 72)
    estimate = expected_transfer_time_s(cfg, spec)
    assert estimate(GIB) == pytest.approx(share * inside + (1 - share) * across)
    router = sim.bundle.router
    assert isinstance(router, EvolvingRouter)
    # the router's link rate comes from that estimate (a 1 GiB probe)
    assert router.rates.link_bytes_s == pytest.approx(GIB / estimate(GIB))
