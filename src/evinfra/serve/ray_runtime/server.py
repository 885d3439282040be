"""`evinfra serve` on the ray runtime: the same FastAPI frontend over a `RayCluster`.

    python -m evinfra.serve.ray_runtime serve --address auto --num-gpus-per-node 8 ...

takes every `evinfra serve` flag plus the Ray ones (`options.add_ray_flags`); it is the
same command as `evinfra serve --runtime ray`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from evinfra.serve.frontend import Frontend
from evinfra.serve.ray_runtime.cluster import RayCluster
from evinfra.serve.ray_runtime.options import RayOptions, add_ray_flags, ray_options
from evinfra.serve.server import ServeSettings, build_frontend


def build_ray_frontend(settings: ServeSettings, options: RayOptions) -> Frontend:
    """The frontend `build_frontend` makes, over node actors instead of processes."""
    local = build_frontend(settings)  # the cluster config and model the local runtime uses
    return Frontend(RayCluster(local.cluster.config, options), local.model)


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
