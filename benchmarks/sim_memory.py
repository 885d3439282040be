"""Where a simulation's memory goes: the live heap at the end of a run, split by the part of
the simulator that holds it, beside the process's resident set.

    .venv/bin/python benchmarks/sim_memory.py --gpus 64 --duration-s 1200
    .venv/bin/python benchmarks/sim_memory.py --system dynamo --gpus 32 --duration-s 600

Same load as `sim_speed.py` (a fixed session rate per GPU; coding, Kimi-K2 on GB300, seed 0,
no drain). After the run every part's objects are walked (`gc.get_referents`) and sized
(`sys.getsizeof`); a walk does not enter another part's roots (a pool's listener into the
block index, an eviction queue's scorer into the session table), and an object reached
from two parts is charged to the first walked. The parts the simulator cannot run without
come first (the KV pools, the cluster's block index, the policies, the schedulers, the
work in flight), then what only feeds the metrics (the per-call records, the samples, the
set of blocks ever computed behind `num_recomputed_tokens`), so a metrics row is about
what dropping it would free. `RSS` is the process's resident set after the walk; what the
walk does not find there is the allocator's free lists, the interpreter and the imported
modules. The walk takes about 20 CPU seconds per GiB walked and lifts the peak by about
half as much again (its own record of what it has seen). One run per process: a second
run's resident set would carry the first's freed memory.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType

from sim_speed import add_load_args, load_config, peak_rss_mib

from evinfra.sim.config import ConfigError
from evinfra.sim.runner import run_sim
from evinfra.sim.simulation import Simulation

MIB = float(1 << 20)


class HeapWalk:
    """Sizes the objects reachable from given roots, each object once over all walks."""

    def __init__(self, hub: object) -> None:
        # the interpreter's own objects are nobody's part: every module and its namespace
        # (a lambda in the event queue reaches its module's globals), seen from the start
        modules = [m for m in list(sys.modules.values()) if m is not None]
        self._seen: set[int] = {id(m) for m in modules} | {id(vars(m)) for m in modules}
        # the simulation object itself is not entered from a part (its callbacks and views
        # point back to it, and through it to every other part): its own fields are the
        # last part's roots
        self._seen.add(id(hub))

    def size(self, roots: Iterable[object], boundary: set[int]) -> tuple[int, int]:
        """(bytes, objects) reachable from `roots` and not reached by an earlier call, not
        entering `boundary` (other parts' roots: a listener or a scoring callback that
        points into another part stops there)."""
        seen = self._seen
        total_bytes = 0
        num_objects = 0
        stack = [r for r in roots if id(r) not in seen]
        own = {id(r) for r in stack}
        while stack:
            obj = stack.pop()
            key = id(obj)
            if key in seen or isinstance(obj, (type, CodeType)):
                continue  # classes and code belong to the interpreter, not to a run
            if key in boundary and key not in own:
                continue
            seen.add(key)
            total_bytes += sys.getsizeof(obj)
            num_objects += 1
            stack.extend(r for r in gc.get_referents(obj) if id(r) not in seen)
        return total_bytes, num_objects


def parts(sim: Simulation) -> list[tuple[str, list[object]]]:
    """(label, roots) in walk order: what the simulator needs first, metrics last."""
    pools = [node.sched.pool for node in sim.nodes]
    bundle = sim.bundle
    metrics = sim.metrics
    return [
        (
            "KV pools: device tables (hash, refs, index)",
            [x for p in pools for x in (p._ref, p._hash, p._index, p._free)],
        ),
        ("KV pools: host tiers", [p.host for p in pools]),
        ("KV pools: eviction queues", [p.eviction for p in pools]),
        (
            "KV pools: remembered matches and freed runs",
            [x for p in pools for x in (p._memos, p._freed_runs)],
        ),
        ("KV pools: the rest", list(pools)),
        (
            "cluster block index",
            # its tables too: the pools' listeners point into them (it reads the host
            # tiers' own tables, charged to the tiers above)
            [sim.block_index, *(vars(sim.block_index)[k] for k in ("_device", "_masks"))],
        ),
        # its session table too: evolving's eviction scorers are closures over it
        (
            "KV manager (session table)",
            [bundle.kv_manager, getattr(bundle.kv_manager, "table", None)],
        ),
        ("router and planner", [bundle.router, bundle.planner]),
        ("schedulers and decode batches", [node.sched for node in sim.nodes]),
        ("calls in flight", [sim._inflight, sim._held, sim._awaiting_decode_step]),
        ("event queue (with the sessions' runs)", [sim.events]),
        ("workload generator", [sim.workload, sim._arrivals]),
        ("links", [sim.links]),
        ("per-call records (metrics)", [metrics.records]),
        ("samples and session times (metrics)", [metrics]),
        (
            "blocks ever computed (metrics: recomputed tokens)",
            [sim._ever_computed, sim._recorded_prompt],
        ),
        ("the rest of the simulation", list(vars(sim).values())),
    ]


def rss_mib() -> float:
    """Resident set now (Linux /proc), or the peak where /proc is missing."""
    statm = Path("/proc/self/statm")
    if statm.is_file():
        pages = int(statm.read_text().split()[1])
        return pages * resource.getpagesize() / MIB
    return peak_rss_mib()


@dataclass(frozen=True, slots=True)
class Part:
    label: str
    num_bytes: int
    num_objects: int


@dataclass(frozen=True, slots=True)
class Measurement:
    label: str
    num_calls: int
    cpu_s: float
    parts: list[Part]
    walk_cpu_s: float
    rss_mib: float
    peak_rss_mib: float

    @property
    def walked_bytes(self) -> int:
        return sum(p.num_bytes for p in self.parts)


def walk_parts(sim: Simulation) -> list[Part]:
    """Every part of `sim`, sized in `parts`' order."""
    walk = HeapWalk(hub=sim)
    split = parts(sim)
    boundary = {id(r) for _, roots in split for r in roots}
    return [Part(label, *walk.size(roots, boundary)) for label, roots in split]


