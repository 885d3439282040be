"""A node process that dies mid-request: its request fails with a clear error (never
hangs), the server reports itself degraded, and the surviving node keeps serving."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from evinfra.serve.testing import ServerProcess, pid_alive  # noqa: E402


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    args = ["--executor", "torch", "--model", "tiny", "--num-nodes", "2", "--num-blocks", "256"]
    with ServerProcess([*args, "--system", "round-robin"]) as srv:
        yield srv


def busy_node(server: ServerProcess, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in server.get("/admin/nodes").json()["nodes"]:
            if node["running"] > 0:
                return dict(node)
        time.sleep(0.02)
    raise AssertionError("no node is decoding")


def test_killed_node_fails_its_request_and_the_other_keeps_serving(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30.0)
    stream = client.completions.create(
        model="tiny", prompt=[5 + i % 200 for i in range(200)], max_tokens=3500,
        temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = iter(stream)
    next(chunks)  # the request is running
    node = busy_node(server)
    os.kill(node["pid"], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(openai.APIError) as info:
        for _ in chunks:
            assert time.monotonic() - start < 20, "the stream hangs after its node died"
    assert f"node {node['node']} died" in str(info.value)
    assert time.monotonic() - start < 20

    health = server.get("/health").json()
    assert health["status"] == "degraded"
    assert [n["alive"] for n in health["nodes"]].count(False) == 1
    for _ in range(3):  # round-robin now only has the survivor
        out = client.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=4)
        assert out.choices[0].finish_reason in ("length", "stop")
    metrics = server.get("/metrics").text
    assert "evinfra_node_failures_total 1" in metrics
    assert f'evinfra_node_up{{node="{node["node"]}"}} 0.0' in metrics
    assert not pid_alive(node["pid"])


def test_request_that_streamed_nothing_is_resent_to_a_live_node() -> None:
    """A node dies during a slow prefill (timed executor at 1/50 speed): the request
    goes to the other node and completes; the metrics count the retry."""
    import asyncio

    from evinfra.serve.executors import ExecutorSpec
    from evinfra.serve.runtime import ClusterConfig, LocalCluster

    async def run() -> tuple[list[int], str | None, int]:
        spec = ExecutorSpec(kind="timed", model="tiny", cost_options=(("speedup_ratio", 0.02),))
        cluster = LocalCluster(ClusterConfig(spec, num_nodes=2, system="round-robin"))
        await cluster.start()
        try:
            handle = cluster.generate(list(range(3, 103)), 4)
            # Kill node 0 (round-robin's first) while it sleeps out its prefill step
            # (0.9 s at this speed): a fixed wait could oversleep that on a slow machine,
            # and a token streamed before the kill makes the request fail, not resend.
            pid = cluster.worker_pids[0]
            async with asyncio.timeout(20):
                while not _waits_in(pid, "nanosleep"):
                    await asyncio.sleep(0.005)
            os.kill(pid, signal.SIGKILL)
            tokens: list[int] = []
            error = None
            async with asyncio.timeout(20):
                async for event in handle.stream():
                    tokens.extend(event.token_ids)
                    error = event.error or error
            return tokens, error, cluster.metrics.num_retried
        finally:
            await cluster.stop()

    tokens, error, retried = asyncio.run(run())
    assert error is None and len(tokens) == 4 and retried == 1


def _waits_in(pid: int, wait_channel: str) -> bool:
    """Whether a thread of process `pid` sleeps in a kernel function whose name holds
    `wait_channel` (Linux: its wchan): "nanosleep" in `time.sleep`, as the timed executor
    does for the length of a step (idle, a node waits on its inbox, a futex), or
    "pipe_write" in a blocked pipe write."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if wait_channel in (task / "wchan").read_text():
                return True
        except OSError:
            continue
    return False


def test_a_node_killed_in_the_middle_of_a_write_does_not_silence_the_survivor() -> None:
    """The frontend stops reading, so the streaming node's queue feeder blocks inside a
    pipe write (holding that queue's write lock); the node is killed there. The survivor
    must still be heard: had the nodes shared one queue to the frontend, its lock would
    stay held forever and every later reply would hang (`serve.links`)."""
    import asyncio
    import threading

    from evinfra.serve.executors import ExecutorSpec
    from evinfra.serve.runtime import ClusterConfig, LocalCluster

    async def run() -> tuple[list[int], str | None]:
        spec = ExecutorSpec(kind="torch", model="tiny")
        cfg = ClusterConfig(spec, num_nodes=2, system="round-robin", num_blocks=256)
        cluster = LocalCluster(cfg)
        await cluster.start()
        gate = threading.Event()
        deliver = cluster._deliver_from_thread

        def paused(batch: list[Any]) -> None:
            gate.wait()
            deliver(batch)

        try:
            prompt = [5 + i % 200 for i in range(200)]
            long = cluster.generate(prompt, 3500, stop_token_ids=frozenset())
            events = long.stream()
            await anext(events)  # decoding
            async with asyncio.timeout(10):
                while not (busy := [n for n in cluster.nodes if n.stats.num_running_decodes]):
                    await asyncio.sleep(0.02)
            victim = busy[0].node_id
            cluster._deliver_from_thread = paused  # type: ignore[method-assign]
            pid = cluster.worker_pids[victim]
            async with asyncio.timeout(30):
                while not _waits_in(pid, "pipe_write"):
                    await asyncio.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
            # let the reader go only once the node is dead (a fixed wait may be too
            # short on a slow machine): else its write might still complete
            async with asyncio.timeout(10):
                while pid_alive(pid):
                    await asyncio.sleep(0.02)
            gate.set()
            async with asyncio.timeout(20):
                async for _ in events:
                    pass
                while cluster.nodes[victim].alive:
                    await asyncio.sleep(0.02)
                tokens: list[int] = []
                error = None
                async for event in cluster.generate([7, 8, 9], 4).stream():
                    tokens.extend(event.token_ids)
                    error = event.error or error
            return tokens, error
        finally:
            gate.set()
            await cluster.stop()

    tokens, error = asyncio.run(run())
    assert error is None and len(tokens) == 4
