"""Disaggregated serving on real worker processes: prefill on node 0, decode on node 1,
KV moved between them as bytes. Greedy outputs equal one sequence run on one executor,
including when the decode node already holds part of the prefix; roles switched by hand
under load lose nothing in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from evinfra.serve.testing import ServerProcess  # noqa: E402

DISAGG_ARGS = [
    "--executor", "torch", "--model", "tiny", "--num-nodes", "2", "--num-blocks", "256",
    "--system", "dynamo", "--system-option", "num_prefill_nodes=1",
    "--system-option", "conditional_disagg=false", "--system-option", "planner=none",
    "--check-integrity",
]  # fmt: skip


def reference(prompt_ids: list[int], num_tokens: int) -> list[int]:
    from evinfra.serve.engine.chat import generate
    from evinfra.serve.engine.executor import TorchExecutor
    from evinfra.serve.engine.factory import make_tiny_model

    executor = TorchExecutor(make_tiny_model(0).model, num_blocks=64, block_size=16)
    return list(generate(executor, prompt_ids, num_tokens).token_ids)


def prompt(seed: int, length: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % 250 for i in range(length)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(DISAGG_ARGS) as srv:
        yield srv


async def complete(client: Any, ids: list[int], num_tokens: int) -> list[int]:
    out = await client.completions.create(
        model="tiny", prompt=ids, max_tokens=num_tokens, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    return list(out.choices[0].model_extra["token_ids"])


def kv_bytes_moved(server: ServerProcess) -> int:
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("evinfra_kv_transfer_bytes_total "):
            return int(line.split()[1])
    raise AssertionError("no evinfra_kv_transfer_bytes_total")


def test_disaggregated_output_equals_single_node(server: ServerProcess) -> None:
    health = server.get("/health").json()
    assert [n["role"] for n in health["nodes"]] == ["prefill", "decode"]
    base = prompt(11, 40)
    cases = [
        (prompt(1, 5), 20),
        (prompt(2, 16), 20),  # exactly one block
        (prompt(3, 17), 20),
        (base, 30),
        (base + prompt(12, 25), 30),  # the decode node holds the first blocks already
        (prompt(4, 100), 1),  # finishes on the prefill node: nothing to hand off
    ]

    async def run() -> list[list[int]]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        return [await complete(client, ids, n) for ids, n in cases]

    before = kv_bytes_moved(server)
    outputs = asyncio.run(run())
    for (ids, n), got in zip(cases, outputs, strict=True):
        assert got == reference(ids, n), (len(ids), n)
    assert kv_bytes_moved(server) > before
    nodes = server.get("/admin/nodes").json()["nodes"]
    assert all(n["steps"] > 0 for n in nodes)  # both nodes computed
    assert server.get("/admin/integrity").json()["ok"]


def test_disaggregated_stream_has_no_empty_chunk_before_the_first_token(
    server: ServerProcess,
) -> None:
    """The hand-off is bookkeeping: a client timing TTFT on the first chunk must see a
    token in it, not an empty chunk sent when the prefill node lets go."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(
        model="tiny", prompt=prompt(21, 60), max_tokens=8, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts = [c.choices[0].text for c in stream if c.choices]
    assert texts and texts[0] != ""


def test_role_switches_under_load_lose_nothing(server: ServerProcess) -> None:
    cases = [(prompt(20 + i, 30 + 7 * i), 60) for i in range(8)]
    expected = [reference(ids, n) for ids, n in cases]
    switches = [
        {"node": 0, "role": "decode"}, {"node": 1, "role": "prefill"},
        {"node": 0, "role": "mixed"}, {"node": 1, "role": "mixed"},
        {"node": 1, "role": "decode"}, {"node": 0, "role": "prefill"},
    ]  # fmt: skip

    async def run() -> tuple[list[list[int]], int]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        tasks = [asyncio.create_task(complete(client, ids, n)) for ids, n in cases]

        async def live_requests() -> int:
            nodes = await asyncio.to_thread(server.get, "/admin/nodes")
            return int(nodes.json()["live_requests"])

        # A slow machine may take longer than the switches to get the first request in:
        # wait (bounded) until requests run, so the switches land while they do.
        in_flight_at_switch = await live_requests()
        deadline_s = time.monotonic() + 30
        while in_flight_at_switch < 2 and time.monotonic() < deadline_s:
            await asyncio.sleep(0.005)
            in_flight_at_switch = await live_requests()
        for body in switches:
            in_flight_at_switch = max(in_flight_at_switch, await live_requests())
            resp = await asyncio.to_thread(server.post, "/admin/role", json=body)
            assert resp.status_code == 200 and resp.json()["changed"], resp.text
            await asyncio.sleep(0.03)
        outputs = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        return outputs, in_flight_at_switch

    start = time.monotonic()
    outputs, in_flight = asyncio.run(run())
    assert time.monotonic() - start < 60
    assert in_flight >= 2  # the switches happened while requests were running
    assert outputs == expected
    metrics = server.get("/metrics").text
    assert f"evinfra_role_switches_total {len(switches)}" in metrics
    roles = [n["role"] for n in server.get("/health").json()["nodes"]]
    assert roles == ["prefill", "decode"]
    assert server.get("/admin/integrity").json()["ok"]


def test_admin_role_rejects_bad_input(server: ServerProcess) -> None:
    for body, param in (
        ({"node": 5, "role": "decode"}, "node"),
        ({"node": 0, "role": "boss"}, "role"),
        ({"node": "0", "role": "decode"}, "node"),
    ):
        resp = server.post("/admin/role", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
