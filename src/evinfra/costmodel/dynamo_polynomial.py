"""The timing model of Dynamo's mocker engine (its default `Polynomial` perf model).

    prefill_ms = 4.209989e-7 * T^2 + 0.01518344 * T + 16.50142   (T > 0, else 0)
    decode_ms  = max(1, -25.74 * u^2 + 54.01 * u + 5.74)          (decode seqs > 0, else 0)

T is the number of uncached (new) tokens prefilled in the pass, summed over the batch:
Dynamo's vLLM mocker passes (batch size, mean prompt length, mean cached prefix) and the
polynomial sees batch size x (mean prompt - mean prefix); its SGLang mocker sums each
request's extend length. Both equal the total new tokens (Dynamo's integer means can differ
from the exact total by less than one token per request). u is the KV utilisation: active KV
tokens over the KV capacity in tokens, capped at 1. A fully cached prompt costs no prefill
time.

A pass that holds both prefill chunks and decode sequences lasts prefill_ms + decode_ms
(the mocker runs the pass's prefill, then its decode token). Times are divided by
`speedup_ratio` (decode by `speedup_ratio * decode_speedup_ratio`), as the mocker's
`--speedup-ratio` / `--decode-speedup-ratio` do.

Source: Dynamo mocker PerfModel (docs.rs dynamo-mocker, lib/mocker in ai-dynamo/dynamo;
the polynomial now lives in AISimulate) and its documentation pages. Read, not copied.
"""

from __future__ import annotations

import enum

import numpy as np
import numpy.typing as npt

from evinfra.costmodel.base import BatchShape, NodeKV
from evinfra.costmodel.node import NodeSpec

PREFILL_MS_COEFFS = (16.50142, 0.01518344, 4.209989e-7)  # a + b*T + c*T^2
DECODE_MS_COEFFS = (5.74, 54.01, -25.74)  # a + b*u + c*u^2, floored at MIN_DECODE_MS
MIN_DECODE_MS = 1.0
MAX_UTILISATION = 1.0
"""u is capped here: the decoding contexts can sum past the KV capacity when sequences
share a prefix, and Dynamo 1.6.1's mocker then decodes at the polynomial's value at 1
(34.01 ms), not on its falling branch (measured: `benchmarks/dynamo/decode_probe.py`)."""


class UtilisationSource(enum.Enum):
    """What counts as 'active KV tokens' for u."""

    KV_IN_USE = "kv_in_use"  # tokens held in device KV (BatchShape.num_kv_tokens_in_use)
    DECODE_CONTEXT = "decode_context"  # the decoding sequences' contexts (newer mockers)


def prefill_ms(num_new_tokens: int) -> float:
    """The mocker's prefill polynomial, unscaled."""
    if num_new_tokens <= 0:
        return 0.0
    a, b, c = PREFILL_MS_COEFFS
    t = float(num_new_tokens)
    return c * t * t + b * t + a


def decode_ms(utilisation: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """The mocker's decode polynomial at KV utilisation `utilisation`, unscaled."""
    u = np.asarray(utilisation, dtype=np.float64)
    a, b, c = DECODE_MS_COEFFS
    return np.maximum(MIN_DECODE_MS, c * u * u + b * u + a)


class DynamoPolynomialCostModel(NodeKV):
    """Implements `CostModel` with Dynamo's mocker timing, for side-by-side runs."""

    def __init__(
        self,
        node: NodeSpec,
        speedup_ratio: float = 1.0,
        decode_speedup_ratio: float = 1.0,
        kv_capacity_tokens: int | None = None,
        utilisation_source: UtilisationSource | str = UtilisationSource.DECODE_CONTEXT,
    ) -> None:
        if speedup_ratio <= 0 or decode_speedup_ratio <= 0:
            raise ValueError("speedup ratios must be > 0")
        self.node = node
        self.speedup_ratio = speedup_ratio
        self.decode_speedup_ratio = decode_speedup_ratio
        self._kv_capacity_tokens = kv_capacity_tokens or node.kv_capacity_tokens
        if self._kv_capacity_tokens <= 0:
            raise ValueError("kv_capacity_tokens must be > 0")
        self.utilisation_source = UtilisationSource(utilisation_source)

    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv_capacity_tokens

    def _active_tokens(self, context_tokens: int, kv_tokens: int) -> int:
        if self.utilisation_source is UtilisationSource.KV_IN_USE:
            return kv_tokens
        return context_tokens

    def _decode_s(self, active_tokens: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        scale = 1e-3 / (self.speedup_ratio * self.decode_speedup_ratio)
        u = np.minimum(active_tokens / self._kv_capacity_tokens, MAX_UTILISATION)
        return decode_ms(u) * scale

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds of one pass: prefill polynomial on the new tokens plus, when sequences
        decode, the decode polynomial at the current KV utilisation."""
        total = prefill_ms(batch.num_prefill_tokens) * 1e-3 / self.speedup_ratio
        if batch.num_decode_seqs > 0:
            active = self._active_tokens(
                batch.num_decode_context_tokens, batch.num_kv_tokens_in_use
            )
            total += float(self._decode_s(np.array([float(active)]))[0])
        return total

    def decode_run_time_s(
        self, num_seqs: int, num_context_tokens: int, num_kv_tokens: int, num_steps: int
    ) -> float:
        """Seconds of `num_steps` decode passes; each adds `num_seqs` tokens to the KV in
        use and to the contexts. Vectorised over the steps."""
        if num_steps <= 0 or num_seqs <= 0:
            return 0.0
        start = self._active_tokens(num_context_tokens, num_kv_tokens)
        active = start + num_seqs * np.arange(num_steps, dtype=np.float64)
        return float(self._decode_s(active).sum())
