"""Simulator speed: events per second and simulated seconds per wall second against cluster
size, under agent load that grows with the cluster (a fixed session rate per GPU).

    .venv/bin/python benchmarks/sim_speed.py                       # 32..256 GPUs, 120 s each
    .venv/bin/python benchmarks/sim_speed.py --gpus 64 --duration-s 60 120 240

The cost should grow about linearly with simulated time and with cluster size: the last
column (wall microseconds per simulated GPU-second) should stay roughly flat across rows,
and `1 h of 256 GPUs` extrapolates one simulated hour at that size from the CPU time
(the wall time of an otherwise idle machine; wall time on a shared one is inflated).

Agent sessions last minutes (a coding session: 45 calls over about 13 minutes), so a run
shorter than about 15 simulated minutes has not reached its steady state: fewer calls in
flight, shorter contexts and no KV pressure yet. Extrapolating an hour from such a run
underestimates it; time a full hour (`--duration-s 3600`) on a smaller cluster, or a
long run at the size, and read `CPU s` directly. `--progress-every-s 60` prints, to
stderr, the CPU time, peak memory and how full the nodes' KV is at each simulated minute,
so a run that is stopped early still shows how the cost of each simulated minute grows.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from evinfra.sim.config import SimConfig
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (`ru_maxrss` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _CpuTrail:
    """Prints CPU seconds, events, peak memory and how full the nodes' KV is (device
    blocks holding content, host copies) each time the simulated clock passes another
    `every_sim_s` (to stderr, so the table on stdout stays clean): the cost of a
    simulated second grows while the pools fill."""

    def __init__(self, label: str, every_sim_s: float, cpu_start_s: float) -> None:
        self.label = label
        self.every_sim_s = every_sim_s
        self.cpu_start_s = cpu_start_s
        self.next_sim_s = every_sim_s
        self.last_cpu_s = 0.0
        self.sim: Simulation | None = None

    def attach(self, sim: Simulation) -> None:
        self.sim = sim

    def _kv_fill(self) -> str:
        if self.sim is None:
            return ""
        pools = [node.sched.pool for node in self.sim.nodes]
        device = sum(p.num_cached_blocks for p in pools) / sum(p.num_device_blocks for p in pools)
        host_capacity = sum(p.host.capacity_blocks for p in pools)
        host = sum(len(p.host) for p in pools) / host_capacity if host_capacity else 0.0
        return f", device KV {device:.0%} cached, host KV {host:.0%} full"

    def __call__(self, sim_s: float, num_events: int) -> None:
        if sim_s < self.next_sim_s:
            return
        cpu_s = time.process_time() - self.cpu_start_s
        rss_gib = peak_rss_mib() / 1024
        print(
            f"{self.label}: sim {sim_s:.0f} s, CPU {cpu_s:.1f} s"
            f" (+{cpu_s - self.last_cpu_s:.1f} s), {num_events} events,"
            f" peak RSS {rss_gib:.1f} GiB{self._kv_fill()}",
            file=sys.stderr,
            flush=True,
        )
        self.last_cpu_s = cpu_s
        while self.next_sim_s <= sim_s:
            self.next_sim_s += self.every_sim_s


def add_load_args(p: argparse.ArgumentParser) -> None:
    """The load and cluster options this script shares with `sim_work.py`."""
    p.add_argument(
        "--rate-per-gpu", type=float, default=1 / 16, help="sessions/s per GPU (default 1/16)"
    )
    p.add_argument("--workload", default="coding")
    p.add_argument("--model", default="kimi-k2")
    p.add_argument("--gpu", default="gb300")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=64, help="tokens per KV block (default 64)")
    p.add_argument(
        "--kv-capacity-scale",
        type=float,
        default=1.0,
        help="multiplies each node's device KV (below 1: KV pressure, eviction)",
    )


def load_config(
    system: str, num_gpus: int, duration_s: float, drain_s: float, args: argparse.Namespace
) -> SimConfig:
    """One run at `add_load_args`' load: a fixed session rate per GPU."""
    return SimConfig(
        system=system,
        workload=args.workload,
        model=args.model,
        gpu=args.gpu,
        num_gpus=num_gpus,
        session_rate=args.rate_per_gpu * num_gpus,
        duration_s=duration_s,
        warmup_s=min(30.0, duration_s / 4),
        drain_s=drain_s,
        seed=args.seed,
        block_size=args.block_size,
        kv_capacity_scale=args.kv_capacity_scale,
    )


