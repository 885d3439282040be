"""A node process that dies mid-request: its request fails with a clear error (never
hangs), the server reports itself degraded, and the surviving node keeps serving."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
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
