"""The roofline's fast paths give the same bits as its numpy evaluation: one step in
Python floats, short decode runs in Python floats, and decode runs answered from a
remembered run's step times."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.catalog import GPUS, MODELS
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.roofline import RooflineCostModel


def make_model(model: str = "kimi-k2", gpu: str = "gb300") -> RooflineCostModel:
    return RooflineCostModel(NodeSpec.from_names(model, gpu, 8, kv_dtype="bf16"))


def numpy_step_time_s(model: RooflineCostModel, batch: BatchShape) -> float:
    """The step time as `_times` computes it, on a one-element array."""
    contexts = np.array([float(batch.num_decode_context_tokens)])
    return float(model._times(batch.prefill_chunks, batch.num_decode_seqs, contexts)[0])


def numpy_run_time_s(model: RooflineCostModel, num_seqs: int, context: int, steps: int) -> float:
    contexts = context + num_seqs * np.arange(steps, dtype=np.float64)
    return float(model._times((), num_seqs, contexts).sum())


CHUNKS = st.lists(
    st.builds(PrefillChunk, st.integers(0, 16384), st.integers(0, 300_000)), max_size=4
).map(tuple)


def catalog_nodes() -> list[tuple[str, str, int]]:
    """Every catalog model on every catalog GPU, on the fewest of 8, 16 or 32 GPUs that
    hold its weights (kimi-k2 does not fit 8 H100s, for example)."""
    nodes = []
    for model_name in sorted(MODELS):
        for gpu_name in sorted(GPUS):
            for num_gpus in (8, 16, 32):
                try:
                    NodeSpec.from_names(model_name, gpu_name, num_gpus, kv_dtype="bf16")
                except ValueError:
                    continue
                nodes.append((model_name, gpu_name, num_gpus))
                break
    return nodes


def catalog_model(model_name: str, gpu_name: str, num_gpus: int) -> RooflineCostModel:
    """The roofline model of one of `catalog_nodes()`."""
    return RooflineCostModel(NodeSpec.from_names(model_name, gpu_name, num_gpus, kv_dtype="bf16"))


@pytest.mark.parametrize(("model_name", "gpu_name", "num_gpus"), catalog_nodes())
def test_step_time_in_floats_equals_numpy_on_every_catalog_node(
    model_name: str, gpu_name: str, num_gpus: int
) -> None:
    model = catalog_model(model_name, gpu_name, num_gpus)
    rng = np.random.default_rng(0)
    for _ in range(200):
        num_seqs = int(rng.integers(0, 300))
        context = int(rng.integers(0, 200_000)) * num_seqs
        chunks = tuple(
            PrefillChunk(int(rng.integers(1, 8192)), int(rng.integers(0, 200_000)))
            for _ in range(int(rng.integers(0, 3)))
        )
        batch = BatchShape(chunks, num_seqs, context, context)
        if batch.is_empty:
            continue
        assert model.step_time_s(batch) == numpy_step_time_s(model, batch)


@settings(max_examples=200, deadline=None)
@given(CHUNKS, st.integers(0, 512), st.integers(0, 400_000))
def test_step_time_in_floats_equals_numpy(
    chunks: tuple[PrefillChunk, ...], num_seqs: int, context_per_seq: int
) -> None:
    batch = BatchShape(chunks, num_seqs, num_seqs * context_per_seq, 0)
    if batch.is_empty:
        return
    for model in (make_model(), make_model("glm-5", "b200")):
        assert model.step_time_s(batch) == numpy_step_time_s(model, batch)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 300), st.integers(0, 10_000_000), st.lists(st.integers(1, 3000), max_size=6))
def test_remembered_decode_runs_give_the_same_bits(
    num_seqs: int, context: int, steps: list[int]
) -> None:
    model = make_model()
    for n in steps:  # longer and shorter runs of the same batch, in any order
        assert model.decode_run_time_s(num_seqs, context, 0, n) == numpy_run_time_s(
            model, num_seqs, context, n
        )


def test_decode_run_memo_is_bounded_and_keyed_by_batch() -> None:
    model = make_model()
    first = model.decode_run_time_s(8, 1000, 0, 50)
    for i in range(200):
        model.decode_run_time_s(8, 2000 + i, 0, 10)
    assert len(model._run_memo) <= 64
    assert model.decode_run_time_s(8, 1000, 0, 50) == first
    assert model.decode_run_time_s(9, 1000, 0, 50) != first


@pytest.mark.parametrize("num_values", range(1, 8))
def test_numpy_sums_up_to_seven_values_as_a_left_fold(num_values: int) -> None:
    rng = np.random.default_rng(num_values)
    for _ in range(2000):
        values = rng.random(num_values) * 10.0 ** rng.integers(-4, 4, num_values)
        total = 0.0
        for v in values.tolist():
            total += v
        assert float(values.sum()) == total


@pytest.mark.parametrize(("model_name", "gpu_name", "num_gpus"), catalog_nodes())
def test_short_decode_runs_in_floats_equal_numpy_on_every_catalog_node(
    model_name: str, gpu_name: str, num_gpus: int
) -> None:
    model = catalog_model(model_name, gpu_name, num_gpus)
    rng = np.random.default_rng(1)
    for _ in range(40):
        num_seqs = int(rng.integers(1, 300))
        context = int(rng.integers(0, 200_000)) * num_seqs
        # a run's first evaluation (up to 40 steps: both sides of each threshold), then
        # shorter asks answered from the remembered list or array
        for steps in (int(rng.integers(1, 41)), 1, 3, 7, 8, 9, 33):
            assert model.decode_run_time_s(num_seqs, context, 0, steps) == numpy_run_time_s(
                model, num_seqs, context, steps
            )
