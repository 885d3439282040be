"""Roofline step times: per step, the slower of compute and memory traffic, plus the
exposed part of the inter-GPU communication and fixed overheads.

    core  = max(compute_s, memory_s)
    step  = max(core, overlap * comm_s) + (1 - overlap) * comm_s
            + step_overhead_s + num_layers * layer_overhead_s

compute_s: 2 FLOPs per weight per token (attention projections, dense and shared FFN,
routed experts actually chosen, LM head for tokens that need logits) plus attention over
each sequence's context (a prefill chunk of n tokens on c cached tokens attends causally:
sum of (c + i) for i = 1..n; MLA decode attends in the absorbed latent form; dense-MLA
prefill in expanded form after decompressing the cached latents; sparse attention caps the
keys per query at top-k and adds its indexer over the full context). Each dtype runs at its
own peak rate, and attention is also bounded by the softmax exponentials the special
function units can compute (Blackwell Ultra doubled them); prefill and decode tokens have
separate efficiencies.

memory_s: weights read once per step (under DP attention every GPU reads the replicated
attention, dense and shared weights; routed experts only where touched: per MoE layer the
expected number of distinct experts chosen by T tokens each picking k of E is
E * (1 - (1 - k/E)^T)) plus the KV read by attention and written for new tokens.

comm_s: expert-parallel dispatch (FP8) and combine (BF16) of each token to its k experts
(DP attention), or two all-reduces per layer (TP), over NVLink inside the NVLink domain and
the NIC beyond it.

All work is spread evenly over the node's GPUs. See docs/costmodel.md for the calibration
of the efficiency factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from evinfra.costmodel.base import BatchShape, NodeKV, PrefillChunk
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.spec import Dtype, dtype_bytes

FloatArray = npt.NDArray[np.float64]
Contexts = TypeVar("Contexts", float, FloatArray)
"""One decode context sum, or an array of them."""

_DISPATCH_BYTES_PER_ELEM = 1.0 + 4.0 / 128  # FP8 activations with one FP32 scale per 128
_COMBINE_BYTES_PER_ELEM = 2.0  # BF16
_MAX_RUN_MEMOS = 64
_MAX_FLOAT_RUN_STEPS = 32
"""Decode runs up to this long are evaluated in Python floats, about 0.6 us a step, where
numpy's 20 array operations cost about 10 us whatever the length (12 to 32 time alike)."""
_MAX_FOLD_STEPS = 7
"""numpy sums up to 7 float64 values as a left fold (pairwise from 8 on), so up to 7 step
times are summed in Python floats (test_roofline_exact pins it)."""


