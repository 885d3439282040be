"""A paged KV cache: one tensor of fixed-size blocks, indexed by the core KVPool's ids.

Layout is block-major, `[num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads,
head_dim]`, so that one block (every layer's K and V for `block_size` tokens) is one
contiguous run of bytes: moving a block between nodes or tiers is a single copy, and
`read_blocks` output can be sent as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from evinfra.serve.engine.config import LlamaConfig


class PagedKVCache:
    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"need positive num_blocks and block_size, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_layers = config.num_layers
        self.dtype = dtype
        shape = (num_blocks, config.num_layers, 2, block_size, config.num_kv_heads, config.head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def bytes_per_block(self) -> int:
        return self.kv[0].numel() * self.kv.element_size()

    @property
    def kv_bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    def slots(
        self, block_table: Sequence[int], start: int, stop: int
    ) -> tuple[list[int], list[int]]:
        """(block ids, offsets in block) of token positions `start` .. `stop - 1`."""
        needed = -(-stop // self.block_size)
        if needed > len(block_table):
            raise ValueError(
                f"block table of {len(block_table)} blocks cannot hold {stop} tokens "
                f"at block size {self.block_size}"
            )
        bs = self.block_size
        blocks = [block_table[p // bs] for p in range(start, stop)]
        offsets = [p % bs for p in range(start, stop)]
        return blocks, offsets

    def gather_padded(
        self, layer: int, block_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of whole blocks for several sequences, `[seqs, blocks * block_size,
        kv_heads, dim]`; `block_index` is `[seqs, blocks]` (padding rows must be masked)."""
        both = self.kv[block_index, layer]  # [seqs, blocks, 2, block_size, heads, dim]
        return both[:, :, 0].flatten(1, 2), both[:, :, 1].flatten(1, 2)

    def write(
        self,
        layer: int,
        k: torch.Tensor,
        v: torch.Tensor,
        blocks: torch.Tensor,
        offsets: torch.Tensor,
    ) -> None:
        """Store `k`, `v` (`[num_tokens, num_kv_heads, head_dim]`) at the given slots."""
        # advanced indices around a slice: the indexed dimension comes first, [tokens, 2, ...]
        self.kv[blocks, layer, :, offsets] = torch.stack((k, v), dim=1).to(self.dtype)

    def gather(
        self, layer: int, block_table: torch.Tensor, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a sequence's first `num_tokens` tokens, `[num_tokens, kv_heads, dim]`."""
        num_blocks = -(-num_tokens // self.block_size)
        both = self.kv[block_table[:num_blocks], layer]  # [n, 2, block_size, heads, dim]
        k = both[:, 0].flatten(0, 1)[:num_tokens]
        v = both[:, 1].flatten(0, 1)[:num_tokens]
        return k, v

    # -- transfer --------------------------------------------------------------------
    def read_blocks(self, block_ids: Sequence[int]) -> np.ndarray:
        """A copy of the blocks' bytes: uint8, `[len(block_ids), bytes_per_block]`."""
        self._check_ids(block_ids)
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.kv.device)
        chunk = self.kv.index_select(0, index).contiguous().cpu()
        raw = chunk.view(torch.uint8).reshape(len(block_ids), self.bytes_per_block)
        return raw.numpy().copy()

    def write_blocks(self, block_ids: Sequence[int], data: np.ndarray | bytes | memoryview) -> None:
        """Overwrite the blocks with bytes produced by `read_blocks` (same shape and dtype)."""
        self._check_ids(block_ids)
        raw = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        expected = len(block_ids) * self.bytes_per_block
        if raw.size != expected or raw.dtype != np.uint8:
            raise ValueError(f"expected {expected} uint8 bytes, got {raw.size} of {raw.dtype}")
        flat = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1).copy())
        blocks = flat.view(self.dtype).reshape((len(block_ids), *self.kv.shape[1:]))
        index = torch.tensor(list(block_ids), dtype=torch.long, device=self.kv.device)
        self.kv.index_copy_(0, index, blocks.to(self.kv.device))

    def _check_ids(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if not 0 <= block_id < self.num_blocks:
                raise IndexError(f"block id {block_id} outside 0..{self.num_blocks - 1}")
