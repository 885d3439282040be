"""Per-worker performance at the SLA: what Dynamo's planner reads from pre-deployment
profiling (`docs/architecture/sla_planner.md`, "Pre-Deployment Profiling"; the prefill and
decode interpolators of `components/src/dynamo/planner/utils/perf_interpolation.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from evinfra.costmodel.base import BatchShape, CostModel, PrefillChunk


class WorkerProfile(Protocol):
    """One worker's (one engine's) profiled performance. Rates are per worker, not per GPU."""

    def prefill_tokens_per_s_at_ttft(self, ttft_target_s: float) -> float:
        """Prompt tokens per second one prefill worker sustains while meeting the TTFT target."""

    def decode_tokens_per_s_at_itl(self, itl_target_s: float, context_tokens: float) -> float:
        """Output tokens per second one decode worker sustains at the ITL target when its
        sequences hold `context_tokens` of context on average."""

    def expected_ttft_s(self, num_prompt_tokens: float) -> float:
        """Profiled TTFT of one prompt of that length (the prefill correction's denominator)."""

    def expected_itl_s(self, num_concurrent_seqs: float, context_tokens: float) -> float:
        """Profiled ITL at that per-worker concurrency and context (the decode correction's
        denominator)."""


@dataclass(frozen=True, slots=True)
class LinearWorkerProfile:
    """A profile from two rates: prefill runs one prompt at a time at `prefill_tok_s`
    (Dynamo's prefill engines run at batch size 1, `docs/performance/tuning.md`);
    decode saturates at `decode_tok_s`, with a single-stream floor `min_itl_s`."""

    prefill_tok_s: float
    decode_tok_s: float
    min_itl_s: float = 0.0

    def __post_init__(self) -> None:
        if self.prefill_tok_s <= 0 or self.decode_tok_s <= 0:
            raise ValueError(f"profile rates must be > 0, got {self}")
        if self.min_itl_s < 0:
            raise ValueError(f"min_itl_s must be >= 0, got {self}")

    def prefill_tokens_per_s_at_ttft(self, ttft_target_s: float) -> float:
        return self.prefill_tok_s

    def decode_tokens_per_s_at_itl(self, itl_target_s: float, context_tokens: float) -> float:
        # ITL = max(min_itl, seqs / rate): at any reachable target the worker runs `rate`
        return self.decode_tok_s

    def expected_ttft_s(self, num_prompt_tokens: float) -> float:
        return num_prompt_tokens / self.prefill_tok_s

    def expected_itl_s(self, num_concurrent_seqs: float, context_tokens: float) -> float:
        return max(self.min_itl_s, num_concurrent_seqs / self.decode_tok_s)


@dataclass(frozen=True, slots=True)
class CostModelProfile:
    """The profile Dynamo's pre-deployment profiling sweep would measure, taken from the
    cluster's cost model: prefill one prompt at a time, decode at the largest batch whose
    step meets the ITL target."""

    cost: CostModel
    max_num_seqs: int
    nominal_isl_tokens: int = 8192

    def prefill_tokens_per_s_at_ttft(self, ttft_target_s: float) -> float:
        return self.nominal_isl_tokens / self.expected_ttft_s(self.nominal_isl_tokens)

    def _decode_step_s(self, num_seqs: int, context_tokens: float) -> float:
        ctx = int(num_seqs * context_tokens)
        kv = min(ctx, self.cost.kv_capacity_tokens)
        return self.cost.step_time_s(BatchShape((), num_seqs, ctx, kv))

    def decode_tokens_per_s_at_itl(self, itl_target_s: float, context_tokens: float) -> float:
        best = 1.0 / self._decode_step_s(1, context_tokens)
        b = 2
        while b <= self.max_num_seqs:
            step = self._decode_step_s(b, context_tokens)
            if step > itl_target_s:
                break
            best = max(best, b / step)
            b *= 2
        return best

    def expected_ttft_s(self, num_prompt_tokens: float) -> float:
        n = max(int(num_prompt_tokens), 1)
        return self.cost.step_time_s(BatchShape((PrefillChunk(n, 0),)))

    def expected_itl_s(self, num_concurrent_seqs: float, context_tokens: float) -> float:
        return self._decode_step_s(max(int(num_concurrent_seqs), 1), context_tokens)
