"""Measured-profile cost model: interpolation, clamping, JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.profile import ProfileCostModel, ProfileTable

NODE = NodeSpec.from_names("smollm2-135m", "h100", 1)


def make_table() -> ProfileTable:
    return ProfileTable(
        prefill_tokens=(128.0, 1024.0, 4096.0),
        prefill_ms=(10.0, 40.0, 160.0),
        decode_batch_sizes=(1.0, 8.0, 64.0),
        decode_context_tokens=(256.0, 4096.0),
        decode_ms=((5.0, 7.0), (6.0, 10.0), (12.0, 30.0)),
        source="synthetic test table",
    )


def decode(seqs: int, mean_context: float) -> BatchShape:
    total = round(seqs * mean_context)
    return BatchShape(num_decode_seqs=seqs, num_decode_context_tokens=total)


def test_prefill_linear_interpolation() -> None:
    model = ProfileCostModel(NODE, make_table())
    assert model.step_time_s(BatchShape(prefill_chunks=(PrefillChunk(576, 0),))) == pytest.approx(
        25e-3
    )
    two_chunks = BatchShape(prefill_chunks=(PrefillChunk(1024, 0), PrefillChunk(1536, 99)))
    assert model.step_time_s(two_chunks) == pytest.approx((40 + 120 * 1536 / 3072) * 1e-3)


def test_prefill_is_clamped_outside_the_table() -> None:
    model = ProfileCostModel(NODE, make_table())
    assert model.prefill_ms(1) == 10.0
    assert model.prefill_ms(100_000) == 160.0
    assert model.prefill_ms(0) == 0.0


def test_decode_bilinear_interpolation() -> None:
    model = ProfileCostModel(NODE, make_table())
    assert model.step_time_s(decode(8, 4096)) == pytest.approx(10e-3)  # a grid point
    # halfway along the context axis at batch 1
    assert model.step_time_s(decode(1, 2176)) == pytest.approx(6e-3)
    # centre of the (8..64) x (256..4096) cell: the mean of its four corners
    assert model.step_time_s(decode(36, 2176)) == pytest.approx((6 + 10 + 12 + 30) / 4 * 1e-3)
    # batch 4 between 1 and 8 at context 256
    assert model.decode_ms(4, model._context_x)[0] == pytest.approx(5.0 + (6.0 - 5.0) * 3 / 7)
    mixed = BatchShape(
        prefill_chunks=(PrefillChunk(1024, 0),),
        num_decode_seqs=8,
        num_decode_context_tokens=8 * 256,
    )
    assert model.step_time_s(mixed) == pytest.approx((40 + 6) * 1e-3)  # sum rule


def test_decode_is_clamped_outside_the_table() -> None:
    model = ProfileCostModel(NODE, make_table())
    assert model.step_time_s(decode(1000, 100_000)) == pytest.approx(30e-3)
    assert model.step_time_s(decode(1, 10)) == pytest.approx(5e-3)
    table = make_table()
    assert table.covers(decode(8, 1000))
    assert not table.covers(decode(1000, 1000))
    assert not table.covers(BatchShape(prefill_chunks=(PrefillChunk(10_000, 0),)))


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    make_table().save(path)
    assert ProfileTable.load(path) == make_table()
    model = ProfileCostModel.from_json(path, NODE)
    assert model.step_time_s(decode(8, 4096)) == pytest.approx(10e-3)
    assert model.kv_capacity_tokens == NODE.kv_capacity_tokens


def test_invalid_tables_are_rejected() -> None:
    with pytest.raises(ValueError, match="increasing"):
        ProfileTable((2.0, 1.0), (1.0, 2.0), (1.0,), (1.0,), ((1.0,),))
    with pytest.raises(ValueError, match="length"):
        ProfileTable((1.0, 2.0), (1.0,), (1.0,), (1.0,), ((1.0,),))
    with pytest.raises(ValueError, match="decode_ms"):
        ProfileTable((1.0,), (1.0,), (1.0, 2.0), (1.0,), ((1.0,),))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 100), st.integers(1, 5000), st.integers(1, 300))
def test_decode_run_equals_sum_of_steps(seqs: int, ctx: int, steps: int) -> None:
    model = ProfileCostModel(NODE, make_table())
    start = seqs * ctx
    total = sum(
        model.step_time_s(
            BatchShape(num_decode_seqs=seqs, num_decode_context_tokens=start + i * seqs)
        )
        for i in range(steps)
    )
    assert model.decode_run_time_s(seqs, start, start, steps) == pytest.approx(total, rel=1e-9)
