"""`evinfra serve` on the ray runtime: the same FastAPI frontend over a `RayCluster`.

    python -m evinfra.serve.ray_runtime serve --address auto --num-gpus-per-node 8 ...

takes every `evinfra serve` flag plus the Ray ones below. (`evinfra serve --runtime ray`
is the same command once the main CLI forwards to `add_ray_flags` / `ray_options`.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from evinfra.serve.frontend import Frontend
from evinfra.serve.ray_runtime.cluster import RayCluster, RayOptions
from evinfra.serve.ray_runtime.transport import TRANSPORTS
from evinfra.serve.server import ServeSettings, build_frontend

MIB = 1024 * 1024


def build_ray_frontend(settings: ServeSettings, options: RayOptions) -> Frontend:
    """The frontend `build_frontend` makes, over node actors instead of processes."""
    local = build_frontend(settings)  # the cluster config and model the local runtime uses
    return Frontend(RayCluster(local.cluster.config, options), local.model)


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="join this Ray cluster (auto, HOST:PORT, ray://...)")
    p.add_argument("--num-cpus-per-node", type=float, default=1.0)
    p.add_argument("--num-gpus-per-node", type=float, default=0.0)
    p.add_argument("--node-resource", action="append", metavar="NAME=AMOUNT", default=[])
    p.add_argument("--kv-transport", choices=TRANSPORTS, default="object-store")
    p.add_argument("--ray-num-cpus", type=int, default=2, help="a new local Ray: its CPUs")
    p.add_argument("--object-store-mb", type=int, default=100, help="a new local Ray")


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
        local_num_cpus=args.ray_num_cpus,
        object_store_memory_bytes=args.object_store_mb * MIB,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from evinfra.serve.cli import _add_server_flags, serve_settings
    from evinfra.serve.server import run_server

    parser = argparse.ArgumentParser(prog="python -m evinfra.serve.ray_runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve on Ray node actors (OpenAI API)")
    _add_server_flags(p, default_executor="torch")
    add_ray_flags(p)
    args = parser.parse_args(argv)
    try:
        settings = serve_settings(args)
        frontend = build_ray_frontend(settings, ray_options(args))
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"evinfra serve: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"evinfra serve: {frontend.model.name} on {settings.num_nodes} Ray node actors"
        f" ({frontend.cluster.system}, {settings.executor.kind}) at"
        f" http://{settings.host}:{settings.port}",
        file=sys.stderr,
        flush=True,
    )
    run_server(frontend, settings)
    return 0
