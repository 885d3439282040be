"""The frontend's overhead per request: the same requests sent straight to the local
runtime (`LocalCluster.generate`, no HTTP) and through the HTTP frontend (non-streaming
and streaming), on the timed executor with a near-zero step time so that the engine adds
almost nothing. Overhead = HTTP latency - direct latency.

    .venv/bin/python benchmarks/serve_overhead.py --num-requests 200 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import httpx

from evinfra.serve.executors import ExecutorSpec
from evinfra.serve.runtime import ClusterConfig, LocalCluster
from evinfra.serve.testing import ServerProcess

NEAR_ZERO_COST = (("speedup_ratio", 1e6), ("decode_speedup_ratio", 1.0))


def _stats(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {
        "mean_ms": 1000 * statistics.fmean(ordered),
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    }


def prompt(i: int, length: int) -> list[int]:
    return [3 + (i * 131 + j * 17) % 250 for j in range(length)]


async def direct(num: int, length: int, max_tokens: int) -> list[float]:
    spec = ExecutorSpec(kind="timed", model="tiny", cost_options=NEAR_ZERO_COST)
    cluster = LocalCluster(ClusterConfig(spec, num_nodes=2, system="round-robin"))
    await cluster.start()
    try:
        out = []
        for i in range(num):
            start = time.perf_counter()
            handle = cluster.generate(prompt(i, length), max_tokens)
            async for _ in handle.stream():
                pass
            out.append(time.perf_counter() - start)
        return out
    finally:
        await cluster.stop()


def over_http(num: int, length: int, max_tokens: int, stream: bool, url: str) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for i in range(num):
            body: dict[str, Any] = {
                "model": "tiny", "prompt": prompt(i, length), "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": stream,
            }  # fmt: skip
            start = time.perf_counter()
            if stream:
                with client.stream("POST", "/v1/completions", json=body) as resp:
                    for _ in resp.iter_lines():
                        pass
            else:
                client.post("/v1/completions", json=body).raise_for_status()
            out.append(time.perf_counter() - start)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    n, length, k = args.num_requests, args.prompt_tokens, args.max_tokens
    direct_s = asyncio.run(direct(n + args.warmup, length, k))[args.warmup :]
    server_args = ["--executor", "timed", "--model", "tiny", "--num-nodes", "2"]
    server_args += ["--system", "round-robin"]
    for key, value in NEAR_ZERO_COST:
        server_args += ["--cost-option", f"{key}={value}"]
    with ServerProcess(server_args) as server:
        over_http(args.warmup, length, k, False, server.url)
        plain_s = over_http(n, length, k, False, server.url)
        stream_s = over_http(n, length, k, True, server.url)
    result = {
        "num_requests": n,
        "prompt_tokens": length,
        "max_tokens": k,
        "direct": _stats(direct_s),
        "http": _stats(plain_s),
        "http_stream": _stats(stream_s),
    }
    result["overhead_ms"] = result["http"]["p50_ms"] - result["direct"]["p50_ms"]
    result["overhead_stream_ms"] = result["http_stream"]["p50_ms"] - result["direct"]["p50_ms"]
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
