"""Node memory budget, KV capacity, host tier and KV transfer times."""

from __future__ import annotations

import pytest

from evinfra.costmodel.node import AttentionParallelism, NodeSpec
from evinfra.costmodel.spec import Dtype


def test_llama_capacity_by_hand() -> None:
    node = NodeSpec.from_names("llama-3-70b", "h100", 8, kv_dtype="bf16")
    assert node.attention_parallelism is AttentionParallelism.TENSOR
    weights_per_gpu = node.model.derived_params_total * 2 / 8
    budget = 80e9 * 0.9 - weights_per_gpu - 0.04 * 80e9
    assert node.kv_capacity_tokens == int(8 * budget // 327_680)
    assert 1_000_000 < node.kv_capacity_tokens < 1_500_000
    assert node.num_device_blocks == node.kv_capacity_tokens // 64


def test_fp8_kv_doubles_capacity() -> None:
    bf16 = NodeSpec.from_names("llama-3-70b", "h100", 8, kv_dtype="bf16")
    fp8 = NodeSpec.from_names("llama-3-70b", "h100", 8, kv_dtype="fp8")
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, abs=2)


def test_moe_defaults_to_dp_attention_without_duplication() -> None:
    node = NodeSpec.from_names("kimi-k2", "gb300", 8)
    assert node.is_data_parallel_attention
    assert node.kv_duplication == 1
    # every GPU holds the attention/dense/shared weights in full
    assert node.weight_bytes_per_gpu > node.model.shared_params * 1.0
    assert node.max_seq_tokens == pytest.approx(node.kv_capacity_tokens / 8, rel=1e-6)
    assert node.kv_capacity_tokens > 10_000_000


def test_mla_under_tensor_parallelism_replicates_the_latent() -> None:
    dp = NodeSpec.from_names("kimi-k2", "gb300", 8)
    tp = NodeSpec(model=dp.model, gpu=dp.gpu, num_gpus=8, parallelism=AttentionParallelism.TENSOR)
    assert tp.kv_duplication == 8
    assert tp.device_kv_bytes_per_token == 8 * tp.kv_bytes_per_token
    assert tp.kv_capacity_tokens < dp.kv_capacity_tokens / 5


def test_gqa_duplicates_only_beyond_kv_heads() -> None:
    spec = NodeSpec.from_names("smollm2-135m", "h100", 1)
    assert spec.kv_duplication == 1
    wide = NodeSpec(model=spec.model, gpu=spec.gpu, num_gpus=6)
    assert wide.kv_duplication == 2  # 3 KV heads on 6 GPUs


def test_weights_that_do_not_fit_are_rejected() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        NodeSpec.from_names("kimi-k2", "h100", 1)


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        NodeSpec.from_names("tiny", "h100", 0)
    with pytest.raises(ValueError):
        NodeSpec.from_names("tiny", "h100", 1, kv_dtype="fp4")
    with pytest.raises(ValueError):
        NodeSpec.from_names("tiny", "h100", 1, mem_fraction=1.5)


def test_fp4_experts_shrink_weights() -> None:
    fp8 = NodeSpec.from_names("deepseek-v3", "gb200", 8)
    fp4 = NodeSpec.from_names("deepseek-v3", "gb200", 8, expert_weight_dtype="fp4")
    assert fp4.resolved_expert_weight_dtype is Dtype.FP4
    assert fp4.weight_bytes < 0.6 * fp8.weight_bytes
    assert fp4.kv_capacity_tokens > fp8.kv_capacity_tokens


def test_host_tier_blocks() -> None:
    node = NodeSpec.from_names("kimi-k2", "gb300", 8)
    expected = 8 * 240e9 * 0.5 // (64 * node.kv_bytes_per_token)
    assert node.num_host_blocks == int(expected)
    assert node.host_transfer_time_s(0) == 0.0
    assert node.host_transfer_time_s(10**9) == pytest.approx(1e9 / (450e9 * 0.8))


def test_transfer_time_properties() -> None:
    node = NodeSpec.from_names("kimi-k2", "gb300", 8, block_size=1024)
    assert node.transfer_time_s(0, same_rack=False) == 0.0
    small = node.transfer_time_s(10**6, same_rack=False)
    large = node.transfer_time_s(10**9, same_rack=False)
    assert node.transfer_overhead_s < small < large
    assert node.transfer_time_s(10**9, same_rack=True) < large


def test_transfer_catalog_example_128k_kimi_fp8() -> None:
    # CATALOG.md: a 128K-token Kimi request in FP8 is ~4.6 GB, ~46 ms at 100 GB/s.
    node = NodeSpec.from_names("kimi-k2", "gb300", 8, block_size=1024)
    num_bytes = 131_072 * node.kv_bytes_per_token
    assert num_bytes == pytest.approx(4.6e9, rel=0.01)
    wire_s = num_bytes / (100e9 * 0.8)  # large blocks: wire-bound
    assert node.transfer_time_s(num_bytes, same_rack=False) == pytest.approx(
        node.transfer_overhead_s + wire_s
    )


def test_small_blocks_make_transfers_descriptor_bound() -> None:
    big = NodeSpec.from_names("kimi-k2", "gb300", 8, block_size=1024)
    tiny = NodeSpec.from_names("kimi-k2", "gb300", 8, block_size=16)
    num_bytes = 131_072 * big.kv_bytes_per_token
    tiny_s = tiny.transfer_time_s(num_bytes, same_rack=True)
    num_descriptors = (131_072 // 16) * 61
    assert tiny_s == pytest.approx(tiny.transfer_overhead_s + num_descriptors * 5e-7)
    assert tiny_s > 3 * big.transfer_time_s(num_bytes, same_rack=True)