@dataclass(frozen=True, slots=True)
class RooflineEfficiency:
    """Fractions of peak achieved, and fixed costs. Defaults are the calibrated values
    (benchmarks/costmodel_calibration.py, docs/costmodel.md)."""

    prefill_flops: float = 0.4  # MFU of prefill tokens' matmuls and attention
    decode_flops: float = 0.35  # decode: skinny GEMMs, split-KV attention kernels
    hbm: float = 0.75  # achieved / peak HBM bandwidth
    link: float = 0.7  # achieved / line rate for all-to-all and all-reduce
    comm_overlap: float = 0.5  # share of communication hidden under compute (two-batch overlap)
    step_overhead_s: float = 2e-3  # scheduling, sampling, launch of one step
    layer_overhead_s: float = 2e-5  # per layer: kernel gaps, collective latency

    def __post_init__(self) -> None:
        for name in ("prefill_flops", "decode_flops", "hbm", "link"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0.0 <= self.comm_overlap <= 1.0:
            raise ValueError("comm_overlap must be in [0, 1]")
        if self.step_overhead_s < 0 or self.layer_overhead_s < 0:
            raise ValueError("overheads must be >= 0")


def causal_pairs(num_context_tokens: int, num_new_tokens: int, cap: int | None) -> int:
    """(query, key) pairs of a chunk of `num_new_tokens` after `num_context_tokens`: query i
    (1-based) attends to context + i keys, at most `cap` (sparse attention's top-k)."""
    lo, hi = num_context_tokens + 1, num_context_tokens + num_new_tokens
    if num_new_tokens <= 0:
        return 0
    if cap is None or hi <= cap:
        return (lo + hi) * num_new_tokens // 2
    if lo > cap:
        return cap * num_new_tokens
    return (lo + cap) * (cap - lo + 1) // 2 + cap * (hi - cap)


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    compute_s: float
    memory_s: float
    comm_s: float
    fixed_s: float
    total_s: float

    @property
    def bound(self) -> str:
        """What limits the step: 'compute', 'memory' or 'comm'."""
        parts = {"compute": self.compute_s, "memory": self.memory_s, "comm": self.comm_s}
        return max(parts, key=lambda k: parts[k])


class RooflineCostModel(NodeKV):
    """Implements `CostModel` for one node."""

    def __init__(self, node: NodeSpec, efficiency: RooflineEfficiency | None = None) -> None:
        self.node = node
        self.efficiency = efficiency or RooflineEfficiency()
        m, gpu, p = node.model, node.gpu, node.num_gpus
        self._cap = m.sparse_top_k
        w_rate = gpu.flops(node.resolved_weight_dtype)
        e_rate = gpu.flops(node.resolved_expert_weight_dtype)
        a_rate = gpu.flops(node.attention_dtype)
        layers = m.num_layers
        # Seconds per unit of work on one GPU at peak (divide by efficiency later).
        self._token_s = (
            2 * m.shared_params / w_rate + 2 * m.routed_expert_params_per_token / e_rate
        ) / p
        self._logit_s = 2 * m.lm_head_params / w_rate / p
        # Attention is the slower of its tensor-core FLOPs and its softmax exponentials.
        exp_s = m.exps_per_pair / gpu.exp_per_s
        prefill_flops = m.attention_flops_per_pair(absorbed=m.prefill_uses_absorbed)
        decode_flops = m.attention_flops_per_pair(absorbed=True)
        self._prefill_pair_s = layers * max(prefill_flops / a_rate, exp_s) / p
        self._decode_pair_s = layers * max(decode_flops / a_rate, exp_s) / p
        self._indexer_pair_s = layers * m.indexer_flops_per_pair / gpu.flops(Dtype.FP8) / p
        self._decompress_s = (
            0.0 if m.prefill_uses_absorbed else layers * m.decompress_flops_per_token / w_rate / p
        )
        # Bytes one GPU reads per step.
        w = dtype_bytes(node.resolved_weight_dtype)
        replicated = 1.0 if node.is_data_parallel_attention else 1.0 / p
        self._fixed_weight_bytes = m.shared_params * w * replicated + m.lm_head_params * w / p
        self._expert_bytes = (
            m.num_moe_layers * m.expert_params * dtype_bytes(node.resolved_expert_weight_dtype) / p
        )
        kv_share = node.kv_duplication / p
        self._attn_kv_bytes = m.attention_kv_bytes_per_token(node.kv_dtype) * kv_share
        self._indexer_kv_bytes = m.indexer_bytes_per_token * kv_share
        self._hbm_bytes_s = gpu.hbm_bandwidth_bytes_s * self.efficiency.hbm
        self._comm_prefill_token_s = self._comm_seconds_per_token(prefill=True)
        self._comm_decode_token_s = self._comm_seconds_per_token(prefill=False)
        self._run_memo: dict[tuple[int, int], FloatArray | list[float]] = {}
        """Per-step times of recent decode runs by (num_seqs, num_context_tokens)."""
        eff = self.efficiency
        self._fixed_s = eff.step_overhead_s + layers * eff.layer_overhead_s

    # ---- CostModel ----
    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds one engine step of `batch` takes (0 for an empty batch). In Python
        floats: the same operations as `_times` on one context, so the same bits."""
        if batch.is_empty:
            return 0.0
        return self._step_time_scalar(
            batch.prefill_chunks, batch.num_decode_seqs, float(batch.num_decode_context_tokens)
        )

    def decode_run_time_s(
        self, num_seqs: int, num_context_tokens: int, num_kv_tokens: int, num_steps: int
    ) -> float:
        """Seconds of `num_steps` decode steps; step i sees contexts summing to
        `num_context_tokens + i * num_seqs`. Vectorised: O(num_steps) numpy, no Python loop.
        A run's step times are remembered by (num_seqs, num_context_tokens): the simulator
        asks again for its first n steps when it cuts the run (a slice's sum is the sum of
        the same values, in the same order)."""
        if num_steps <= 0 or num_seqs <= 0:
            return 0.0
        key = (num_seqs, num_context_tokens)
        times = self._run_memo.get(key)
        if times is None or len(times) < num_steps:
            times = self._run_step_times(num_seqs, num_context_tokens, num_steps)
            memo = self._run_memo
            if len(memo) >= _MAX_RUN_MEMOS and key not in memo:
                del memo[next(iter(memo))]  # the oldest
            memo[key] = times
        if isinstance(times, list):  # at most _MAX_FOLD_STEPS
            total = 0.0
            for t in times[:num_steps]:
                total += t
            return total
        return float(times[:num_steps].sum())

    def _run_step_times(
        self, num_seqs: int, num_context_tokens: int, num_steps: int
    ) -> FloatArray | list[float]:
        """`_times` of a decode run's steps (step i: contexts summing to
        `num_context_tokens + i * num_seqs`), in Python floats for a short run: a list up to
        `_MAX_FOLD_STEPS` steps, else an array for numpy's sum."""
        if num_steps > _MAX_FLOAT_RUN_STEPS:
            contexts = num_context_tokens + num_seqs * np.arange(num_steps, dtype=np.float64)
            return self._times((), num_seqs, contexts)
        times = self._decode_times_in_floats(num_seqs, num_context_tokens, num_steps)
        return times if num_steps <= _MAX_FOLD_STEPS else np.array(times)

    def _decode_times_in_floats(
        self, num_seqs: int, num_context_tokens: int, num_steps: int
    ) -> list[float]:
        """`_times((), num_seqs, contexts)` step by step in Python floats: the same
        operations in the same order (the context-free parts once), so the same bits."""
        eff = self.efficiency
        prefill_compute_s, fixed_bytes, comm = self._fixed_parts((), num_seqs)
        hidden = eff.comm_overlap * comm
        exposed = comm - hidden
        decode_flops, hbm, fixed_s = eff.decode_flops, self._hbm_bytes_s, self._fixed_s
        decode_work = self._decode_work
        out = []
        for i in range(num_steps):
            decode_s, decode_kv = decode_work(num_seqs, num_context_tokens + num_seqs * float(i))
            compute = prefill_compute_s + decode_s / decode_flops
            memory = (fixed_bytes + decode_kv) / hbm
            out.append(max(max(compute, memory), hidden) + exposed + fixed_s)
        return out

    # ---- components ----
    def _comm_seconds_per_token(self, prefill: bool) -> float:
        """Link seconds one GPU spends per token of the node's batch.

        Expert parallelism sends each token's hidden state to its k experts and back.
        Prefill (DeepEP normal mode) sends one copy per remote NVLink domain over the NIC
        and forwards inside the domain over NVLink; decode (low-latency mode) sends one copy
        per expert straight to its GPU. Tensor parallelism all-reduces the hidden state
        twice per layer (ring: 2 (p-1)/p of the buffer per GPU)."""
        node, m, p = self.node, self.node.model, self.node.num_gpus
        if p == 1 or (node.is_data_parallel_attention and not m.is_moe):
            return 0.0
        gpu = node.gpu
        group = min(p, gpu.nvlink_domain_size)
        if not node.is_data_parallel_attention:
            buffer = m.num_layers * 2 * m.hidden_size * 2.0 * 2 * (p - 1) / p
            rate = gpu.nvlink_bytes_s if p == group else gpu.nic_bytes_s
            return buffer / p / rate / self.efficiency.link
        k = m.experts_per_token
        copy = (
            m.num_moe_layers * m.hidden_size * (_DISPATCH_BYTES_PER_ELEM + _COMBINE_BYTES_PER_ELEM)
        )
        if prefill:
            domains = -(-p // group)
            remote_domains = (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** k)
            nvlink = k * copy * (group - 1) / group
            nic = remote_domains * copy
        else:
            nvlink = k * copy * (group - 1) / p
            nic = k * copy * (p - group) / p
        seconds = max(nvlink / gpu.nvlink_bytes_s, nic / gpu.nic_bytes_s)
        return seconds / p / self.efficiency.link

    def _distinct_experts(self, num_tokens: int) -> float:
        m = self.node.model
        if not m.is_moe or num_tokens <= 0:
            return 0.0
        miss = 1.0 - m.experts_per_token / m.num_experts
        return float(m.num_experts * (1.0 - miss**num_tokens))

    def _prefill_work(self, chunks: tuple[PrefillChunk, ...]) -> tuple[float, float]:
        """(compute seconds at peak, KV bytes per GPU) of the prefill chunks."""
        compute_s = 0.0
        kv_bytes = 0.0
        for c in chunks:
            if c.num_new_tokens <= 0:
                continue
            pairs = causal_pairs(c.num_context_tokens, c.num_new_tokens, self._cap)
            compute_s += pairs * self._prefill_pair_s + self._logit_s
            compute_s += c.num_context_tokens * self._decompress_s
            if self._indexer_pair_s:
                full = causal_pairs(c.num_context_tokens, c.num_new_tokens, None)
                compute_s += full * self._indexer_pair_s
            total = c.num_context_tokens + c.num_new_tokens
            kv_bytes += total * (self._attn_kv_bytes + self._indexer_kv_bytes)
        return compute_s, kv_bytes

    def _components(
        self, chunks: tuple[PrefillChunk, ...], num_seqs: int, contexts: Contexts
    ) -> tuple[Contexts, Contexts, float]:
        """(compute seconds, memory seconds, communication seconds) of a step, for one
        decode context sum (a float: the per-step path, where a numpy call per operation
        costs more than the arithmetic) or for each sum in an array of them (same chunks,
        same number of sequences); the same operations in the same order either way, so
        the two give the same bits."""
        prefill_compute_s, fixed_bytes, comm = self._fixed_parts(chunks, num_seqs)
        decode_s, decode_kv = self._decode_work(num_seqs, contexts)
        compute = prefill_compute_s + decode_s / self.efficiency.decode_flops
        memory = (fixed_bytes + decode_kv) / self._hbm_bytes_s
        return compute, memory, comm

    def _fixed_parts(
        self, chunks: tuple[PrefillChunk, ...], num_seqs: int
    ) -> tuple[float, float, float]:
        """The parts of a step that do not depend on the decode contexts: (prefill compute
        seconds after efficiency, bytes read besides the decode KV, communication seconds)."""
        num_prefill = sum(c.num_new_tokens for c in chunks)
        prefill_s, prefill_kv = self._prefill_work(chunks)
        prefill_s += num_prefill * self._token_s
        experts = self._distinct_experts(num_prefill + num_seqs)
        weight_bytes = self._fixed_weight_bytes + experts * self._expert_bytes
        comm = num_prefill * self._comm_prefill_token_s + num_seqs * self._comm_decode_token_s
        return prefill_s / self.efficiency.prefill_flops, weight_bytes + prefill_kv, comm

    def _decode_work(self, num_seqs: int, contexts: Contexts) -> tuple[Contexts, Contexts]:
        """(compute seconds at peak, KV bytes per GPU) of the decode part of a step."""
        if num_seqs <= 0:
            return contexts * 0.0, contexts * 0.0
        attended = contexts
        if self._cap is not None:
            # Sparse attention caps keys per sequence; only the sum of contexts is
            # known, so the cap applies to the mean context.
            mean = contexts / num_seqs
            capped = (
                np.minimum(mean, float(self._cap))
                if isinstance(mean, np.ndarray)
                else min(mean, float(self._cap))
            )
            attended = num_seqs * capped
        decode_s = (
            num_seqs * (self._token_s + self._logit_s)
            + attended * self._decode_pair_s
            + contexts * self._indexer_pair_s
        )
        decode_kv = (
            attended * self._attn_kv_bytes
            + contexts * self._indexer_kv_bytes
            + num_seqs * (self._attn_kv_bytes + self._indexer_kv_bytes)
        )
        return decode_s, decode_kv

    def _step_time_scalar(
        self, chunks: tuple[PrefillChunk, ...], num_seqs: int, context: float
    ) -> float:
        """`_times` of one decode context sum, in Python floats."""
        compute, memory, comm = self._components(chunks, num_seqs, context)
        hidden = self.efficiency.comm_overlap * comm
        core = max(compute, memory)
        return max(core, hidden) + (comm - hidden) + self._fixed_s

    def _times(
        self, chunks: tuple[PrefillChunk, ...], num_seqs: int, contexts: FloatArray
    ) -> FloatArray:
        compute, memory, comm = self._components(chunks, num_seqs, contexts)
        hidden = self.efficiency.comm_overlap * comm
        core = np.maximum(compute, memory)
        total: FloatArray = np.maximum(core, hidden) + (comm - hidden) + self._fixed_s
        return total

    def breakdown(self, batch: BatchShape) -> StepBreakdown:
        """The parts of `step_time_s(batch)`, for reports and calibration."""
        if batch.is_empty:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0)
        contexts = np.array([float(batch.num_decode_context_tokens)])
        compute, memory, comm = self._components(
            batch.prefill_chunks, batch.num_decode_seqs, contexts
        )
        total = self._times(batch.prefill_chunks, batch.num_decode_seqs, contexts)
        return StepBreakdown(
            compute_s=float(compute[0]),
            memory_s=float(memory[0]),
            comm_s=comm,
            fixed_s=self._fixed_s,
            total_s=float(total[0]),
        )
