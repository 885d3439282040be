"""The simulator's `kv_allocation` reaches every node's scheduler; a bad name is refused
with the field named."""

from __future__ import annotations

import pytest

from evinfra.core.allocation import Allocation
from evinfra.sim.config import ConfigError, load_config
from evinfra.sim.runner import build_simulation

SMALL = {"model": "tiny", "gpu": "h200", "num_gpus": 2, "gpus_per_node": 1, "duration_s": 5.0,
         "warmup_s": 0.0}  # fmt: skip


@pytest.mark.parametrize("name", ["prompt", "chunk", "chunk-when-prompt-fits"])
def test_every_node_schedules_with_the_configured_allocation(name: str) -> None:
    sim, _ = build_simulation(load_config(None, {**SMALL, "kv_allocation": name}))
    assert [n.sched.config.allocation for n in sim.nodes] == [Allocation(name)] * 2


def test_the_default_is_prompt_and_a_bad_name_is_refused() -> None:
    assert load_config(None, SMALL).kv_allocation == "prompt"
    with pytest.raises(ConfigError, match="kv_allocation"):
        load_config(None, {**SMALL, "kv_allocation": "lazy"})
