"""An executor that does no model work: each step sleeps the step time a cost model gives
for its batch, and returns deterministic pseudo-tokens.

It lets evinfra run at the engine speed of Dynamo's mocker (`dynamo-polynomial`) or of a
roofline model on real hardware, and checks the simulator against a real run. Its KV cache
is real memory (`kv_bytes_per_token` bytes per token slot, small by default), so a
disaggregated run moves real bytes between workers. Each computed token writes its id in
its slot, and the next token is drawn from ids read back from the KV: a transfer that
lost or misplaced bytes changes the output, exactly as it would with a real model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

import numpy as np

from evinfra.costmodel.base import BatchShape, CostModel
from evinfra.serve.executors import WorkItem

_MASK64 = (1 << 64) - 1
_TOKEN_BYTES = 4


def _mix(*keys: int) -> int:
    """splitmix64 over the keys: a stable pseudo-random 64-bit value."""
    z = 0x9E3779B97F4A7C15
    for key in keys:
        z = (z ^ (key & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
        z ^= z >> 31
    return z


class TimedExecutor:
    """Same surface as the torch executor (`execute`, `read_blocks`, `write_blocks`)."""

    def __init__(
        self,
        cost: CostModel,
        num_blocks: int,
        block_size: int,
        vocab_size: int,
        *,
        kv_bytes_per_token: int = 16,
        avoid_token_ids: Collection[int] = (),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if kv_bytes_per_token < _TOKEN_BYTES:
            raise ValueError(f"kv_bytes_per_token must be >= {_TOKEN_BYTES}")
        if vocab_size <= len(set(avoid_token_ids)):
            raise ValueError("vocab_size leaves no token to sample")
        self.cost = cost
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.kv_bytes_per_token = kv_bytes_per_token
        self.avoid_token_ids = frozenset(avoid_token_ids)
        self._allowed = [t for t in range(vocab_size) if t not in self.avoid_token_ids]
        self._kv = np.zeros((num_blocks, block_size, kv_bytes_per_token), dtype=np.uint8)
        self._sleep = sleep
        self._clock = clock
        self.busy_s = 0.0

    @property
    def kv_bytes_per_block(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    def execute(self, works: Sequence[WorkItem], shape: BatchShape | None = None) -> dict[int, int]:
        """Write each new token's id into its KV slot, sleep the cost model's step time of
        `shape`, and return seq_id -> pseudo-token for the works that sample."""
        start = self._clock()
        out: dict[int, int] = {}
        for work in works:
            self._write_tokens(work)
            if work.sample:
                out[work.seq_id] = self._next_token(work)
        if shape is not None and not shape.is_empty:
            step_s = self.cost.step_time_s(shape)
            self.busy_s += step_s
            remaining = start + step_s - self._clock()
            if remaining > 0:
                self._sleep(remaining)
        return out

    def _slot(self, block_table: Sequence[int], position: int) -> tuple[int, int]:
        return block_table[position // self.block_size], position % self.block_size

    def _write_tokens(self, work: WorkItem) -> None:
        for i, token in enumerate(work.token_ids):
            block, offset = self._slot(work.block_table, work.num_computed_tokens + i)
            self._kv[block, offset, :_TOKEN_BYTES] = np.frombuffer(
                int(token).to_bytes(_TOKEN_BYTES, "little"), dtype=np.uint8
            )

    def _read_token(self, block_table: Sequence[int], position: int) -> int:
        block, offset = self._slot(block_table, position)
        return int.from_bytes(self._kv[block, offset, :_TOKEN_BYTES].tobytes(), "little")

    def _next_token(self, work: WorkItem) -> int:
        """A function of the context's first and last two tokens (read from the KV) and the
        position, so it depends on the KV holding the right bytes."""
        position = work.num_computed_tokens + len(work.token_ids)
        last = self._read_token(work.block_table, position - 1)
        before = self._read_token(work.block_table, position - 2) if position >= 2 else 0
        first = self._read_token(work.block_table, 0)
        return self._allowed[_mix(position, first, before, last) % len(self._allowed)]

    def read_blocks(self, block_ids: Sequence[int]) -> np.ndarray:
        """Copy of the blocks' bytes: uint8 `[len(block_ids), kv_bytes_per_block]`."""
        return self._kv[list(block_ids)].reshape(len(block_ids), -1).copy()

    def write_blocks(self, block_ids: Sequence[int], data: np.ndarray | bytes | memoryview) -> None:
        """Overwrite the blocks with `read_blocks` output of an executor of the same shape."""
        arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        expected = len(block_ids) * self.kv_bytes_per_block
        if arr.size != expected:
            raise ValueError(f"KV payload of {arr.size} bytes, expected {expected}")
        self._kv[list(block_ids)] = arr.reshape(len(block_ids), self.block_size, -1)
