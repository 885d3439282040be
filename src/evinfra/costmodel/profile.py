"""Step times interpolated from a table measured on a real executor.

Prefill: milliseconds by new tokens in the step (linear interpolation).
Decode: milliseconds by (batch size, mean context per sequence) (bilinear interpolation).
A mixed step lasts prefill_ms + decode_ms.

Outside the table, coordinates are clamped to the measured range (the time at the nearest
edge is used): the table must cover the batch sizes, contexts and chunk sizes a run uses.
`ProfileTable.covers` tells whether a batch falls inside it.

File format (JSON):
    {"prefill_tokens": [...], "prefill_ms": [...],
     "decode_batch_sizes": [...], "decode_context_tokens": [...],
     "decode_ms": [[ms for each context] for each batch size],
     "source": "where and how it was measured"}
Axes must be strictly increasing.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from evinfra.costmodel.base import BatchShape, NodeKV
from evinfra.costmodel.node import NodeSpec

FloatArray = npt.NDArray[np.float64]


def _check_axis(name: str, axis: tuple[float, ...]) -> None:
    if not axis:
        raise ValueError(f"{name} is empty")
    if any(b <= a for a, b in itertools.pairwise(axis)):
        raise ValueError(f"{name} must be strictly increasing")


@dataclass(frozen=True, slots=True)
class ProfileTable:
    prefill_tokens: tuple[float, ...]
    prefill_ms: tuple[float, ...]
    decode_batch_sizes: tuple[float, ...]
    decode_context_tokens: tuple[float, ...]
    decode_ms: tuple[tuple[float, ...], ...]  # [batch index][context index]
    source: str = ""

    def __post_init__(self) -> None:
        _check_axis("prefill_tokens", self.prefill_tokens)
        _check_axis("decode_batch_sizes", self.decode_batch_sizes)
        _check_axis("decode_context_tokens", self.decode_context_tokens)
        if len(self.prefill_ms) != len(self.prefill_tokens):
            raise ValueError("prefill_ms and prefill_tokens differ in length")
        if len(self.decode_ms) != len(self.decode_batch_sizes) or any(
            len(row) != len(self.decode_context_tokens) for row in self.decode_ms
        ):
            raise ValueError("decode_ms must be len(batch sizes) x len(contexts)")

    def covers(self, batch: BatchShape) -> bool:
        """True when no coordinate of `batch` needs clamping."""
        if batch.prefill_chunks and not (
            self.prefill_tokens[0] <= batch.num_prefill_tokens <= self.prefill_tokens[-1]
        ):
            return False
        if batch.num_decode_seqs > 0:
            mean_context = batch.num_decode_context_tokens / batch.num_decode_seqs
            batches, contexts = self.decode_batch_sizes, self.decode_context_tokens
            return (
                batches[0] <= batch.num_decode_seqs <= batches[-1]
                and contexts[0] <= mean_context <= contexts[-1]
            )
        return True

    def to_json(self) -> str:
        return json.dumps(
            {
                "prefill_tokens": list(self.prefill_tokens),
                "prefill_ms": list(self.prefill_ms),
                "decode_batch_sizes": list(self.decode_batch_sizes),
                "decode_context_tokens": list(self.decode_context_tokens),
                "decode_ms": [list(row) for row in self.decode_ms],
                "source": self.source,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> ProfileTable:
        data = json.loads(text)
        return cls(
            prefill_tokens=tuple(float(x) for x in data["prefill_tokens"]),
            prefill_ms=tuple(float(x) for x in data["prefill_ms"]),
            decode_batch_sizes=tuple(float(x) for x in data["decode_batch_sizes"]),
            decode_context_tokens=tuple(float(x) for x in data["decode_context_tokens"]),
            decode_ms=tuple(tuple(float(x) for x in row) for row in data["decode_ms"]),
            source=str(data.get("source", "")),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> ProfileTable:
        return cls.from_json(Path(path).read_text())


class ProfileCostModel(NodeKV):
    """Implements `CostModel` from a `ProfileTable`; capacity and KV size from the node."""

    def __init__(self, node: NodeSpec, table: ProfileTable) -> None:
        self.node = node
        self.table = table
        self._prefill_x = np.array(table.prefill_tokens)
        self._prefill_y = np.array(table.prefill_ms)
        self._batch_x = np.array(table.decode_batch_sizes)
        self._context_x = np.array(table.decode_context_tokens)
        self._decode_grid = np.array(table.decode_ms)  # [batch, context]

    @classmethod
    def from_json(cls, path: str | Path, node: NodeSpec) -> ProfileCostModel:
        return cls(node, ProfileTable.load(path))

    def prefill_ms(self, num_new_tokens: int) -> float:
        if num_new_tokens <= 0:
            return 0.0
        return float(np.interp(float(num_new_tokens), self._prefill_x, self._prefill_y))

    def decode_ms(self, num_seqs: int, mean_contexts: FloatArray) -> FloatArray:
        """Bilinear: first along batch size (fixed here), then along the context axis."""
        b = float(np.clip(num_seqs, self._batch_x[0], self._batch_x[-1]))
        j = int(np.clip(np.searchsorted(self._batch_x, b, side="right") - 1, 0, None))
        if j >= len(self._batch_x) - 1:
            row = self._decode_grid[-1]
        else:
            w = (b - self._batch_x[j]) / (self._batch_x[j + 1] - self._batch_x[j])
            row = (1.0 - w) * self._decode_grid[j] + w * self._decode_grid[j + 1]
        result: FloatArray = np.interp(mean_contexts, self._context_x, row)
        return result

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds of one step: interpolated prefill time of its new tokens plus the
        interpolated decode time of its sequences at their mean context."""
        total_ms = self.prefill_ms(batch.num_prefill_tokens)
        if batch.num_decode_seqs > 0:
            mean = np.array([batch.num_decode_context_tokens / batch.num_decode_seqs])
            total_ms += float(self.decode_ms(batch.num_decode_seqs, mean)[0])
        return total_ms * 1e-3

    def decode_run_time_s(
        self, num_seqs: int, num_context_tokens: int, num_kv_tokens: int, num_steps: int
    ) -> float:
        """Seconds of `num_steps` decode steps (each adds one token per sequence), summed
        with one vectorised interpolation."""
        if num_steps <= 0 or num_seqs <= 0:
            return 0.0
        contexts = num_context_tokens + num_seqs * np.arange(num_steps, dtype=np.float64)
        return float(self.decode_ms(num_seqs, contexts / num_seqs).sum()) * 1e-3
