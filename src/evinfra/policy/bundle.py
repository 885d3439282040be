"""A system is a bundle of policies on the same core; bundles are built by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from evinfra.core.types import Role, SwitchMode
from evinfra.costmodel.base import CostModel
from evinfra.policy.base import KVManager, Planner, Router


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """What a bundle factory needs to know about the cluster it will run."""

    num_nodes: int
    block_size: int
    num_device_blocks_per_node: int
    num_host_blocks_per_node: int
    kv_bytes_per_token: int
    max_num_batched_tokens: int
    max_num_seqs: int
    cost_model: CostModel | None = None
    """The nodes' step-time model, for policies that predict latency (None: unknown)."""
    transfer_time_s: Callable[[int], float] | None = None
    """Seconds to move a number of KV bytes between two nodes (None: unknown)."""
    can_pull_prefix: bool = True
    """Whether the runtime moves a cached prefix from one node to another ahead of a
    prefill (the simulator does; the servers do not yet): routers plan pulls only then."""
    eviction_in_process: bool = True
    """Whether each node's eviction strategy runs in the KV manager's process (the
    simulator). False (the servers): it is pickled into a node worker, so a strategy that
    reads the manager's state must be told its scores through `ScoreBlocks` actions."""


@dataclass(slots=True)
class SystemBundle:
    name: str
    router: Router
    kv_manager: KVManager
    initial_roles: list[Role]
    planner: Planner | None = None
    switch_mode: SwitchMode = SwitchMode.IN_PLACE
    cold_start_s: float = 0.0
    """Time a restarted worker takes before it serves (SwitchMode.RESTART only)."""
    switch_cost_s: float = 0.002
    """Modelled time of an in-place role switch (a scheduler setting changes)."""
    host_tier: bool = False
    write_through_offload: bool = False
    migrate_on_switch: bool = False
    """On decode→prefill, move running decodes to another decode node instead of
    finishing them where they are."""
    kv_capacity_scale: float = 1.0
    """Multiplies each node's device KV blocks (the oracle's unlimited KV)."""
    options: dict[str, object] = field(default_factory=dict)


BundleFactory = Callable[[ClusterShape, dict[str, object]], SystemBundle]

_REGISTRY: dict[str, BundleFactory] = {}


def register(name: str) -> Callable[[BundleFactory], BundleFactory]:
    def deco(factory: BundleFactory) -> BundleFactory:
        if name in _REGISTRY:
            raise ValueError(f"system {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_systems() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_system(
    name: str, shape: ClusterShape, options: dict[str, object] | None = None
) -> SystemBundle:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](shape, dict(options or {}))


def _load_builtin() -> None:
    # importing the modules registers their bundles
    import evinfra.policy.systems  # noqa: F401
