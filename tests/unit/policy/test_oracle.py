"""`oracle` (all mixed) and `oracle-split` (evolving's planner): unlimited KV, no planner
unless split, and the split variant following evolving's PD split end to end; evolving's
named presets (`evolving-ttft`, `evolving-hybrid`, `evolving-overload`) beside them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from evinfra.core.types import AgentHints, ContextEvent, Request, Role
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.registry import make_cost_model
from evinfra.policy.base import DropBlocks
from evinfra.policy.bundle import ClusterShape, make_system
from evinfra.policy.evolving.planner import EvolvingPlanner
from evinfra.policy.evolving.router import EvolvingRouter
from evinfra.sim.config import SimConfig
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation

COST = make_cost_model("roofline", NodeSpec.from_names("tiny", "h100", 1, block_size=16))
SHAPE = ClusterShape(4, 16, 1000, 0, 1024, 8192, 256, cost_model=COST)


def computer_use_16(system: str, **fields: object) -> SimConfig:
    """Computer-use agents on 16 GPUs for 150 s: evolving's planner splits the nodes."""
    data: dict[str, object] = {
        "system": system,
        "workload": "computer-use",
        "num_gpus": 16,
        "session_rate": 1.0,
        "duration_s": 150,
        "warmup_s": 30,
        "seed": 0,
    }
    return SimConfig.model_validate({**data, **fields})


def test_bundles() -> None:
    mixed = make_system("oracle", SHAPE, {})
    split = make_system("oracle-split", SHAPE, {})
    assert mixed.planner is None and split.planner is not None
    assert mixed.initial_roles == split.initial_roles == [Role.MIXED] * 4
    assert mixed.kv_capacity_scale == split.kv_capacity_scale == 100.0
    assert make_system("oracle", SHAPE, {"planner": True}).planner is not None
    with pytest.raises(ValueError, match="oracle-split"):
        make_system("oracle-split", SHAPE, {"pull_prefix": False})


def test_split_oracle_switches_roles_where_evolving_does_and_the_mixed_one_never() -> None:
    # computer-use on 16 GPUs: evolving's planner splits the nodes twice in 150 s
    def run(system: str) -> dict[str, float]:
        return run_sim(computer_use_16(system, drain_s=120)).summary

    evolving, split, mixed = run("evolving"), run("oracle-split"), run("oracle")
    assert evolving["role_switches"] > 0
    assert split["role_switches"] > 0
    assert mixed["role_switches"] == 0
    # unlimited KV on top of evolving's decisions: no worse than evolving
    assert split["mean_e2e_s"] <= evolving["mean_e2e_s"] * 1.001


def test_named_presets_set_their_options_and_options_still_override() -> None:
    def ttft_rule(name: str, options: dict[str, object]) -> bool:
        planner = make_system(name, SHAPE, options).planner
        assert isinstance(planner, EvolvingPlanner)
        return planner.config.mixed_past_split_ttft

    assert ttft_rule("evolving", {})  # on by default
    assert not ttft_rule("evolving-no-ttft", {})
    assert ttft_rule("evolving-ttft", {})
    assert not ttft_rule("evolving", {"mixed_past_split_ttft": False})
    assert ttft_rule("evolving-no-ttft", {"mixed_past_split_ttft": True})


def test_hybrid_preset_starts_with_a_quarter_of_the_nodes_prefill_only() -> None:
    bundle = make_system("evolving-hybrid", SHAPE, {})
    assert bundle.initial_roles == [Role.PREFILL] + [Role.MIXED] * 3
    assert isinstance(bundle.planner, EvolvingPlanner)
    assert bundle.planner.config.mixed_prefill_fraction == 0.25
    assert make_system("evolving", SHAPE, {}).initial_roles == [Role.MIXED] * 4
    with pytest.raises(ValueError, match="mixed_prefill_fraction"):
        make_system("evolving", SHAPE, {"mixed_prefill_fraction": 1.5})


