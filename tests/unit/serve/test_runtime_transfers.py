"""The frontend's runtime counts the KV bytes its nodes report per request (a hand-off, a
prefix pulled before the prefill) where a response's usage reads them, as they arrive."""

from evinfra.core.types import Request
from evinfra.serve.executors import ExecutorSpec, node_cost_model
from evinfra.serve.openai_api import usage
from evinfra.serve.protocol import Generation, Sampling, TokensOut
from evinfra.serve.requests import LiveRequest, RequestHandle
from evinfra.serve.runtime import ClusterConfig, LocalCluster


def test_pulled_and_handed_off_bytes_reach_the_handle_and_the_counters() -> None:
    spec = ExecutorSpec(kind="timed", model="tiny")
    cluster = LocalCluster(
        ClusterConfig(spec, 2, "least-loaded", cost_model=node_cost_model(spec, 16))
    )
    handle = RequestHandle(7, 40, lambda h: None)
    request = Request(7, (), 40, 4)
    live = LiveRequest(request, Generation((5,) * 40, frozenset(), Sampling()), handle, 0.0)
    cluster._live[7] = live  # (not started: no process is spawned)
    cluster._on_tokens(TokensOut(0, 7, (), num_cached_tokens=16))
    cluster._on_tokens(TokensOut(0, 7, (), num_transfer_bytes=2_048, num_pulled_bytes=2_048))
    cluster._on_tokens(TokensOut(0, 7, (9,), num_transfer_bytes=1_024))
    assert (handle.num_cached_tokens, handle.num_transfer_bytes, handle.num_pulled_bytes) == (
        16, 3_072, 2_048,
    )  # fmt: skip
    assert cluster.metrics.num_kv_bytes_moved == 3_072
    assert cluster.metrics.num_kv_bytes_pulled == 2_048
    assert "evinfra_kv_pulled_bytes_total 2048" in cluster.metrics.render([])
    use = usage(40, 1, 16, handle.num_transfer_bytes, handle.num_pulled_bytes)
    assert use["kv_transfer_details"] == {"handed_off_bytes": 1_024, "pulled_bytes": 2_048}
