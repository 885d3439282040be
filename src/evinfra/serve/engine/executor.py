"""The torch executor a node runtime drives: one `execute` call is one engine step.

A step takes any mix of prefill chunks and decodes (continuous batching). Their new
tokens run as one flat batch through the decoder; each token's K/V land in the paged cache
at the slot its sequence's block table gives, and each sequence attends over its gathered
context. Block ids are the core KVPool's, so a cached prefix is simply blocks already
written: a work item whose `num_computed_tokens` covers it computes only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from evinfra.serve.engine.model import AttentionBatch, DecodeGroup, LlamaDecoder, SeqSpan
from evinfra.serve.engine.paged_kv import PagedKVCache
from evinfra.serve.engine.sampling import SamplingParams, sample_token


@dataclass(frozen=True, slots=True)
class SeqWork:
    """One sequence's share of a step.

    `token_ids` are the new tokens to compute (a prefill chunk, or the last token for a
    decode); positions start at `num_computed_tokens`, the tokens already in this
    sequence's KV. `block_table` covers at least `num_computed_tokens + len(token_ids)`
    tokens. With `sample`, a next token is drawn after this step (greedy unless
    `sampling` says otherwise).
    """

    seq_id: int
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    block_table: tuple[int, ...]
    sample: bool
    sampling: SamplingParams | None = None


class TorchExecutor:
    def __init__(
        self,
        model: LlamaDecoder,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        num_threads: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_threads is not None:
            # torch's intra-op pool is process-wide: this sets it for the whole process
            torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=dtype).eval()
        self.config = model.config
        self.cache = PagedKVCache(self.config, num_blocks, block_size, dtype, self.device)

    @property
    def num_blocks(self) -> int:
        return self.cache.num_blocks

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self.cache.kv_bytes_per_token

    @property
    def kv_bytes_per_block(self) -> int:
        return self.cache.bytes_per_block

    def execute(self, works: Sequence[SeqWork]) -> dict[int, int]:
        """Run one step; returns seq_id -> next token for the works with `sample` set.

        Mutates the KV cache: every new token's K/V is written to its slot.
        """
        logits = self.forward(works)
        return {
            work.seq_id: sample_token(
                logits[work.seq_id], work.sampling, work.num_computed_tokens + len(work.token_ids)
            )
            for work in works
            if work.sample
        }

    @torch.inference_mode()
    def forward(self, works: Sequence[SeqWork]) -> dict[int, torch.Tensor]:
        """Run one step; returns seq_id -> float32 logits of the next token (sampled works)."""
        self._check(works)
        if not works:
            return {}
        token_ids: list[int] = []
        positions: list[int] = []
        blocks: list[int] = []
        offsets: list[int] = []
        last_rows: list[int] = []
        spans: list[SeqSpan] = []
        decodes: list[tuple[int, SeqWork]] = []
        for work in works:
            start = work.num_computed_tokens
            stop = start + len(work.token_ids)
            work_blocks, work_offsets = self.cache.slots(work.block_table, start, stop)
            if len(work.token_ids) == 1:
                decodes.append((len(token_ids), work))
            else:
                spans.append(self._span(work, len(token_ids)))
            token_ids.extend(work.token_ids)
            last_rows.append(len(token_ids) - 1)
            positions.extend(range(start, stop))
            blocks.extend(work_blocks)
            offsets.extend(work_offsets)
        batch = AttentionBatch(
            self._long(blocks), self._long(offsets), tuple(spans), self._decode_group(decodes)
        )
        hidden = self.model(self._long(token_ids), self._long(positions), batch, self.cache)
        sampled = [(row, w) for row, w in zip(last_rows, works, strict=True) if w.sample]
        if not sampled:
            return {}
        logits = self.model.logits(hidden[self._long([row for row, _ in sampled])])
        return {work.seq_id: logits[i] for i, (_, work) in enumerate(sampled)}

    def _decode_group(self, decodes: list[tuple[int, SeqWork]]) -> DecodeGroup | None:
        if not decodes:
            return None
        bs = self.block_size
        lengths = [w.num_computed_tokens + 1 for _, w in decodes]
        max_blocks = -(-max(lengths) // bs)
        # block 0 pads short tables; the key mask hides whatever it holds
        index = [
            list(w.block_table[: -(-n // bs)]) + [0] * (max_blocks - -(-n // bs))
            for (_, w), n in zip(decodes, lengths, strict=True)
        ]
        key_pos = torch.arange(max_blocks * bs, device=self.device)
        mask = key_pos[None, :] < self._long(lengths)[:, None]
        return DecodeGroup(
            rows=self._long([row for row, _ in decodes]),
            block_index=self._long([i for row in index for i in row]).view(len(decodes), -1),
            key_mask=mask[:, None, None, :],
        )

    def _span(self, work: SeqWork, query_start: int) -> SeqSpan:
        num_new = len(work.token_ids)
        num_context = work.num_computed_tokens + num_new
        mask: torch.Tensor | None = None
        if num_new > 1 and work.num_computed_tokens > 0:
            # a chunk after a cached prefix: query i sees keys up to its own position
            query_pos = torch.arange(work.num_computed_tokens, num_context, device=self.device)
            key_pos = torch.arange(num_context, device=self.device)
            mask = key_pos[None, :] <= query_pos[:, None]
        num_table_blocks = -(-num_context // self.block_size)
        return SeqSpan(
            query_start=query_start,
            num_query_tokens=num_new,
            num_context_tokens=num_context,
            block_table=self._long(work.block_table[:num_table_blocks]),
            mask=mask,
            is_causal=num_new > 1 and work.num_computed_tokens == 0,
        )

    def _check(self, works: Sequence[SeqWork]) -> None:
        seen: set[int] = set()
        for work in works:
            if work.seq_id in seen:
                raise ValueError(f"sequence {work.seq_id} appears twice in one step")
            seen.add(work.seq_id)
            if not work.token_ids:
                raise ValueError(f"sequence {work.seq_id} has no new tokens")
            if work.num_computed_tokens < 0:
                raise ValueError(f"sequence {work.seq_id}: negative num_computed_tokens")
            bad = [t for t in work.token_ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(f"sequence {work.seq_id}: token ids {bad[:3]} out of vocabulary")

    def _long(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    # -- KV transfer -----------------------------------------------------------------
    def read_blocks(self, block_ids: Sequence[int]) -> np.ndarray:
        """Copy of the blocks' K/V, all layers: uint8 `[len(block_ids), kv_bytes_per_block]`."""
        return self.cache.read_blocks(block_ids)

    def write_blocks(self, block_ids: Sequence[int], data: np.ndarray | bytes | memoryview) -> None:
        """Overwrite the blocks with `read_blocks` output from an executor of the same model,
        block size and dtype."""
        self.cache.write_blocks(block_ids, data)
