"""Catalog figures against CATALOG.md and the published parameter counts."""

from __future__ import annotations

import dataclasses

import pytest

from evinfra.costmodel.catalog import GPUS, MODELS, get_gpu, get_model
from evinfra.costmodel.spec import AttentionKind, Dtype


@pytest.mark.parametrize(
    ("name", "bf16", "fp8"),
    [
        ("kimi-k2", 70_272, 35_136),
        ("deepseek-v3", 70_272, 35_136),
        ("llama-3-70b", 327_680, 163_840),
        ("smollm2-135m", 23_040, 11_520),
    ],
)
def test_kv_bytes_per_token_match_catalog(name: str, bf16: int, fp8: int) -> None:
    model = get_model(name)
    assert model.kv_bytes_per_token_bf16 == bf16
    assert model.kv_bytes_per_token_fp8 == fp8


def test_glm5_kv_bytes_include_the_sparse_indexer() -> None:
    glm = get_model("glm-5")
    assert glm.attention_kv_bytes_per_token(Dtype.BF16) == 89_856
    assert glm.indexer_bytes_per_token == 10_296
    assert glm.kv_bytes_per_token_bf16 == 89_856 + 10_296
    # FlashMLA's packed FP8 layout, indexer included (CATALOG.md: 61,464 packed)
    assert glm.kv_bytes_per_token_fp8 == 61_464


def test_kimi_fp8_in_flashmla_packed_layout() -> None:
    packed = dataclasses.replace(get_model("kimi-k2"), kv_fp8_packed=True)
    assert packed.kv_bytes_per_token_fp8 == 40_016


def test_fp4_kv_is_rejected() -> None:
    with pytest.raises(ValueError, match="fp4"):
        get_model("kimi-k2").kv_bytes_per_token(Dtype.FP4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_derived_parameters_match_published(name: str) -> None:
    model = MODELS[name]
    assert model.derived_params_total == pytest.approx(model.num_params_total, rel=0.05)
    assert model.derived_params_active == pytest.approx(model.num_params_active, rel=0.05)


def test_moe_structure() -> None:
    kimi = get_model("kimi-k2")
    assert kimi.is_moe and kimi.num_moe_layers == 60
    assert kimi.attention is AttentionKind.MLA
    assert kimi.routed_expert_params == 60 * 384 * 3 * 7168 * 2048
    llama = get_model("llama-3-70b")
    assert not llama.is_moe and llama.num_moe_layers == 0
    assert llama.routed_expert_params == 0


def test_mla_attention_forms() -> None:
    kimi = get_model("kimi-k2")
    # absorbed: QK over latent + rope (576), AV over latent (512), 64 heads
    assert kimi.attention_flops_per_pair(absorbed=True) == 2 * 64 * (512 + 576)
    assert kimi.attention_flops_per_pair(absorbed=False) == 2 * 64 * (128 + 64 + 128)
    assert not kimi.prefill_uses_absorbed
    assert get_model("glm-5").prefill_uses_absorbed  # sparse MLA runs MQA
    assert get_model("llama-3-70b").attention_flops_per_pair(absorbed=False) == 4 * 64 * 128


def test_registry_keys_and_sources() -> None:
    for key in ("kimi-k2", "glm-5", "llama-3-70b", "smollm2-135m", "tiny"):
        assert key in MODELS
    for key in ("gb300", "b200", "h200", "h100"):
        assert key in GPUS
    assert all(model.source for model in MODELS.values())
    assert all(gpu.source for gpu in GPUS.values())


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(KeyError, match="llama-3-70b"):
        get_model("gpt-5")
    with pytest.raises(KeyError, match="gb300"):
        get_gpu("tpu")


def test_gpu_rates() -> None:
    h100, gb300 = get_gpu("h100"), get_gpu("gb300")
    assert h100.flops(Dtype.FP4) == h100.fp8_flops  # no FP4 tensor cores on Hopper
    assert gb300.flops(Dtype.FP4) == 15_000e12
    assert gb300.flops(Dtype.BF16) == 2_500e12
    assert gb300.nic_bytes_s == 2 * get_gpu("b200").nic_bytes_s  # ConnectX-8 vs -7
    assert gb300.nvlink_domain_size == 72 and h100.nvlink_domain_size == 8
