"""Roofline step times: monotonicity, bounds, and decode runs equal to step sums."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.roofline import RooflineCostModel, RooflineEfficiency, causal_pairs

NODES = {
    "kimi": NodeSpec.from_names("kimi-k2", "gb300", 8),
    "glm": NodeSpec.from_names("glm-5", "b200", 8),
    "llama": NodeSpec.from_names("llama-3-70b", "h100", 8, kv_dtype="bf16"),
    "ds-h100-wide": NodeSpec.from_names("deepseek-v3", "h100", 72, kv_dtype="bf16"),
    "tiny": NodeSpec.from_names("tiny", "h100", 1),
}


def make_model(name: str = "kimi", **efficiency: float) -> RooflineCostModel:
    return RooflineCostModel(NODES[name], RooflineEfficiency(**efficiency))


def prefill(num_new: int, num_context: int = 0, count: int = 1) -> BatchShape:
    return BatchShape(prefill_chunks=(PrefillChunk(num_new, num_context),) * count)


def decode(num_seqs: int, context_per_seq: int) -> BatchShape:
    total = num_seqs * context_per_seq
    return BatchShape(
        num_decode_seqs=num_seqs, num_decode_context_tokens=total, num_kv_tokens_in_use=total
    )


@given(st.integers(0, 5000), st.integers(0, 3000), st.one_of(st.none(), st.integers(1, 4000)))
def test_causal_pairs_match_brute_force(context: int, new: int, cap: int | None) -> None:
    expected = sum(
        min(context + i, cap) if cap is not None else context + i for i in range(1, new + 1)
    )
    assert causal_pairs(context, new, cap) == expected


@pytest.mark.parametrize("name", sorted(NODES))
def test_monotonic_in_prefill_tokens_and_context(name: str) -> None:
    model = make_model(name)
    times = [model.step_time_s(prefill(n)) for n in (16, 256, 2048, 8192, 32768)]
    assert times == sorted(times) and times[-1] > times[0]
    with_context = [model.step_time_s(prefill(2048, c)) for c in (0, 4096, 32768, 131072)]
    assert with_context == sorted(with_context) and with_context[-1] > with_context[0]


@pytest.mark.parametrize("name", sorted(NODES))
def test_monotonic_in_decode_seqs_and_context(name: str) -> None:
    model = make_model(name)
    by_seqs = [model.step_time_s(decode(s, 4096)) for s in (1, 8, 64, 512, 4096)]
    assert by_seqs == sorted(by_seqs) and by_seqs[-1] > by_seqs[0]
    by_context = [model.step_time_s(decode(64, c)) for c in (128, 4096, 65536, 200_000)]
    assert by_context == sorted(by_context) and by_context[-1] > by_context[0]


def test_empty_batch_costs_nothing() -> None:
    model = make_model()
    assert model.step_time_s(BatchShape()) == 0.0
    assert model.decode_run_time_s(0, 0, 0, 100) == 0.0
    assert model.decode_run_time_s(8, 800, 800, 0) == 0.0


def test_long_prefill_is_compute_bound_and_small_decode_memory_bound() -> None:
    model = make_model("llama")
    assert model.breakdown(prefill(8192)).bound == "compute"
    assert model.breakdown(decode(4, 1024)).bound == "memory"


def test_fixed_overheads_are_added() -> None:
    base = make_model("tiny", step_overhead_s=0.0, layer_overhead_s=0.0)
    slow = make_model("tiny", step_overhead_s=0.01, layer_overhead_s=0.001)
    batch = decode(4, 100)
    assert slow.step_time_s(batch) == pytest.approx(base.step_time_s(batch) + 0.01 + 2 * 0.001)


def test_efficiency_scales_compute_bound_steps() -> None:
    batch = prefill(8192, count=8)
    fast = make_model("llama", prefill_flops=0.8, step_overhead_s=0.0, layer_overhead_s=0.0)
    slow = make_model("llama", prefill_flops=0.4, step_overhead_s=0.0, layer_overhead_s=0.0)
    assert fast.breakdown(batch).bound == "compute"
    assert slow.breakdown(batch).compute_s == pytest.approx(2 * fast.breakdown(batch).compute_s)


def test_moe_reads_only_touched_experts() -> None:
    model = make_model("kimi", step_overhead_s=0.0, layer_overhead_s=0.0)
    one = model.breakdown(decode(1, 10)).memory_s
    many = model.breakdown(decode(64, 10)).memory_s
    saturated = model.breakdown(decode(4096, 10)).memory_s
    saturated_more = model.breakdown(decode(8192, 10)).memory_s
    assert one < many < saturated
    # all experts touched: more tokens add only KV traffic, not weights
    assert saturated_more - saturated < 0.1 * (saturated - one)


def test_sparse_attention_caps_decode_kv_reads() -> None:
    model = make_model("glm")
    short = model.breakdown(decode(32, 2048)).memory_s
    long = model.breakdown(decode(32, 100_000)).memory_s
    dense = make_model("kimi")
    dense_growth = (
        dense.breakdown(decode(32, 100_000)).memory_s / dense.breakdown(decode(32, 2048)).memory_s
    )
    assert long / short < dense_growth  # only the indexer keys grow with context


def test_ep_across_nvlink_domains_pays_the_nic() -> None:
    inside = NodeSpec.from_names("deepseek-v3", "h200", 8, kv_dtype="bf16")
    across = NodeSpec.from_names("deepseek-v3", "h200", 72, kv_dtype="bf16")
    batch_inside = decode(256 * 8, 2000)
    batch_across = decode(256 * 72, 2000)
    comm_inside = RooflineCostModel(inside).breakdown(batch_inside).comm_s
    comm_across = RooflineCostModel(across).breakdown(batch_across).comm_s
    assert comm_across > 5 * comm_inside


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(NODES)),
    st.integers(1, 2048),
    st.integers(1, 50_000),
    st.integers(1, 600),
)
def test_decode_run_equals_sum_of_steps(name: str, seqs: int, ctx: int, steps: int) -> None:
    model = make_model(name)
    start_kv = seqs * ctx
    total = sum(
        model.step_time_s(
            BatchShape(
                num_decode_seqs=seqs,
                num_decode_context_tokens=start_kv + i * seqs,
                num_kv_tokens_in_use=start_kv + i * seqs,
            )
        )
        for i in range(steps)
    )
    run = model.decode_run_time_s(seqs, start_kv, start_kv, steps)
    assert run == pytest.approx(total, rel=1e-9)


def test_decode_run_of_many_steps_is_fast() -> None:
    model = make_model("kimi")
    started = time.perf_counter()
    run = model.decode_run_time_s(512, 512 * 4096, 512 * 4096, 200_000)
    assert time.perf_counter() - started < 0.5
    assert run > 200_000 * model.step_time_s(decode(512, 4096))


def test_efficiency_validation() -> None:
    with pytest.raises(ValueError):
        RooflineEfficiency(hbm=0.0)
    with pytest.raises(ValueError):
        RooflineEfficiency(comm_overlap=1.5)
    with pytest.raises(ValueError):
        RooflineEfficiency(step_overhead_s=-1.0)


def test_protocol_properties_come_from_the_node() -> None:
    model = make_model("llama")
    assert model.kv_capacity_tokens == NODES["llama"].kv_capacity_tokens
    assert model.kv_bytes_per_token == 327_680