def measure(
    system: str, num_gpus: int, duration_s: float, args: argparse.Namespace
) -> dict[str, float]:
    cfg = load_config(system, num_gpus, duration_s, args.drain_s, args)
    start = time.perf_counter()
    cpu_start = time.process_time()
    trail = None
    if args.progress_every_s > 0:
        trail = _CpuTrail(f"{system} {num_gpus} GPUs", args.progress_every_s, cpu_start)
    result = run_sim(cfg, progress=trail, prepare=None if trail is None else trail.attach)
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    # the process's peak so far: run one size per process (as the table's rows do when
    # given one --gpus value) to read it per run
    max_rss_gib = peak_rss_mib() / 1024
    s = result.summary
    sim_s = float(s["sim_end_s"])
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "events": float(s["sim_events"]),
        "events_per_s": float(s["sim_events"]) / wall_s,
        "sim_s_per_wall_s": sim_s / wall_s,
        "us_per_gpu_s": 1e6 * wall_s / (sim_s * num_gpus),
        # CPU time: what the wall time would be on an otherwise idle machine
        "cpu_us_per_gpu_s": 1e6 * cpu_s / (sim_s * num_gpus),
        "requests": float(s["num_requests"]),
        "unfinished": float(s["num_unfinished"]),
        "p95_ttft_s": float(s["p95_ttft_s"]),
        "mean_e2e_s": float(s["mean_e2e_s"]),
        "kv_hit_rate": float(s["kv_hit_rate"]),
        "max_rss_gib": max_rss_gib,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", nargs="+", default=["dynamo", "evolving"])
    p.add_argument("--gpus", nargs="+", type=int, default=[32, 64, 128, 256])
    p.add_argument("--duration-s", nargs="+", type=float, default=[120.0])
    p.add_argument("--drain-s", type=float, default=60.0)
    add_load_args(p)
    p.add_argument(
        "--progress-every-s",
        type=float,
        default=0.0,
        help="print CPU time, peak memory and KV fill to stderr every this many simulated seconds",
    )
    args = p.parse_args(argv)
    print(
        f"workload {args.workload}, model {args.model} on {args.gpu},"
        f" {args.rate_per_gpu:g} sessions/s per GPU, drain {args.drain_s:g} s,"
        f" blocks of {args.block_size} tokens, KV capacity x{args.kv_capacity_scale:g}"
    )
    header = (
        "| system | GPUs | sim s | wall s | events | events/s | sim s / wall s"
        " | wall us / GPU-s | CPU s | CPU us / GPU-s | 1 h of 256 GPUs (CPU)"
        " | requests | unfinished | mean e2e s | P95 TTFT s | KV hit | peak RSS GiB |"
    )
    print(header)
    print("| --- |" + " ---: |" * (header.count("|") - 2))
    for system in args.systems:
        for num_gpus in args.gpus:
            for duration_s in args.duration_s:
                m = measure(system, num_gpus, duration_s, args)
                # extrapolated from CPU time, which a busy shared machine does not inflate
                hour_256_min = m["cpu_us_per_gpu_s"] * 1e-6 * 3600 * 256 / 60
                print(
                    f"| {system} | {num_gpus} | {duration_s:g} | {m['wall_s']:.1f}"
                    f" | {m['events']:.0f} | {m['events_per_s']:.0f}"
                    f" | {m['sim_s_per_wall_s']:.2f} | {m['us_per_gpu_s']:.0f}"
                    f" | {m['cpu_s']:.1f} | {m['cpu_us_per_gpu_s']:.0f}"
                    f" | {hour_256_min:.1f} min | {m['requests']:.0f} | {m['unfinished']:.0f}"
                    f" | {m['mean_e2e_s']:.3f} | {m['p95_ttft_s']:.3f} | {m['kv_hit_rate']:.3f}"
                    f" | {m['max_rss_gib']:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
