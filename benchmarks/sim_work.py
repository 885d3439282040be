"""What the simulated cluster does per call, against cluster size: the KV it moves, evicts
and offloads, beside the simulator's CPU time per call.

    .venv/bin/python benchmarks/sim_work.py --systems evolving dynamo --gpus 32 256
    .venv/bin/python benchmarks/sim_work.py --gpus 64 --duration-s 400 --kv-capacity-scale 0.1

`sim_speed.py` says how the simulator's cost grows with the cluster; this says how much of
that growth is the simulated system's own work. Every evicted, offloaded or moved block is
work the simulator must do block by block, so a cluster whose calls move more KV costs more
per call to simulate even when each block costs the same. Same load as `sim_speed.py`
(a fixed session rate per GPU, coding, Kimi-K2 on GB300, seed 0); one process per row keeps
the CPU time of one run from another's garbage.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from sim_speed import add_load_args, load_config

from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation


def measure(system: str, num_gpus: int, args: argparse.Namespace) -> dict[str, float]:
    cfg = load_config(system, num_gpus, args.duration_s, 0.0, args)
    built: list[Simulation] = []
    cpu_start_s = time.process_time()
    run_sim(cfg, prepare=built.append)  # as sim_speed.py runs it (no cyclic GC inside)
    cpu_s = time.process_time() - cpu_start_s
    (sim,) = built
    num_calls = max(len(sim.metrics.records), 1)
    pools = [node.sched.pool for node in sim.nodes]
    router = sim.bundle.router
    local = getattr(router, "num_local_prefills", None)
    return {
        "cpu_s": cpu_s,
        "calls": float(num_calls),
        "cpu_us_per_call": 1e6 * cpu_s / num_calls,
        "link_mb_per_call": sim.links.num_bytes_moved / num_calls / 1e6,
        "evicted_per_call": sum(p.num_evicted_blocks for p in pools) / num_calls,
        "offloaded_per_call": sum(p.host.num_offloaded for p in pools) / num_calls,
        "pulls_per_call": sim.metrics.num_prefix_pulls / num_calls,
        "local_prefills_per_call": float("nan") if local is None else local / num_calls,
    }


def _or_dash(value: float) -> str:
    """A rate, or "-" where the system does not count it (NaN)."""
    return "-" if math.isnan(value) else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["evolving", "dynamo"])
    p.add_argument("--gpus", nargs="+", type=int, default=[32, 64, 256])
    p.add_argument("--duration-s", type=float, default=600.0)
    add_load_args(p)
    args = p.parse_args(argv)
    if args.duration_s <= 0:
        p.error(f"--duration-s must be positive, got {args.duration_s:g}")
    print(
        f"workload {args.workload}, model {args.model} on {args.gpu},"
        f" {args.rate_per_gpu:g} sessions/s per GPU, {args.duration_s:g} simulated s,"
        f" blocks of {args.block_size} tokens, KV capacity x{args.kv_capacity_scale:g}"
    )
    header = (
        "| system | GPUs | calls | CPU s | CPU us / call | KV moved MB / call"
        " | blocks evicted / call | host offloads / call | prefix pulls / call"
        " | local prefills / call |"
    )
    print(header)
    print("| --- |" + " ---: |" * (header.count("|") - 2))
    for system in args.systems:
        for num_gpus in args.gpus:
            m = measure(system, num_gpus, args)
            print(
                f"| {system} | {num_gpus} | {m['calls']:.0f} | {m['cpu_s']:.1f}"
                f" | {m['cpu_us_per_call']:.0f} | {m['link_mb_per_call']:.1f}"
                f" | {m['evicted_per_call']:.1f} | {m['offloaded_per_call']:.1f}"
                f" | {m['pulls_per_call']:.2f} | {_or_dash(m['local_prefills_per_call'])} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
