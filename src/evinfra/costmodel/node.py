"""A node: one model instance on `num_gpus` GPUs, its memory budget and its links.

Modelling choices (see docs/costmodel.md):

- MoE models run attention data-parallel (DP attention) and experts expert-parallel (EP),
  as production SGLang and Dynamo deployments do: each GPU holds the full attention,
  dense-layer and shared-expert weights, 1/num_gpus of the routed experts, and the KV of
  its own sequences. KV is therefore not duplicated, and node capacity is the sum of the
  GPUs' capacities (one sequence must fit in one GPU's share: `max_seq_tokens`).
- Dense models run tensor-parallel (TP): weights and KV heads are split across GPUs; KV is
  duplicated only when there are more GPUs than KV heads (or for MLA under TP, where the
  latent is replicated on every rank).
- Device KV budget per GPU = HBM x mem_fraction - weights - an activation reserve.
- A KV transfer between nodes costs a fixed per-transfer overhead plus the slower of the
  per-block descriptor posting and the bytes over NVLink (same NVLink domain) or the NIC
  (across domains). Under DP attention one request's KV sits on one GPU, so it moves over
  that GPU's link; under TP every GPU moves its slice in parallel.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from evinfra.costmodel.catalog import get_gpu, get_model
from evinfra.costmodel.spec import AttentionKind, Dtype, GpuSpec, ModelSpec, dtype_bytes


class AttentionParallelism(enum.Enum):
    DATA = "dp"  # DP attention + EP for routed experts
    TENSOR = "tp"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int
    kv_dtype: Dtype = Dtype.FP8
    weight_dtype: Dtype | None = None  # None: the model's checkpoint dtype
    expert_weight_dtype: Dtype | None = None  # None: weight_dtype (e.g. FP4 for NVFP4 MoE)
    attention_dtype: Dtype = Dtype.BF16  # attention math (FP8 on Blackwell MLA kernels)
    mem_fraction: float = 0.9
    block_size: int = 64
    parallelism: AttentionParallelism | None = None  # None: DATA for MoE, TENSOR for dense
    activation_reserve_fraction: float = 0.04  # of HBM: peak activations of a full batch
    host_mem_fraction: float = 0.5  # of host DRAM given to the host KV tier
    transfer_overhead_s: float = 5e-4  # per transfer: handshake, notification, metadata
    descriptor_s: float = 5e-7  # per (block, layer) descriptor posted
    link_efficiency: float = 0.8  # achieved / line rate (Mooncake: 87 of 100 GB/s)

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError("num_gpus must be >= 1")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError("mem_fraction must be in (0, 1]")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.kv_dtype is Dtype.FP4:
            raise ValueError("KV dtype must be bf16 or fp8")
        if self.kv_budget_bytes_per_gpu <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.num_gpus} x {self.gpu.name}: "
                f"{self.weight_bytes_per_gpu / 1e9:.1f} GB of weights per GPU"
            )

    @classmethod
    def from_names(
        cls,
        model: str,
        gpu: str,
        num_gpus: int,
        kv_dtype: str = "fp8",
        weight_dtype: str | None = None,
        expert_weight_dtype: str | None = None,
        attention_dtype: str = "bf16",
        **options: float,
    ) -> NodeSpec:
        """Build a node from catalog names and dtype strings ('bf16', 'fp8', 'fp4')."""
        return cls(
            model=get_model(model),
            gpu=get_gpu(gpu),
            num_gpus=num_gpus,
            kv_dtype=Dtype(kv_dtype),
            weight_dtype=Dtype(weight_dtype) if weight_dtype else None,
            expert_weight_dtype=Dtype(expert_weight_dtype) if expert_weight_dtype else None,
            attention_dtype=Dtype(attention_dtype),
            **options,  # type: ignore[arg-type]
        )

    # ---- parallelism ----
    @property
    def attention_parallelism(self) -> AttentionParallelism:
        if self.parallelism is not None:
            return self.parallelism
        return AttentionParallelism.DATA if self.model.is_moe else AttentionParallelism.TENSOR

    @property
    def is_data_parallel_attention(self) -> bool:
        return self.attention_parallelism is AttentionParallelism.DATA

    @property
    def kv_duplication(self) -> int:
        """Copies of each token's KV the node holds (1 unless TP replicates it)."""
        if self.is_data_parallel_attention:
            return 1
        if self.model.attention is AttentionKind.MLA:
            return self.num_gpus
        return max(1, math.ceil(self.num_gpus / self.model.num_kv_heads))

    # ---- weights ----
    @property
    def resolved_weight_dtype(self) -> Dtype:
        return self.weight_dtype or self.model.weight_dtype

    @property
    def resolved_expert_weight_dtype(self) -> Dtype:
        return self.expert_weight_dtype or self.resolved_weight_dtype

    @property
    def weight_bytes(self) -> float:
        """Weight bytes of one copy of the model."""
        m = self.model
        w = dtype_bytes(self.resolved_weight_dtype)
        we = dtype_bytes(self.resolved_expert_weight_dtype)
        return (m.derived_params_total - m.routed_expert_params) * w + m.routed_expert_params * we

    @property
    def replicated_weight_bytes(self) -> float:
        """Weights every GPU holds in full (DP attention: attention, dense, shared)."""
        if not self.is_data_parallel_attention:
            return 0.0
        return self.model.shared_params * dtype_bytes(self.resolved_weight_dtype)

    @property
    def weight_bytes_per_gpu(self) -> float:
        replicated = self.replicated_weight_bytes
        return replicated + (self.weight_bytes - replicated) / self.num_gpus

    # ---- device KV ----
    @property
    def kv_bytes_per_token(self) -> int:
        """One copy of a token's KV (what a transfer or the host tier moves and stores)."""
        return self.model.kv_bytes_per_token(self.kv_dtype)

    @property
    def device_kv_bytes_per_token(self) -> int:
        """Device bytes a token occupies on the node, duplicates included."""
        return self.kv_bytes_per_token * self.kv_duplication

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    @property
    def activation_reserve_bytes_per_gpu(self) -> float:
        return self.activation_reserve_fraction * self.gpu.hbm_bytes

    @property
    def kv_budget_bytes_per_gpu(self) -> float:
        return (
            self.gpu.hbm_bytes * self.mem_fraction
            - self.weight_bytes_per_gpu
            - self.activation_reserve_bytes_per_gpu
        )

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.num_gpus * self.kv_budget_bytes_per_gpu // self.device_kv_bytes_per_token)

    @property
    def max_seq_tokens(self) -> int:
        """Longest sequence the device KV can hold (one GPU's share under DP attention)."""
        if self.is_data_parallel_attention:
            return int(self.kv_budget_bytes_per_gpu // self.kv_bytes_per_token)
        return self.kv_capacity_tokens

    @property
    def num_device_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    # ---- host KV tier ----
    @property
    def host_kv_bytes(self) -> float:
        return self.num_gpus * self.gpu.host_memory_bytes * self.host_mem_fraction

    @property
    def num_host_blocks(self) -> int:
        return int(self.host_kv_bytes // self.block_bytes)

    def host_transfer_time_s(self, num_bytes: int) -> float:
        """Seconds to move `num_bytes` of KV between host and device (offload or reload).
        One request's KV uses the links of the GPUs that hold it, as for `transfer_time_s`."""
        links = self.num_transfer_links * self.gpu.host_link_bytes_s * self.link_efficiency
        return num_bytes / links if num_bytes > 0 else 0.0

    # ---- KV transfer between nodes ----
    @property
    def num_transfer_links(self) -> int:
        """GPU links one request's KV moves over in parallel."""
        return 1 if self.is_data_parallel_attention else self.num_gpus

    def link_bytes_s(self, same_rack: bool) -> float:
        """Line rate one request's KV transfer can use: NVLink inside an NVLink domain (an
        NVL72 rack, or an 8-GPU HGX board), the NICs across domains."""
        per_gpu = self.gpu.nvlink_bytes_s if same_rack else self.gpu.nic_bytes_s
        return per_gpu * self.num_transfer_links

    def transfer_time_s(self, num_bytes: int, same_rack: bool) -> float:
        """Seconds to move `num_bytes` of one request's KV to another node of the same kind.

        A fixed overhead, then the slower of posting one descriptor per (block, layer) on
        each link and the bytes at the achieved link rate: posting and the wire pipeline,
        so small blocks make a transfer descriptor-bound (nixlbench's ~48 GB/s against
        ~746 GB/s raw). Zero bytes cost nothing (no transfer happens)."""
        if num_bytes <= 0:
            return 0.0
        num_blocks = math.ceil(num_bytes / self.block_bytes)
        descriptors_s = num_blocks * self.model.num_layers * self.descriptor_s
        wire_s = num_bytes / (self.link_bytes_s(same_rack) * self.link_efficiency)
        return self.transfer_overhead_s + max(descriptors_s / self.num_transfer_links, wire_s)
