"""Catalog of models and accelerators: the registered shapes and rates.

Figures come from /work/shared/CATALOG.md (its sources are repeated in each `source`)
unless a comment names another. `get_model` / `get_gpu` look entries up by name.
"""

from __future__ import annotations

from evinfra.costmodel.spec import AttentionKind, Dtype, GpuSpec, ModelSpec, dtype_bytes

_KIMI_SOURCE = (
    "CATALOG.md: github.com/MoonshotAI/Kimi-K2 README, NVIDIA Megatron-Bridge Kimi provider "
    "docs, K2 config.json"
)
_GLM_SOURCE = "CATALOG.md: GLM-5 config.json, GLM-5 report table, FlashMLA README (FP8 layout)"

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="kimi-k2",
            num_layers=61,  # first 1 dense
            hidden_size=7168,
            attention=AttentionKind.MLA,
            num_q_heads=64,
            num_kv_heads=1,  # one shared latent per token
            head_dim=128,  # qk nope
            qk_rope_head_dim=64,
            q_lora_rank=1536,
            kv_lora_rank=512,
            v_head_dim=128,
            num_experts=384,
            experts_per_token=8,
            num_shared_experts=1,
            expert_ffn_size=2048,
            dense_ffn_size=18432,
            num_dense_layers=1,
            vocab_size=163_840,
            num_params_total=1.03e12,
            num_params_active=32e9,
            # 128K for K2-0711; 256K for K2-0905, K2-Thinking and later (CATALOG.md)
            max_context_tokens=262_144,
            weight_dtype=Dtype.FP8,  # block-FP8 release; K2-Thinking experts ship INT4
            source=_KIMI_SOURCE,
        ),
        ModelSpec(
            name="glm-5",
            num_layers=78,  # 3 dense + 75 MoE; the MTP layer is not counted
            hidden_size=6144,
            attention=AttentionKind.MLA,
            num_q_heads=64,
            num_kv_heads=1,
            head_dim=192,
            qk_rope_head_dim=64,
            q_lora_rank=2048,
            kv_lora_rank=512,
            v_head_dim=256,
            num_experts=256,
            experts_per_token=8,
            num_shared_experts=1,
            expert_ffn_size=2048,
            dense_ffn_size=12288,
            num_dense_layers=3,
            vocab_size=154_880,
            num_params_total=744e9,
            num_params_active=40e9,  # 5.2: sources say 32-40B
            max_context_tokens=202_752,  # ~200K (5.2: 1M)
            weight_dtype=Dtype.FP8,  # the FP8 release, as in the 8 x B200 figure
            sparse_top_k=2048,  # DeepSeek sparse attention
            indexer_num_heads=32,
            indexer_head_dim=128,
            kv_fp8_packed=True,
            source=_GLM_SOURCE,
        ),
        ModelSpec(
            name="deepseek-v3",  # the model of the SGLang calibration figures (also R1)
            num_layers=61,  # first 3 dense
            hidden_size=7168,
            attention=AttentionKind.MLA,
            num_q_heads=128,
            num_kv_heads=1,
            head_dim=128,
            qk_rope_head_dim=64,
            q_lora_rank=1536,
            kv_lora_rank=512,
            v_head_dim=128,
            num_experts=256,
            experts_per_token=8,
            num_shared_experts=1,
            expert_ffn_size=2048,
            dense_ffn_size=18432,
            num_dense_layers=3,
            vocab_size=129_280,
            num_params_total=671e9,
            num_params_active=37e9,
            max_context_tokens=131_072,
            weight_dtype=Dtype.FP8,
            source="DeepSeek-V3 config.json and technical report (public); brief of this task",
        ),
        ModelSpec(
            name="llama-3-70b",
            num_layers=80,
            hidden_size=8192,
            attention=AttentionKind.GQA,
            num_q_heads=64,
            num_kv_heads=8,
            head_dim=128,
            dense_ffn_size=28672,
            num_dense_layers=80,
            vocab_size=128_256,
            num_params_total=70.6e9,
            num_params_active=70.6e9,
            max_context_tokens=8192,
            weight_dtype=Dtype.BF16,
            source="CATALOG.md: Llama-3-70B config.json",
        ),
        ModelSpec(
            name="smollm2-135m",
            num_layers=30,
            hidden_size=576,
            attention=AttentionKind.GQA,
            num_q_heads=9,
            num_kv_heads=3,
            head_dim=64,
            dense_ffn_size=1536,
            num_dense_layers=30,
            vocab_size=49_152,
            tie_word_embeddings=True,
            num_params_total=135e6,
            num_params_active=135e6,
            max_context_tokens=8192,
            weight_dtype=Dtype.BF16,
            source="CATALOG.md: SmolLM2-135M config.json",
        ),
        ModelSpec(
            name="tiny",  # a test model: its published figures are its derived ones
            num_layers=2,
            hidden_size=64,
            attention=AttentionKind.GQA,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=16,
            dense_ffn_size=128,
            num_dense_layers=2,
            vocab_size=512,
            tie_word_embeddings=True,
            num_params_total=106_496,
            num_params_active=106_496,
            max_context_tokens=2048,
            weight_dtype=Dtype.BF16,
            source="evinfra test model (no external source)",
        ),
    )
}

