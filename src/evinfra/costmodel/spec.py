"""Model and accelerator specifications: shapes, rates and what derives from them.

Parameter counts and KV bytes per token are *derived* from the shape; the published
figures are kept beside them (`num_params_total`, `num_params_active`) and tests check that
the two agree. The registered instances live in `catalog.py`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class AttentionKind(enum.Enum):
    GQA = "gqa"  # grouped-query attention: K and V per KV head
    MLA = "mla"  # multi-head latent attention: one compressed latent plus a RoPE key per token


class Dtype(enum.Enum):
    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"


def dtype_bytes(dtype: Dtype) -> float:
    """Bytes per element, block scales included: NVFP4 stores one FP8 scale per 16 values
    (0.5 + 1/16); FP8 weights use per-block scales small enough to ignore."""
    return {Dtype.BF16: 2.0, Dtype.FP8: 1.0, Dtype.FP4: 0.5 + 1.0 / 16.0}[dtype]


# FlashMLA's packed FP8 MLA layout per token and layer: 512 FP8 latent values, 4 FP32
# scales (one per 128 values) and the 64-value RoPE key kept in BF16 (FlashMLA README).
_FLASHMLA_FP8_BYTES_PER_LAYER = 512 + 4 * 4 + 64 * 2
# DeepSeek-sparse-attention indexer key per token and layer: FP8 key plus one FP32 scale.
_INDEXER_SCALE_BYTES = 4


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A transformer's shape. For MLA, `head_dim` is the no-RoPE query/key head dim."""

    name: str
    num_layers: int
    hidden_size: int
    attention: AttentionKind
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dense_ffn_size: int
    num_dense_layers: int
    num_params_total: float  # published figure
    num_params_active: float  # published figure
    max_context_tokens: int
    weight_dtype: Dtype  # the released checkpoint's dtype
    source: str
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    expert_ffn_size: int = 0
    tie_word_embeddings: bool = False
    sparse_top_k: int | None = None  # DeepSeek sparse attention: keys each query attends
    indexer_num_heads: int = 0
    indexer_head_dim: int = 0
    kv_fp8_packed: bool = False  # FP8 KV in FlashMLA's packed layout (sparse MLA kernels)

    # ---- structure ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def has_indexer(self) -> bool:
        return self.indexer_num_heads > 0

    @property
    def weight_bytes_per_param(self) -> float:
        return dtype_bytes(self.weight_dtype)

    # ---- KV cache ----
    @property
    def kv_elems_per_token_per_layer(self) -> int:
        if self.attention is AttentionKind.MLA:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def indexer_bytes_per_token(self) -> int:
        if not self.has_indexer:
            return 0
        return self.num_layers * (self.indexer_head_dim + _INDEXER_SCALE_BYTES)

    def attention_kv_bytes_per_token(self, dtype: Dtype) -> int:
        """Attention KV bytes per token over all layers, without the sparse indexer's keys."""
        if dtype is Dtype.BF16:
            return 2 * self.kv_elems_per_token_per_layer * self.num_layers
        if dtype is Dtype.FP8:
            if self.kv_fp8_packed:
                return _FLASHMLA_FP8_BYTES_PER_LAYER * self.num_layers
            return self.kv_elems_per_token_per_layer * self.num_layers
        raise ValueError(f"no KV cache layout for {dtype.value}")

    def kv_bytes_per_token(self, dtype: Dtype) -> int:
        """Everything a cached token occupies: attention KV plus the indexer's keys."""
        return self.attention_kv_bytes_per_token(dtype) + self.indexer_bytes_per_token

    @property
    def kv_bytes_per_token_bf16(self) -> int:
        return self.kv_bytes_per_token(Dtype.BF16)

    @property
    def kv_bytes_per_token_fp8(self) -> int:
        return self.kv_bytes_per_token(Dtype.FP8)

    # ---- parameters (derived from the shape; norms and biases ignored) ----
    @property
    def v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        h, nq = self.hidden_size, self.num_q_heads
        if self.attention is AttentionKind.GQA:
            q_o = 2 * h * nq * self.head_dim
            return q_o + 2 * h * self.num_kv_heads * self.head_dim
        qk_dim = self.head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = h * self.q_lora_rank + self.q_lora_rank * nq * qk_dim
        else:
            q = h * nq * qk_dim
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv += self.kv_lora_rank * nq * (self.head_dim + self.v_dim)
        out = nq * self.v_dim * h
        indexer = 0
        if self.has_indexer:
            q_in = self.q_lora_rank or h
            indexer = q_in * self.indexer_num_heads * self.indexer_head_dim
            indexer += h * self.indexer_head_dim + h * self.indexer_num_heads
        return q + kv + out + indexer

    @property
    def expert_params(self) -> int:
        """One routed or shared expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.expert_ffn_size

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.hidden_size * self.dense_ffn_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def routed_expert_params(self) -> int:
        """All routed experts of all MoE layers."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def routed_expert_params_per_token(self) -> int:
        return self.num_moe_layers * self.experts_per_token * self.expert_params

    @property
    def shared_params(self) -> int:
        """Weights every token runs through except the LM head: attention, dense FFN layers,
        shared experts and routers."""
        moe = self.num_moe_layers * (
            self.num_shared_experts * self.expert_params + self.hidden_size * self.num_experts
        )
        return (
            self.num_layers * self.attention_params_per_layer
            + self.num_dense_layers * self.dense_ffn_params
            + moe
        )

    @property
    def derived_params_total(self) -> int:
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.shared_params + self.routed_expert_params + self.embedding_params + head

    @property
    def derived_params_active(self) -> int:
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return (
            self.shared_params + self.routed_expert_params_per_token + self.embedding_params + head
        )

    # ---- attention arithmetic ----
    @property
    def exps_per_pair(self) -> int:
        """Softmax exponentials of one (query, key) pair in one layer: one per query head."""
        return self.num_q_heads

    def attention_flops_per_pair(self, absorbed: bool) -> int:
        """FLOPs of one (query token, attended key token) pair in one layer: QK^T and AV.

        MLA runs in two forms: `absorbed` (MQA over the latent: decode, and sparse MLA
        everywhere) and expanded multi-head (prefill of dense MLA, after decompressing the
        latent of the context)."""
        nq = self.num_q_heads
        if self.attention is AttentionKind.GQA:
            return 4 * nq * self.head_dim
        if absorbed:
            return 2 * nq * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * nq * (self.head_dim + self.qk_rope_head_dim + self.v_dim)

    @property
    def decompress_flops_per_token(self) -> int:
        """Expanded-form MLA prefill: FLOPs per layer to turn one cached latent into K/V."""
        if self.attention is not AttentionKind.MLA:
            return 0
        return 2 * self.kv_lora_rank * self.num_q_heads * (self.head_dim + self.v_dim)

    @property
    def prefill_uses_absorbed(self) -> bool:
        """SGLang and vLLM prefill dense MLA in expanded form; sparse MLA kernels are MQA."""
        return self.attention is AttentionKind.GQA or self.sparse_top_k is not None

    @property
    def indexer_flops_per_pair(self) -> int:
        return 2 * self.indexer_num_heads * self.indexer_head_dim if self.has_indexer else 0


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Per-GPU dense rates and capacities; links per direction."""

    name: str
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float  # 0: no FP4 tensor cores (FP4 weights then run at the FP8 rate)
    hbm_bytes: float
    hbm_bandwidth_bytes_s: float
    nvlink_bytes_s: float
    nvlink_domain_size: int  # GPUs that reach each other over NVLink
    nic_bytes_s: float
    host_memory_bytes: float  # host DRAM per GPU usable for a KV tier
    host_link_bytes_s: float  # host<->device, per direction
    exp_per_s: float  # softmax exponentials per second (special function units)
    source: str

    def flops(self, dtype: Dtype) -> float:
        if dtype is Dtype.BF16:
            return self.bf16_flops
        if dtype is Dtype.FP4 and self.fp4_flops > 0:
            return self.fp4_flops
        return self.fp8_flops