def measure(system: str, num_gpus: int, args: argparse.Namespace) -> Measurement:
    cfg = load_config(system, num_gpus, args.duration_s, 0.0, args)
    built: list[Simulation] = []
    cpu_start_s = time.process_time()
    run_sim(cfg, prepare=built.append)
    cpu_s = time.process_time() - cpu_start_s
    (sim,) = built
    num_calls = len(sim.metrics.records)
    label = f"{system}, {num_gpus} GPUs, {args.duration_s:g} simulated s"
    print(
        f"{label}: {num_calls:,} calls, {cpu_s:.1f} CPU s; walking the heap...",
        file=sys.stderr,
        flush=True,
    )
    walk_start_s = time.process_time()
    sized = walk_parts(sim)
    walk_cpu_s = time.process_time() - walk_start_s
    return Measurement(label, num_calls, cpu_s, sized, walk_cpu_s, rss_mib(), peak_rss_mib())


def report(m: Measurement) -> str:
    """The table and the resident-set line, as printed."""
    total = m.walked_bytes
    per_call = max(m.num_calls, 1)
    lines = [
        f"{m.label}, {m.num_calls:,} calls",
        "| part | objects | MiB | share | bytes / call |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for p in m.parts:
        lines.append(
            f"| {p.label} | {p.num_objects:,} | {p.num_bytes / MIB:,.1f} |"
            f" {p.num_bytes / max(total, 1):.1%} | {p.num_bytes / per_call:,.0f} |"
        )
    lines.append(f"| **walked** | | **{total / MIB:,.1f}** | 100% | {total / per_call:,.0f} |")
    lines.append("")
    lines.append(
        f"RSS after the walk {m.rss_mib:,.0f} MiB (peak {m.peak_rss_mib:,.0f}); not found by"
        f" the walk {m.rss_mib - total / MIB:,.0f} MiB; the run took {m.cpu_s:.0f} CPU s,"
        f" the walk {m.walk_cpu_s:.0f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--system", default="evolving")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--duration-s", type=float, default=1200.0)
    add_load_args(p)
    args = p.parse_args(argv)
    if args.duration_s <= 0:
        p.error(f"--duration-s must be positive, got {args.duration_s:g}")
    if args.gpus <= 0:
        p.error(f"--gpus must be positive, got {args.gpus}")
    try:
        m = measure(args.system, args.gpus, args)
    except ConfigError as exc:
        p.error(str(exc))
    print(report(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
