"""The OpenAI-compatible API of `evinfra serve` (tiny model, torch executor, 2 nodes),
driven with the official `openai` client: outputs equal a single-sequence reference run,
streaming carries usage, bad input gets 400 naming the field, and a client that
disconnects mid-stream frees its KV."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from evinfra.serve.testing import ServerProcess  # noqa: E402

TINY_ARGS = ["--executor", "torch", "--model", "tiny", "--num-nodes", "2", "--num-blocks", "128"]


def reference(prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Greedy tokens of the tiny model, one sequence on a fresh executor (no stop token)."""
    from evinfra.serve.engine.chat import generate
    from evinfra.serve.engine.executor import TorchExecutor
    from evinfra.serve.engine.factory import make_tiny_model

    model = make_tiny_model(0).model
    executor = TorchExecutor(model, num_blocks=64, block_size=16)
    return list(generate(executor, prompt_ids, num_tokens).token_ids)


def prompt(seed: int, length: int) -> list[int]:
    return [3 + (seed * 7919 + i * 104729) % 250 for i in range(length)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess([*TINY_ARGS, "--system", "round-robin"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def wait_idle_and_check(server: ServerProcess, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll the integrity endpoint until every node is idle with no block in use."""
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = server.get("/admin/integrity").json()
        if all(n["idle"] and n["used_blocks"] == 0 for n in body["nodes"]):
            return body
        time.sleep(0.1)
    raise AssertionError(f"nodes not idle: {body}")


def test_completion_matches_reference_and_reports_usage(client: Any) -> None:
    ids = prompt(1, 37)
    out = client.completions.create(
        model="tiny", prompt=ids, max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert choice.model_extra["token_ids"] == reference(ids, 12)
    assert out.usage.prompt_tokens == 37
    assert out.usage.completion_tokens == 12


def test_streaming_completion_equals_non_streaming_and_ends_with_usage(client: Any) -> None:
    ids = prompt(2, 50)
    body = {"ignore_eos": True, "return_token_ids": True}
    whole = client.completions.create(
        model="tiny", prompt=ids, max_tokens=9, temperature=0, extra_body=body
    )
    chunks = list(
        client.completions.create(
            model="tiny", prompt=ids, max_tokens=9, temperature=0, stream=True, extra_body=body
        )
    )
    streamed = [t for c in chunks for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    assert streamed == whole.choices[0].model_extra["token_ids"] == reference(ids, 9)
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_chat_streaming_and_not(client: Any) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0
    )
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert whole.usage.completion_tokens <= 6


def test_agent_hints_and_session_header_are_accepted(client: Any) -> None:
    hints = {"session_id": "s-1", "turn": 0, "expected_tool_s": 2.5, "context_event": "start"}
    out = client.completions.create(
        model="tiny", prompt=prompt(3, 20), max_tokens=2, temperature=0,
        extra_body={"agent": hints}, extra_headers={"X-Session-Id": "s-1"},
    )  # fmt: skip
    assert out.usage.completion_tokens <= 2


def test_models_health_and_metrics(server: ServerProcess) -> None:
    models = server.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny"
    health = server.get("/health").json()
    assert health["status"] == "ready" and len(health["nodes"]) == 2
    text = server.get("/metrics").text
    for name in (
        "evinfra_ttft_seconds_bucket", "evinfra_itl_seconds_count", "evinfra_kv_hit_rate",
        "evinfra_node_waiting_requests", 'evinfra_node_kv_usage{node="0",tier="device"}',
        'evinfra_node_role{node="1",role="mixed"} 1.0', "evinfra_role_switches_total",
    ):  # fmt: skip
        assert name in text, name


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": -3}, "max_tokens"),
        ({"model": "nope", "prompt": "hi"}, "model"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": 5000}, "max_tokens"),
        ({"model": "tiny", "prompt": [5] * 3000, "max_tokens": 1}, "prompt"),
        ({"model": "tiny", "prompt": [70000], "max_tokens": 1}, "prompt"),
        ({"model": "tiny", "prompt": "hi", "agent": {"session_id": 7}}, "agent.session_id"),
        ({"model": "tiny", "prompt": "hi", "agent": {"turn": "x"}}, "agent.turn"),
        (
            {"model": "tiny", "prompt": "hi", "agent": {"session_id": "s", "expected_tool_s": "1"}},
            "agent.expected_tool_s",
        ),
        ({"model": "tiny", "prompt": "hi", "agent": {"colour": "red"}}, "agent.colour"),
        ({"model": "tiny"}, "prompt"),
        ({"model": "tiny", "prompt": "hi", "temperature": "warm"}, "temperature"),
    ],
)
def test_bad_input_gets_400_naming_the_field(
    server: ServerProcess, body: dict[str, Any], param: str
) -> None:
    resp = server.post("/v1/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error" and error["message"]


def test_malformed_json_and_bad_chat_get_400(server: ServerProcess) -> None:
    resp = server.post(
        "/v1/chat/completions", content=b'{"model": "tiny",', headers={"content-type": "x"}
    )
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    resp = server.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    resp = server.post("/v1/chat/completions", json={"model": "tiny", "messages": "hello"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"


def test_client_disconnect_mid_stream_frees_kv(server: ServerProcess) -> None:
    body = {
        "model": "tiny", "prompt": prompt(4, 300), "max_tokens": 1700, "temperature": 0,
        "stream": True, "ignore_eos": True,
    }  # fmt: skip
    with (
        httpx.Client(timeout=30.0) as http,
        http.stream("POST", f"{server.url}/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data:"):
                json.loads(line[5:])
                seen += 1
            if seen >= 3:
                break  # leaving the block closes the connection mid-stream
    report = wait_idle_and_check(server)
    assert report["ok"], report
    metrics = server.get("/metrics").text
    assert "evinfra_requests_aborted_total 0" not in metrics
