"""The cost-model interface: a batch's shape in, a step time out. Pure functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from evinfra.costmodel.node import NodeSpec


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """`num_new_tokens` computed this step on top of `num_context_tokens` already in KV
    (cached prefix plus earlier chunks)."""

    num_new_tokens: int
    num_context_tokens: int


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one engine step computes.

    `num_decode_context_tokens` is the sum of the decoding sequences' context lengths;
    `num_kv_tokens_in_use` the tokens held in the node's device KV (some cost models,
    such as Dynamo's mocker, key decode time on KV utilisation).
    """

    prefill_chunks: tuple[PrefillChunk, ...] = ()
    num_decode_seqs: int = 0
    num_decode_context_tokens: int = 0
    num_kv_tokens_in_use: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.prefill_chunks)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_chunks and self.num_decode_seqs == 0


class CostModel(Protocol):
    """Step times of one node (a model instance on its GPUs)."""

    @property
    def kv_capacity_tokens(self) -> int:
        """Device KV capacity of the node in tokens (memory left after weights)."""

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV one token occupies on this node (all layers)."""

    def step_time_s(self, batch: BatchShape) -> float:
        """Seconds one engine step of `batch` takes."""

    def decode_run_time_s(
        self, num_seqs: int, num_context_tokens: int, num_kv_tokens: int, num_steps: int
    ) -> float:
        """Seconds `num_steps` pure decode steps take, each adding one token to each of
        `num_seqs` sequences whose contexts sum to `num_context_tokens` at the start
        (`num_kv_tokens` in the device KV at the start). The simulator advances a batch
        to its next event with one call; implementations may use a closed form."""


class NodeKV:
    """`CostModel`'s two KV figures as its node gives them: the device capacity left after
    weights and the bytes a token occupies. A base for cost models that size KV no other
    way."""

    node: NodeSpec

    @property
    def kv_capacity_tokens(self) -> int:
        return self.node.kv_capacity_tokens

    @property
    def kv_bytes_per_token(self) -> int:
        return self.node.device_kv_bytes_per_token
