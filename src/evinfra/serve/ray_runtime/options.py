"""Where and how the ray runtime places its node actors, and the CLI flags that say so.
Imports no Ray: `evinfra serve` adds these flags whether Ray is installed or not."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from evinfra.serve.ray_runtime.transport import TRANSPORTS

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RayOptions:
    address: str | None = None
    """A Ray cluster to join ("auto", "ray://host:10001", "host:6379"); None: the Ray
    session this process already has, else a new local one."""
    num_cpus_per_node: float = 1.0
    """CPUs a node actor declares (what its executor really uses)."""
    num_gpus_per_node: float = 0.0
    """GPUs a node actor holds: one actor per accelerator group (a TP group on one host)."""
    node_resources: dict[str, float] = field(default_factory=dict)
    """Custom resources each node actor needs (pin nodes to a host type or rack)."""
    transport: str = "object-store"
    local_num_cpus: int = 2
    """A new local Ray session: CPUs it may use."""
    object_store_memory_bytes: int = 100 * MIB
    """A new local Ray session: its object store (KV in flight lives there)."""
    num_cpus_for_planner: float = 0.0
    """CPUs the planner actor declares. It uses a few milliseconds every few seconds;
    declaring none lets Ray place it even where node actors hold every CPU."""
    planner_ready_timeout_s: float = 30.0
    """Start-up: a planner actor not answering by then is given up (the frontend plans)."""
    max_planner_restarts: int = 3
    """Planner actor deaths the frontend replaces; after that it plans itself. The KV
    manager actor gets the same CPUs and restarts."""
    kv_manager_actor: bool = True
    """The KV manager's decisions in an actor (False: in the frontend, as `local`)."""
    poll_timeout_s: float = 0.5
    stop_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"KV transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.num_cpus_per_node < 0 or self.num_gpus_per_node < 0:
            raise ValueError("CPUs and GPUs per node must be >= 0")
        if self.num_cpus_for_planner < 0 or self.max_planner_restarts < 0:
            raise ValueError("the planner actor's CPUs and restarts must be >= 0")


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ray runtime")
    g.add_argument("--address", help="join this Ray cluster (auto, HOST:PORT, ray://...)")
    g.add_argument("--num-cpus-per-node", type=float, default=1.0)
    g.add_argument("--num-gpus-per-node", type=float, default=0.0)
    g.add_argument("--node-resource", action="append", metavar="NAME=AMOUNT", default=[])
    g.add_argument("--kv-transport", choices=TRANSPORTS, default="object-store")
    g.add_argument("--num-cpus-for-planner", type=float, default=0.0, help="the planner actor")
    g.add_argument("--max-planner-restarts", type=int, default=3, help="and KV manager's")
    g.add_argument(
        "--no-kv-manager-actor",
        dest="kv_manager_actor",
        action="store_false",
        help="KV manager decisions in the frontend rather than in an actor",
    )
    g.add_argument("--ray-num-cpus", type=int, default=2, help="a new local Ray: its CPUs")
    g.add_argument("--object-store-mb", type=int, default=100, help="a new local Ray")


def ray_options(args: argparse.Namespace) -> RayOptions:
    resources = {}
    for item in args.node_resource:
        name, sep, amount = item.partition("=")
        if not sep:
            raise ValueError(f"--node-resource wants NAME=AMOUNT, got {item!r}")
        resources[name] = float(amount)
    return RayOptions(
        address=args.address,
        num_cpus_per_node=args.num_cpus_per_node,
        num_gpus_per_node=args.num_gpus_per_node,
        node_resources=resources,
        transport=args.kv_transport,
        num_cpus_for_planner=args.num_cpus_for_planner,
        max_planner_restarts=args.max_planner_restarts,
        kv_manager_actor=args.kv_manager_actor,
        local_num_cpus=args.ray_num_cpus,
        object_store_memory_bytes=args.object_store_mb * MIB,
    )
