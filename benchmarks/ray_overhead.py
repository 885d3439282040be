"""The ray runtime's costs: KV transfer throughput through Ray's object store, and the
per-request overhead of the ray runtime against `local` on the same workload.

    .venv/bin/python benchmarks/ray_overhead.py [--num-requests 60] [--out ray.json]

1. Transport: a sender actor publishes a KV payload (`ObjectStoreKVTransport.publish`:
   `ray.put`), a receiver actor fetches it (`ray.get`), for payload sizes from 64 KiB to
   32 MiB; the same with the inline transport (the bytes inside the actor call's
   arguments), the shape of the local runtime's pipes. Reports MB/s of the fetch alone
   and of the whole hop (publish, descriptor to the receiver, fetch).
2. Workload: the same sequential requests through `LocalCluster` and `RayCluster` (timed
   executor at near-zero step time, so the runtime's own cost shows; 2 nodes; the
   `dynamo` bundle disaggregated, so every request moves KV, and `round-robin`
   aggregated, and `evolving` with its planner in an actor and without a planner).
   Reports TTFT and end-to-end latency, and ray minus local.
3. Control plane: the planner actor's calls for `evolving` on 32 nodes: shipping 1,000
   control events (`replay`) and planning on a snapshot of every node (`plan`), with
   their sizes.

Runs in one local Ray session (2 CPUs, 100 MiB object store, no dashboard): about a
minute on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import statistics
import sys
import time
from typing import Any

import numpy as np
import ray

from evinfra.core.types import AgentHints, Request, Role
from evinfra.policy.base import RequestArrived, RequestFinished
from evinfra.policy.bundle import ClusterShape, make_system
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.protocol import KVPayload
from evinfra.serve.ray_runtime.cluster import RayCluster
from evinfra.serve.ray_runtime.control import (
    Arrived,
    ClusterSnapshot,
    ControlEvent,
    Finished,
    NodeSnapshot,
)
from evinfra.serve.ray_runtime.options import RayOptions
from evinfra.serve.ray_runtime.planner_actor import RemotePlanner
from evinfra.serve.ray_runtime.transport import (
    InlineKVTransport,
    KVDescriptor,
    KVTransport,
    ObjectStoreKVTransport,
)
from evinfra.serve.runtime import ClusterConfig, LocalCluster

KIB = 1024
MIB = 1024 * KIB
SIZES = (64 * KIB, 1 * MIB, 8 * MIB, 32 * MIB)
NEAR_ZERO_COST = (("speedup_ratio", 1e6), ("decode_speedup_ratio", 1.0))
SYSTEMS: dict[str, tuple[str, dict[str, object]]] = {
    "disaggregated": (
        "dynamo",
        {"num_prefill_nodes": 1, "conditional_disagg": False, "planner": "none"},
    ),
    "aggregated": ("round-robin", {}),
    # the planner in its actor: per request the frontend only buffers two events
    "evolving (planner actor)": ("evolving", {"planner_interval_s": 0.5}),
    "evolving (no planner)": ("evolving", {"planner": False}),
}
CONTROL_NODES = 32
CONTROL_EVENTS = 1000


# -- 1. transport ------------------------------------------------------------------------
class Sender:
    def __init__(self, transport: KVTransport) -> None:
        self.transport = transport

    def publish(self, num_bytes: int, rid: int) -> KVDescriptor:
        data = np.random.default_rng(rid).integers(0, 255, num_bytes, dtype=np.uint8)
        return self.transport.publish(KVPayload(0, rid, 0, data.tobytes()))


class Receiver:
    def __init__(self, transport: KVTransport) -> None:
        self.transport = transport

    def fetch(self, descriptors: list[KVDescriptor]) -> tuple[float, int]:
        start = time.perf_counter()
        payload = self.transport.fetch(descriptors[0])
        elapsed = time.perf_counter() - start
        return elapsed, len(payload.data or b"")


def transport_rows(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for transport in (ObjectStoreKVTransport(), InlineKVTransport()):
        sender: Any = ray.remote(num_cpus=0.25)(Sender).remote(transport)
        receiver: Any = ray.remote(num_cpus=0.25)(Receiver).remote(transport)
        for size in SIZES:
            fetch_s, hop_s = [], []
            for rep in range(repeats + 1):
                descriptor = ray.get(sender.publish.remote(size, rep))
                start = time.perf_counter()
                # the descriptor is wrapped in a list so Ray passes the ObjectRef as is
                elapsed, num_bytes = ray.get(receiver.fetch.remote([descriptor]))
                hop = time.perf_counter() - start
                assert num_bytes == size
                if rep:  # the first of each size warms up
                    fetch_s.append(elapsed)
                    hop_s.append(hop)
            rows.append(
                {
                    "transport": transport.name,
                    "num_bytes": size,
                    # inline: the bytes came with the call, there is nothing to fetch
                    "fetch_mb_s": (
                        size / statistics.median(fetch_s) / 1e6
                        if transport.name != "inline"
                        else None
                    ),
                    "hop_mb_s": size / statistics.median(hop_s) / 1e6,
                    "hop_ms": 1000 * statistics.median(hop_s),
                }
            )
        ray.kill(sender)
        ray.kill(receiver)
    return rows


# -- 2. workload -------------------------------------------------------------------------
def prompt(i: int, length: int) -> list[int]:
    return [3 + (i * 131 + j * 17) % 250 for j in range(length)]


async def run_workload(
    cluster: LocalCluster, num: int, length: int, max_tokens: int
) -> dict[str, list[float]]:
    await cluster.start()
    ttft_s, e2e_s = [], []
    try:
        for i in range(num):
            start = time.perf_counter()
            first = None
            async for event in cluster.generate(prompt(i, length), max_tokens).stream():
                if event.error:
                    raise RuntimeError(event.error)
                if event.token_ids and first is None:
                    first = time.perf_counter() - start
            ttft_s.append(first or 0.0)
            e2e_s.append(time.perf_counter() - start)
        return {"ttft_s": ttft_s, "e2e_s": e2e_s, "kv_bytes": [cluster.metrics.num_kv_bytes_moved]}
    finally:
        await cluster.stop()


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "mean_ms": 1000 * statistics.fmean(ordered),
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    }


def workload_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    spec = ExecutorSpec(
        kind="timed", model="tiny", cost_options=NEAR_ZERO_COST,
        kv_bytes_per_token=args.kv_bytes_per_token,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    for label, (system, options) in SYSTEMS.items():
        cfg = ClusterConfig(
            spec, num_nodes=2, system=system, system_options=dict(options),
            cost_model=node_cost_model(spec, 16), kv_tick_s=0.2,
        )  # fmt: skip
        clusters: dict[str, LocalCluster] = {
            "local": LocalCluster(cfg),
            "ray": RayCluster(cfg, RayOptions(num_cpus_per_node=0.5)),
        }
        for runtime, cluster in clusters.items():
            n = args.num_requests + args.warmup
            out = asyncio.run(run_workload(cluster, n, args.prompt_tokens, args.max_tokens))
            rows.append(
                {
                    "workload": label,
                    "runtime": runtime,
                    "ttft": _ms(out["ttft_s"][args.warmup :]),
                    "e2e": _ms(out["e2e_s"][args.warmup :]),
                    "kv_bytes_moved": out["kv_bytes"][0],
                }
            )
        local, on_ray = rows[-2], rows[-1]
        on_ray["overhead_e2e_ms"] = on_ray["e2e"]["p50_ms"] - local["e2e"]["p50_ms"]
        on_ray["overhead_ttft_ms"] = on_ray["ttft"]["p50_ms"] - local["ttft"]["p50_ms"]
    return rows


# -- 3. control plane --------------------------------------------------------------------
def control_rows(repeats: int) -> dict[str, Any]:
    """The planner actor's two calls for the `evolving` bundle on 32 nodes: shipping a KV
    tick's worth of events (`replay`), and a plan on a snapshot of every node (`plan`)."""
    spec = ExecutorSpec(kind="timed", model="tiny")
    shape = ClusterShape(
        num_nodes=CONTROL_NODES, block_size=16, num_device_blocks_per_node=4096,
        num_host_blocks_per_node=0, kv_bytes_per_token=1024, max_num_batched_tokens=2048,
        max_num_seqs=64, cost_model=node_cost_model(spec, 16),
    )  # fmt: skip
    bundle = make_system("evolving", shape, {})
    remote = RemotePlanner(bundle)
    remote.start()
    snapshot = ClusterSnapshot(
        tuple(NodeSnapshot(i, Role.MIXED, True, 16, 4096, 3000, 1096, 4000, 2, 20, 900,
                           14000) for i in range(CONTROL_NODES))
    )  # fmt: skip
    events: list[ControlEvent] = []
    for rid in range(1, CONTROL_EVENTS // 2 + 1):
        request = Request(rid, tuple(range(rid * 100, rid * 100 + 64)), 1024, 200,
                          hints=AgentHints(f"s{rid % 50}", expected_tool_s=5.0))  # fmt: skip
        events.append(Arrived(RequestArrived(request, rid * 0.01)))
        finished = RequestFinished(request, rid * 0.01 + 1.0, 512, 0.1, 1.0, 0.01)
        events.append(Finished(rid % CONTROL_NODES, finished))
    replay_s, plan_s = [], []
    for rep in range(repeats + 1):
        start = time.perf_counter()
        ray.get(remote.actor.replay.remote(events))
        replay = time.perf_counter() - start
        start = time.perf_counter()
        ray.get(remote.actor.plan.remote([], snapshot, 100.0 + rep))
        if rep:
            replay_s.append(replay)
            plan_s.append(time.perf_counter() - start)
    remote.close()
    return {
        "num_nodes": CONTROL_NODES,
        "num_events": len(events),
        "event_bytes": len(pickle.dumps(events)) / len(events),
        "snapshot_bytes": len(pickle.dumps(snapshot)),
        "replay_ms": 1000 * statistics.median(replay_s),
        "plan_ms": 1000 * statistics.median(plan_s),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--kv-bytes-per-token", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    ray.init(
        num_cpus=2, include_dashboard=False, object_store_memory=100 * MIB, log_to_driver=False
    )
    try:
        result = {
            "ray_version": ray.__version__,
            "transport": transport_rows(args.repeats),
            "workload": workload_rows(args),
            "control": control_rows(args.repeats),
            "settings": vars(args),
        }
    finally:
        ray.shutdown()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
