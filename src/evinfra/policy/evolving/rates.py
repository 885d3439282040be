"""Latency predictions a policy makes from the cost model (pure arithmetic)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from evinfra.costmodel.base import BatchShape, CostModel, PrefillChunk
from evinfra.policy.bundle import ClusterShape


@dataclass(frozen=True, slots=True)
class NodeRates:
    """A node's prefill throughput, decode step time and the KV link, from the cost model."""

    prefill_tok_s: float
    decode_step_s_at: tuple[tuple[int, float], ...]
    """(batch size, step seconds at a typical context), increasing batch sizes."""
    bytes_per_block: int
    link_bytes_s: float
    link_overhead_s: float
    max_num_seqs: int
    kv_capacity_blocks: int
    chunk_tokens: int = 0
    """The per-step token budget: a mixed step's decodes plus its prefill chunk."""
    mixed_step_s_at: tuple[tuple[int, float], ...] = ()
    """(batch size, seconds of a step carrying that many decodes and a chunk of the rest of
    the budget); without them a mixed step costs the chunk's prefill plus the decode step."""

    def prefill_s(self, num_tokens: float) -> float:
        return num_tokens / self.prefill_tok_s

    def transfer_s(self, num_blocks: int) -> float:
        if num_blocks <= 0:
            return 0.0
        return self.link_overhead_s + num_blocks * self.bytes_per_block / self.link_bytes_s

    def decode_step_s(self, num_seqs: int) -> float:
        """Step time at `num_seqs` running (interpolated in the measured points)."""
        return _interpolate(self.decode_step_s_at, num_seqs)

    def mixed_step_s(self, num_seqs: int) -> float:
        """Time of a step with `num_seqs` decodes and a prefill chunk filling the budget."""
        if not self.mixed_step_s_at:
            chunk = max(self.chunk_tokens - num_seqs, 0)
            return self.prefill_s(chunk) + self.decode_step_s(num_seqs)
        return _interpolate(self.mixed_step_s_at, num_seqs)

    def decode_tok_s_at_itl(self, itl_s: float) -> float:
        """Output tokens per second one node sustains with steps no longer than `itl_s`."""
        best = 0.0
        for b, t in self.decode_step_s_at:
            if t <= itl_s:
                best = max(best, b / t)
        if best == 0.0:
            b, t = self.decode_step_s_at[0]
            best = b / t
        return best


def _interpolate(points: tuple[tuple[int, float], ...], num_seqs: int) -> float:
    """Linear between the points; flat below the first, proportional past the last."""
    if num_seqs <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in itertools.pairwise(points):
        if num_seqs <= b1:
            return t0 + (t1 - t0) * (num_seqs - b0) / (b1 - b0)
    return points[-1][1] * num_seqs / points[-1][0]


def _rates(cost: CostModel, shape: ClusterShape, context_tokens: int) -> NodeRates:
    chunk = shape.max_num_batched_tokens
    t = cost.step_time_s(BatchShape((PrefillChunk(chunk, context_tokens),)))
    points, mixed = [], []
    b = 1
    while b <= shape.max_num_seqs:
        kv = min(b * context_tokens, cost.kv_capacity_tokens)
        step = cost.step_time_s(BatchShape((), b, b * context_tokens, kv))
        points.append((b, step))
        if b < chunk:
            prefill = (PrefillChunk(chunk - b, context_tokens),)
            mixed.append((b, cost.step_time_s(BatchShape(prefill, b, b * context_tokens, kv))))
        b *= 2
    bytes_per_block = shape.block_size * shape.kv_bytes_per_token
    probe = 1 << 30
    if shape.transfer_time_s is not None:
        overhead = shape.transfer_time_s(0)
        link = probe / max(shape.transfer_time_s(probe) - overhead, 1e-12)
    else:
        overhead, link = 1e-3, 50e9
    return NodeRates(
        chunk / t,
        tuple(points),
        bytes_per_block,
        link,
        overhead,
        shape.max_num_seqs,
        shape.num_device_blocks_per_node,
        chunk,
        tuple(mixed),
    )


def node_rates(shape: ClusterShape, context_tokens: int = 8192) -> NodeRates:
    """Rates of the cluster's nodes at a typical context; raises ValueError without a cost
    model (the evolving policies predict latency and need one)."""
    if shape.cost_model is None:
        raise ValueError("the evolving system needs the cluster's cost model (shape.cost_model)")
    return _rates(shape.cost_model, shape, context_tokens)
