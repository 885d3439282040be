"""Agent-aware eviction through the local runtime: worker processes, the frontend's KV
manager publishing tiers on each session event, the workers' pools evicting by them."""

from __future__ import annotations

import asyncio

from evinfra.core.types import AgentHints
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.runtime import ClusterConfig, LocalCluster

BLOCK = 16
SOON = [3] * 64  # 4 blocks, back after a 1 s tool
AWAY = [4] * 64  # 4 blocks, gone for ten minutes
FILLER = [6] * 192  # 12 blocks: on a 16-block node, 4 cached blocks must go


async def call(cluster: LocalCluster, prompt: list[int], hints: AgentHints) -> int:
    handle = cluster.generate(prompt, 1, hints=hints)
    async with asyncio.timeout(30):
        async for event in handle.stream():
            assert event.error is None
    return handle.num_cached_tokens


async def soon_back_cached(system: str) -> tuple[int, int, int]:
    """Cached prompt tokens of `soon`'s next call after the filler evicted 4 blocks, the
    number of tier messages sent, and the workers' integrity (1: every node ok)."""
    spec = ExecutorSpec(kind="timed", model="tiny", cost_options=(("speedup_ratio", 50.0),))
    config = ClusterConfig(
        spec, 1, system, num_blocks=16, block_size=BLOCK, cost_model=node_cost_model(spec, BLOCK)
    )
    cluster = LocalCluster(config)
    await cluster.start()
    try:
        await call(cluster, SOON, AgentHints("soon", expected_tool_s=1.0))
        # freed after `soon`'s: least recently used would keep these and evict `soon`'s
        await call(cluster, AWAY, AgentHints("away", expected_tool_s=600.0))
        await call(cluster, FILLER, AgentHints("filler", expected_tool_s=1.0))
        cached = await call(cluster, SOON + [7] * 16, AgentHints("soon", expected_tool_s=1.0))
        reports = await cluster.check_integrity()
        ok = int(all(r.ok for r in reports))
        return cached, cluster.metrics.num_kv_score_messages, ok
    finally:
        await cluster.stop()


def test_the_session_expected_back_keeps_its_context_under_kv_pressure() -> None:
    cached, num_messages, ok = asyncio.run(soon_back_cached("evolving"))
    assert cached == len(SOON) and ok == 1
    assert num_messages >= 1  # `away`'s blocks, marked away when its call finished
    cached, num_messages, ok = asyncio.run(soon_back_cached("evolving-lru"))
    assert cached == 0 and num_messages == 0 and ok == 1