def test_overload_preset_turns_the_planners_two_overload_rules_on() -> None:
    def rules(system: str, options: dict[str, object]) -> tuple[bool, bool]:
        planner = make_system(system, SHAPE, options).planner
        assert isinstance(planner, EvolvingPlanner)
        return planner.config.mixed_in_overload, planner.config.mixed_past_split_overload

    assert rules("evolving", {}) == (False, False)  # off by default
    assert rules("evolving-overload", {}) == (True, True)
    assert rules("evolving", {"mixed_in_overload": True}) == (True, False)
    assert rules("evolving", {"mixed_past_split_overload": True}) == (False, True)


def test_overload_preset_keeps_every_node_mixed_where_the_default_splits() -> None:
    # computer-use at 0.8 sessions/s on two 8-GPU H100 nodes of Llama-3-70B: past what
    # either layout is predicted to carry, the default splits the two nodes, the preset
    # keeps both mixed and counts the plans it held (`planner_overload_holds`)
    def run(system: str) -> dict[str, Any]:
        cfg = SimConfig.model_validate(
            {
                "system": system,
                "workload": "computer-use",
                "model": "llama-3-70b",
                "gpu": "h100",
                "num_gpus": 16,
                "session_rate": 0.8,
                "duration_s": 150,
                "warmup_s": 30,
                "seed": 0,
            }
        )
        return run_sim(cfg).summary

    default, overload = run("evolving"), run("evolving-overload")
    assert default["planner_overload_holds"] == 0
    assert default["role_switches"] > 0
    assert overload["planner_overload_holds"] > 0
    assert overload["role_switches"] == 0
    assert overload["mean_e2e_s"] != default["mean_e2e_s"]
    assert run("dynamo")["planner_overload_holds"] is None  # no such rule


def test_the_floor_frees_blocks_no_call_can_read_and_keeps_every_result() -> None:
    # computer-use drops old screenshots from the context every turn: the floor frees
    # those blocks where the session ran (`drop_dead`, default) and every call's record
    # is what keeping them gives
    def run(drop_dead: bool) -> tuple[list[tuple[object, ...]], int]:
        cfg = computer_use_16("oracle-split", drain_s=60, system_options={"drop_dead": drop_dead})
        sims: list[Simulation] = []
        result = run_sim(cfg, prepare=sims.append)
        records = sorted(dataclasses.astuple(r) for r in result.metrics.records.values())
        return records, sum(n.sched.pool.num_cached_blocks for n in sims[0].nodes)

    kept, num_kept = run(False)
    freed, num_left = run(True)
    assert freed == kept and len(kept) > 100
    assert num_left < 0.5 * num_kept


def test_the_floor_drops_only_what_hints_say_is_dead() -> None:
    # with hints a compaction's dead tail is freed where the session ran; inferred from
    # prefixes (a trace without hints) nothing is, and `drop_dead: false` keeps all
    def turns(options: dict[str, object], hinted: bool) -> list[object]:
        bundle = make_system("oracle", SHAPE, options)
        kv, router = bundle.kv_manager, bundle.router
        assert isinstance(router, EvolvingRouter)  # shares the session table with kv
        first = Request(1, (1, 2, 3, 4), 64, 8, (5,), AgentHints("s") if hinted else None)
        kv.on_arrival(first, 0.0)
        router.table.note_route(1, (2, 3))
        kv.on_finish(first, 3, 1.0)
        event = AgentHints("s", context_event=ContextEvent.COMPACT) if hinted else None
        return list(kv.on_arrival(Request(2, (1, 2, 9), 48, 8, (), event), 2.0))

    assert turns({}, hinted=True) == [DropBlocks(2, (3, 4, 5)), DropBlocks(3, (3, 4, 5))]
    assert turns({}, hinted=False) == []
    assert turns({"drop_dead": False}, hinted=True) == []
