"""`max_candidates`: how many prefill placements the evolving router predicts per request
in a cluster with more nodes than that (the rest are not looked at)."""

import pytest

from evinfra.policy.evolving.router import EvolvingRouter
from evinfra.sim.config import load_config
from evinfra.sim.runner import build_simulation

NODE = {"model": "tiny", "gpu": "h200", "num_gpus": 6, "gpus_per_node": 1,
        "duration_s": 30.0, "warmup_s": 0.0, "workload": "coding", "concurrency": 12,
        "seed": 0, "system": "evolving"}  # fmt: skip


def run_with(options: dict[str, object]) -> tuple[EvolvingRouter, int]:
    """The router after a short run, and how many requests it routed."""
    sim, _ = build_simulation(load_config(None, {**NODE, "system_options": options}))
    sim.run()
    router = sim.bundle.router
    assert isinstance(router, EvolvingRouter)
    return router, len(sim.metrics.records)


def test_max_candidates_is_an_option_and_limits_the_placements_predicted() -> None:
    predicted: list[int] = []
    evaluate = EvolvingRouter._evaluate

    def counting(self, node, *args):  # type: ignore[no-untyped-def]
        predicted.append(node.node_id)
        return evaluate(self, node, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EvolvingRouter, "_evaluate", counting)
        default, num_routes = run_with({})
        num_default = len(predicted)
        predicted.clear()
        few, num_few_routes = run_with({"max_candidates": 2})
    assert default.config.max_candidates == 8 and few.config.max_candidates == 2
    # six nodes, all predicted by default; two and the session's home with 2
    assert num_default > 3 * num_routes > 0
    assert 0 < len(predicted) <= 3 * num_few_routes


def test_a_bad_max_candidates_is_named() -> None:
    with pytest.raises(ValueError, match="max_candidates"):
        build_simulation(load_config(None, {**NODE, "system_options": {"max_candidates": 0}}))
