"""The step phase through the local runtime: worker processes report their last step's
time, the frontend's view turns it into the time left in a decoding node's step, and the
evolving router that reads it (`evolving-phase`) serves every request."""

from __future__ import annotations

import asyncio

from evinfra.core.types import AgentHints
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.runtime import ClusterConfig, LocalCluster

BLOCK = 16


async def run_phase_cluster() -> tuple[list[float], list[float], int, int]:
    """While one long decode runs: each view reading of the decoding node's time left
    and of its last step time; then the tokens of three more calls, and the integrity."""
    spec = ExecutorSpec(kind="timed", model="tiny")
    config = ClusterConfig(
        spec, 2, "evolving-phase", num_blocks=256, block_size=BLOCK,
        cost_model=node_cost_model(spec, BLOCK),
    )  # fmt: skip
    cluster = LocalCluster(config)
    await cluster.start()
    try:
        long = cluster.generate([5] * 64, 400, hints=AgentHints("long"))
        remaining: list[float] = []
        lengths: list[float] = []
        async with asyncio.timeout(60):
            async for event in long.stream():
                assert event.error is None
                for node in cluster.view.nodes:
                    left = cluster.view.step_remaining_s(node.node_id, cluster.now_s())
                    if left is not None:
                        remaining.append(left)
                        lengths.append(node.stats.last_step_s)
        num_tokens = 0
        for i in range(3):
            handle = cluster.generate([7 + i] * 48, 8, hints=AgentHints(f"s{i}"))
            async with asyncio.timeout(30):
                async for event in handle.stream():
                    assert event.error is None
                    num_tokens += len(event.token_ids)
        ok = int(all(r.ok for r in await cluster.check_integrity()))
        return remaining, lengths, num_tokens, ok
    finally:
        await cluster.stop()


def test_the_frontend_reads_each_decoding_node_s_step_phase() -> None:
    remaining, lengths, num_tokens, ok = asyncio.run(run_phase_cluster())
    assert remaining, "no snapshot showed a decoding node with a step time"
    assert all(0.0 < left <= length for left, length in zip(remaining, lengths, strict=True))
    assert num_tokens == 3 * 8 and ok == 1