_HOPPER_SOURCE = (
    "CATALOG.md accelerator table (NVIDIA spec sheets, dense rates); host memory: DGX H100/H200 "
    "datasheet, 2 TB per 8 GPUs; host link: PCIe Gen5 x16, 64 GB/s per direction"
)
_NVL72_SOURCE = (
    "CATALOG.md: NVIDIA 'Inside Blackwell Ultra' blog, NVL72 reference architecture; Grace "
    "~480 GB LPDDR5X per 2 GPUs, NVLink-C2C 900 GB/s bidirectional"
)

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="h100",
            bf16_flops=989e12,
            fp8_flops=1979e12,
            fp4_flops=0.0,
            hbm_bytes=80e9,
            hbm_bandwidth_bytes_s=3.35e12,
            nvlink_bytes_s=450e9,
            nvlink_domain_size=8,
            nic_bytes_s=50e9,  # 400 Gb/s ConnectX-7
            host_memory_bytes=256e9,
            host_link_bytes_s=64e9,
            exp_per_s=3.9e12,  # 132 SMs x 16 MUFU ex2 per clock x ~1.83 GHz
            source=_HOPPER_SOURCE,
        ),
        GpuSpec(
            name="h200",
            bf16_flops=989e12,
            fp8_flops=1979e12,
            fp4_flops=0.0,
            hbm_bytes=141e9,
            hbm_bandwidth_bytes_s=4.8e12,
            nvlink_bytes_s=450e9,
            nvlink_domain_size=8,
            nic_bytes_s=50e9,
            host_memory_bytes=256e9,
            host_link_bytes_s=64e9,
            exp_per_s=3.9e12,  # 132 SMs x 16 MUFU ex2 per clock x ~1.83 GHz
            source=_HOPPER_SOURCE,
        ),
        GpuSpec(
            name="b200",
            bf16_flops=2250e12,
            fp8_flops=4500e12,
            fp4_flops=9000e12,
            hbm_bytes=180e9,
            hbm_bandwidth_bytes_s=8e12,
            nvlink_bytes_s=900e9,
            nvlink_domain_size=8,
            nic_bytes_s=50e9,
            host_memory_bytes=256e9,  # DGX B200 datasheet: 2 TB per 8 GPUs
            host_link_bytes_s=64e9,
            exp_per_s=5.35e12,  # half of Blackwell Ultra ("2x attention-layer acceleration")
            source="CATALOG.md accelerator table; DGX B200 datasheet (host memory)",
        ),
        GpuSpec(
            name="gb200",
            bf16_flops=2500e12,
            fp8_flops=5000e12,
            fp4_flops=10000e12,
            hbm_bytes=186e9,
            hbm_bandwidth_bytes_s=8e12,
            nvlink_bytes_s=900e9,
            nvlink_domain_size=72,
            nic_bytes_s=50e9,
            host_memory_bytes=240e9,
            host_link_bytes_s=450e9,
            exp_per_s=5.35e12,  # half of Blackwell Ultra ("2x attention-layer acceleration")
            source=_NVL72_SOURCE,
        ),
        GpuSpec(
            name="gb300",
            bf16_flops=2500e12,
            fp8_flops=5000e12,
            fp4_flops=15000e12,
            hbm_bytes=279e9,  # 288 GB, 279 usable
            hbm_bandwidth_bytes_s=8e12,
            nvlink_bytes_s=900e9,
            nvlink_domain_size=72,
            nic_bytes_s=100e9,  # 800 Gb/s ConnectX-8
            host_memory_bytes=240e9,
            host_link_bytes_s=450e9,
            exp_per_s=10.7e12,  # "Inside Blackwell Ultra": 10.7 TeraExponentials/s
            source=_NVL72_SOURCE,
        ),
    )
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None


def get_gpu(name: str) -> GpuSpec:
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}; known: {sorted(GPUS)}") from None


__all__ = [
    "GPUS",
    "MODELS",
    "AttentionKind",
    "Dtype",
    "GpuSpec",
    "ModelSpec",
    "dtype_bytes",
    "get_gpu",
    "get_model",
]
