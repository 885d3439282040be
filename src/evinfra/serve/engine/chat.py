"""One-sequence generation on an executor: a convenience for tests, benchmarks and
demos (a node runtime schedules many sequences itself through `execute`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from evinfra.serve.engine.executor import SeqWork, TorchExecutor
from evinfra.serve.engine.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Generation:
    token_ids: tuple[int, ...]  # generated tokens, the stop token excluded
    stopped: bool  # a stop token ended it (else max_new_tokens did)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def generate(
    executor: TorchExecutor,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    block_table: Sequence[int] | None = None,
    stop_token_ids: Collection[int] = (),
    prefill_chunk_tokens: int | None = None,
    sampling: SamplingParams | None = None,
    seq_id: int = 0,
) -> Generation:
    """Prefill `prompt_ids` (in chunks if asked) and decode up to `max_new_tokens`.

    Blocks come from `block_table`, or the first blocks of the cache when None; the
    table must cover the prompt plus the generated tokens.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    num_tokens = len(prompt_ids) + max_new_tokens
    table = (
        tuple(block_table)
        if block_table is not None
        else tuple(range(blocks_needed(num_tokens, executor.block_size)))
    )
    chunk = prefill_chunk_tokens or len(prompt_ids)
    done = 0
    next_token = 0
    while done < len(prompt_ids):
        piece = tuple(prompt_ids[done : done + chunk])
        last = done + len(piece) == len(prompt_ids)
        out = executor.execute([SeqWork(seq_id, piece, done, table, last, sampling)])
        done += len(piece)
        if last:
            next_token = out[seq_id]
    generated: list[int] = []
    while True:
        if next_token in stop_token_ids:
            return Generation(tuple(generated), stopped=True)
        generated.append(next_token)
        if len(generated) >= max_new_tokens:
            return Generation(tuple(generated), stopped=False)
        work = SeqWork(seq_id, (next_token,), done, table, True, sampling)
        next_token = executor.execute([work])[seq_id]
        done += 1
