"""A call's predicted latency with every node mixed against a prefill/decode split, from the
load the planner observes and the cost model's step times (pure arithmetic).

The planner disaggregates when the split is predicted faster, not at a fixed share of
capacity. The model, per node:

- A split's decode node steps its share of the running decodes, R / d, with nothing else:
  TPOT = step(R / d). A split's prefill node serves chunks back to back: a call's prefill
  takes its uncached tokens at the prefill rate, stretched by queueing, 1 / (1 - rho) at
  utilisation rho, and its KV then moves to the decode node over the link.
- A mixed node steps R / n decodes, and a share f of its steps also carry a prefill chunk
  (the token budget less the decode tokens), which makes those steps take mixed_step(b)
  instead of step(b). Steps per second S satisfy S * step + S * f * (mixed_step - step) =
  1 with S * f = chunks per second, so TPOT = 1 / S; a call's prefill takes its chunks at
  one mixed step each, stretched by 1 / (1 - f). Where the cost model is compute bound
  (a large MoE), a chunk step with decodes costs what the chunk alone does, so mixing
  decodes into chunk steps is nearly free, but every chunk stalls every running decode.
- The running decodes R follow Little's law, R = output tokens per second x TPOT, solved
  by fixed-point iteration; a load a configuration cannot carry predicts infinity.

A call's latency is TTFT + output tokens x TPOT, both at the observed per-call means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from evinfra.policy.evolving.rates import NodeRates

_ITERATIONS = 40


@dataclass(frozen=True, slots=True)
class ObservedLoad:
    """Work arriving now, cluster-wide."""

    prefill_tok_s: float
    """Uncached prompt tokens per second (with the queued backlog's share)."""
    output_tok_s: float
    calls_s: float
    prompt_blocks_per_call: float
    """Blocks a call's KV hand-off moves in a split."""

    @property
    def uncached_tokens_per_call(self) -> float:
        return self.prefill_tok_s / self.calls_s if self.calls_s > 0 else 0.0

    @property
    def output_tokens_per_call(self) -> float:
        return self.output_tok_s / self.calls_s if self.calls_s > 0 else 0.0


def _decoding(output_tok_s: float, tpot_of: Callable[[float], float], max_seqs: float) -> float:
    """TPOT at the fixed point R = output_tok_s * TPOT(R) of the running decodes R; inf
    when R passes `max_seqs` or TPOT is infinite (the load does not fit)."""
    running, tpot = 0.0, math.inf
    for _ in range(_ITERATIONS):
        tpot = tpot_of(max(running, 1.0))
        nxt = output_tok_s * tpot
        if not math.isfinite(tpot) or nxt > max_seqs:
            return math.inf
        if abs(nxt - running) <= 1e-3 * max(nxt, 1.0):
            return tpot
        running = nxt
    return tpot


def split_call_s(rates: NodeRates, load: ObservedLoad, num_prefill: int, num_decode: int) -> float:
    """Predicted mean call latency with `num_prefill` prefill and `num_decode` decode nodes."""
    if num_prefill < 1 or num_decode < 1:
        return math.inf
    rho = load.prefill_tok_s / (num_prefill * rates.prefill_tok_s)
    if rho >= 1.0:
        return math.inf
    ttft = rates.prefill_s(load.uncached_tokens_per_call) / (1.0 - rho)
    ttft += rates.transfer_s(math.ceil(load.prompt_blocks_per_call))

    def tpot(running: float) -> float:
        return rates.decode_step_s(max(round(running / num_decode), 1))

    tpot_s = _decoding(load.output_tok_s, tpot, num_decode * rates.max_num_seqs)
    return ttft + load.output_tokens_per_call * tpot_s


def _mixed_node(rates: NodeRates, batch: int, prefill_tok_s: float) -> tuple[float, float]:
    """(TPOT, share of steps carrying a chunk) of a mixed node decoding `batch` sequences
    while prefilling `prefill_tok_s`; (inf, 1) when prefill does not keep up."""
    step = rates.decode_step_s(batch)
    chunk_tokens = rates.chunk_tokens - batch
    if chunk_tokens <= 0:
        return math.inf, 1.0
    chunks_s = prefill_tok_s / chunk_tokens
    steps_s = (1.0 - chunks_s * (rates.mixed_step_s(batch) - step)) / step
    if steps_s <= chunks_s:
        return math.inf, 1.0
    return 1.0 / steps_s, chunks_s / steps_s


def mixed_tpot_s(rates: NodeRates, load: ObservedLoad, num_nodes: int) -> float:
    """Predicted TPOT with `num_nodes` mixed nodes sharing the load evenly; inf when they
    do not carry it."""
    if num_nodes < 1 or rates.chunk_tokens <= 0:
        return math.inf
    prefill_tok_s = load.prefill_tok_s / num_nodes

    def tpot(running: float) -> float:
        return _mixed_node(rates, max(round(running / num_nodes), 1), prefill_tok_s)[0]

    return _decoding(load.output_tok_s, tpot, num_nodes * rates.max_num_seqs)


def mixed_call_s(rates: NodeRates, load: ObservedLoad, num_nodes: int) -> float:
    """Predicted mean call latency with `num_nodes` mixed nodes sharing the load evenly."""
    tpot_s = mixed_tpot_s(rates, load, num_nodes)
    if not math.isfinite(tpot_s):
        return math.inf
    prefill_tok_s = load.prefill_tok_s / num_nodes
    batch = max(round(load.output_tok_s * tpot_s / num_nodes), 1)
    _, share = _mixed_node(rates, batch, prefill_tok_s)
    if share >= 1.0:
        return math.inf
    # a prompt shorter than a chunk rides one step, costing its share of a chunk step
    # but never less than the decode step it shares
    chunk_tokens = rates.chunk_tokens - batch
    compute_s = load.uncached_tokens_per_call / chunk_tokens * rates.mixed_step_s(batch)
    ttft = max(compute_s, rates.decode_step_s(batch)) / (1.0 - share)
    return ttft + load.output_tokens_per_call * tpot_s


def fastest_split(rates: NodeRates, load: ObservedLoad, num_nodes: int) -> tuple[int, float]:
    """(prefill nodes, predicted call seconds) of the split predicted fastest; (0, inf)
    when no split carries the load."""
    best, best_s = 0, math.inf
    for num_prefill in range(1, num_nodes):
        call_s = split_call_s(rates, load, num_prefill, num_nodes - num_prefill)
        if call_s < best_s:
            best, best_s = num_prefill, call_s
    return best, best_s


def carried_share(call_s: Callable[[ObservedLoad], float], load: ObservedLoad) -> float:
    """The largest share of `load` (its calls, prefill and output tokens per second scaled
    together, each call's size kept) for which `call_s` predicts a finite latency: 1 when
    it carries the whole load, by bisection to 1/1024 otherwise; the capacity of a layout
    against a load it cannot carry."""
    if math.isfinite(call_s(load)):
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(_SHARE_STEPS):
        mid = (lo + hi) / 2
        scaled = ObservedLoad(
            load.prefill_tok_s * mid,
            load.output_tok_s * mid,
            load.calls_s * mid,
            load.prompt_blocks_per_call,
        )
        if math.isfinite(call_s(scaled)):
            lo = mid
        else:
            hi = mid
    return lo


_SHARE_STEPS = 10
