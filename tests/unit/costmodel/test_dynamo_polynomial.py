"""Dynamo mocker polynomial at hand-computed points."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.dynamo_polynomial import (
    DynamoPolynomialCostModel,
    UtilisationSource,
    decode_ms,
    prefill_ms,
)
from evinfra.costmodel.node import NodeSpec

NODE = NodeSpec.from_names("llama-3-70b", "h100", 8, kv_dtype="bf16")
CAPACITY = 100_000


def make_model(**options: float | str) -> DynamoPolynomialCostModel:
    return DynamoPolynomialCostModel(NODE, kv_capacity_tokens=CAPACITY, **options)  # type: ignore[arg-type]


def test_prefill_polynomial_by_hand() -> None:
    # 4.209989e-7 * 1000^2 + 0.01518344 * 1000 + 16.50142 = 0.4209989 + 15.18344 + 16.50142
    assert prefill_ms(1000) == pytest.approx(32.1058589, abs=1e-9)
    # 4.209989e-7 * 16,777,216 + 0.01518344 * 4096 + 16.50142
    #   = 7.0631895 + 62.1913702 + 16.50142 = 85.7559797
    assert prefill_ms(4096) == pytest.approx(85.7559797, abs=1e-6)
    assert prefill_ms(1) == pytest.approx(16.50142 + 0.01518344 + 4.209989e-7)
    assert prefill_ms(0) == 0.0


def test_decode_polynomial_by_hand() -> None:
    assert float(decode_ms(0.0)) == pytest.approx(5.74)
    assert float(decode_ms(0.5)) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)  # 26.31
    assert float(decode_ms(0.5)) == pytest.approx(26.31)
    assert float(decode_ms(1.0)) == pytest.approx(34.01)
    # -25.74 * 9 + 54.01 * 3 + 5.74 = -63.89: floored at 1 ms
    assert float(decode_ms(3.0)) == 1.0


def test_step_times() -> None:
    model = make_model(utilisation_source="kv_in_use")
    only_prefill = BatchShape(prefill_chunks=(PrefillChunk(600, 0), PrefillChunk(400, 5000)))
    assert model.step_time_s(only_prefill) == pytest.approx(32.1058589e-3)  # T = 1000 new
    only_decode = BatchShape(
        num_decode_seqs=10, num_decode_context_tokens=20_000, num_kv_tokens_in_use=50_000
    )
    assert model.step_time_s(only_decode) == pytest.approx(26.31e-3)  # u = 0.5
    mixed = BatchShape(
        prefill_chunks=only_prefill.prefill_chunks,
        num_decode_seqs=10,
        num_decode_context_tokens=20_000,
        num_kv_tokens_in_use=50_000,
    )
    assert model.step_time_s(mixed) == pytest.approx(32.1058589e-3 + 26.31e-3)  # sum rule
    assert model.step_time_s(BatchShape()) == 0.0


def test_fully_cached_prefill_costs_nothing() -> None:
    model = make_model()
    assert model.step_time_s(BatchShape(prefill_chunks=(PrefillChunk(0, 4096),))) == 0.0


def test_speedup_ratios_divide_times() -> None:
    base = make_model(utilisation_source="kv_in_use")
    fast = make_model(speedup_ratio=4.0, decode_speedup_ratio=2.0, utilisation_source="kv_in_use")
    batch = BatchShape(
        prefill_chunks=(PrefillChunk(1000, 0),),
        num_decode_seqs=1,
        num_decode_context_tokens=10,
        num_kv_tokens_in_use=50_000,
    )
    assert fast.step_time_s(batch) == pytest.approx(32.1058589e-3 / 4 + 26.31e-3 / 8)
    assert base.step_time_s(batch) == pytest.approx(32.1058589e-3 + 26.31e-3)
    with pytest.raises(ValueError):
        make_model(speedup_ratio=0.0)


def test_utilisation_from_decode_contexts_by_default() -> None:
    # Dynamo 1.6.1's mocker keys decode time on the decoding sequences' contexts
    model = make_model()
    assert model.utilisation_source is UtilisationSource.DECODE_CONTEXT
    batch = BatchShape(num_decode_seqs=4, num_decode_context_tokens=100_000, num_kv_tokens_in_use=0)
    assert model.step_time_s(batch) == pytest.approx(34.01e-3)


def test_utilisation_is_capped_at_one() -> None:
    # decoding contexts that share a prefix sum past the capacity: the mocker decodes at
    # u = 1 (34.01 ms, measured), not on the polynomial's falling branch (1 ms at u = 2.6)
    model = make_model()
    for contexts in (100_000, 150_000, 260_000, 10**7):
        batch = BatchShape(num_decode_seqs=8, num_decode_context_tokens=contexts)
        assert model.step_time_s(batch) == pytest.approx(34.01e-3)
    assert model.decode_run_time_s(8, 190_000, 0, 4) == pytest.approx(4 * 34.01e-3)
    # and below the capacity the step time never falls as the contexts grow
    times = [
        model.step_time_s(BatchShape(num_decode_seqs=1, num_decode_context_tokens=c))
        for c in range(0, 300_001, 5_000)
    ]
    assert times == sorted(times)


def test_capacity_defaults_to_the_node() -> None:
    model = DynamoPolynomialCostModel(NODE)
    assert model.kv_capacity_tokens == NODE.kv_capacity_tokens
    assert model.kv_bytes_per_token == 327_680


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 512), st.integers(0, 60_000), st.integers(1, 400))
def test_decode_run_equals_sum_of_steps(seqs: int, kv: int, steps: int) -> None:
    model = make_model()
    total = sum(
        model.step_time_s(
            BatchShape(
                num_decode_seqs=seqs,
                num_decode_context_tokens=kv + i * seqs,
                num_kv_tokens_in_use=kv + i * seqs,
            )
        )
        for i in range(steps)
    )
    assert model.decode_run_time_s(seqs, kv, kv, steps) == pytest.approx(total, rel=1e-9)
