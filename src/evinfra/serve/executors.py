"""The executors a node worker can drive, behind one small surface.

`torch` runs the real model of `serve/engine` (a tiny random model for tests, SmolLM2 for
the demo); `timed` sleeps a cost model's step time (see timed_executor.py). Both are built
inside the worker process, from an `ExecutorSpec` that pickles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from evinfra.costmodel.base import BatchShape
from evinfra.serve.protocol import Sampling

if TYPE_CHECKING:
    from evinfra.serve.engine.tokenizer import ChatTokenizer

TORCH_MODELS = ("tiny", "smollm2")
EXECUTORS = ("torch", "timed")


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One sequence's share of a step (mirrors `serve.engine.executor.SeqWork`)."""

    seq_id: int
    token_ids: tuple[int, ...]
    num_computed_tokens: int
    block_table: tuple[int, ...]
    sample: bool
    sampling: Sampling | None = None


class Executor(Protocol):
    @property
    def kv_bytes_per_token(self) -> int: ...

    def execute(self, works: Sequence[WorkItem], shape: BatchShape | None = None) -> dict[int, int]:
        """Run one step; returns seq_id -> next token for the works that sample. Writes the
        new tokens' KV; `shape` is the step's batch shape (the timed executor's clock)."""

    def read_blocks(self, block_ids: Sequence[int]) -> np.ndarray: ...

    def write_blocks(self, block_ids: Sequence[int], data: np.ndarray | bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class ExecutorSpec:
    kind: str = "timed"
    """torch | timed"""
    model: str = "tiny"
    """torch: tiny | smollm2. timed: a catalog model (tiny, smollm2-135m, llama-3-70b ...)."""
    seed: int = 0
    num_threads: int = 1
    cost_model: str = "dynamo-polynomial"
    gpu: str = "h200"
    num_gpus: int = 1
    cost_options: tuple[tuple[str, Any], ...] = ()
    kv_bytes_per_token: int = 16
    """Timed executor only: bytes of (fake) KV per token slot."""
    vocab_size: int = 512
    """Timed executor only: pseudo-tokens are drawn below this."""
    avoid_token_ids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.kind!r}")
        if self.kind == "torch" and self.model not in TORCH_MODELS:
            raise ValueError(f"torch executor models: {TORCH_MODELS}, got {self.model!r}")


class TorchAdapter:
    """`serve.engine.executor.TorchExecutor` behind the `Executor` surface."""

    def __init__(self, spec: ExecutorSpec, num_blocks: int, block_size: int) -> None:
        from evinfra.serve.engine.executor import TorchExecutor

        loaded = load_torch_model(spec)
        self.inner = TorchExecutor(
            loaded.model, num_blocks, block_size, num_threads=spec.num_threads
        )
        self.vocab_size = loaded.model.config.vocab_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self.inner.kv_bytes_per_token

    def execute(self, works: Sequence[WorkItem], shape: BatchShape | None = None) -> dict[int, int]:
        from evinfra.serve.engine.executor import SeqWork
        from evinfra.serve.engine.sampling import SamplingParams

        seq_works = [
            SeqWork(
                w.seq_id,
                w.token_ids,
                w.num_computed_tokens,
                w.block_table,
                w.sample,
                None
                if w.sampling is None or w.sampling.temperature == 0
                else SamplingParams(w.sampling.temperature, w.sampling.top_p, w.sampling.seed),
            )
            for w in works
        ]
        return self.inner.execute(seq_works)

    def read_blocks(self, block_ids: Sequence[int]) -> np.ndarray:
        return self.inner.read_blocks(block_ids)

    def write_blocks(self, block_ids: Sequence[int], data: np.ndarray | bytes) -> None:
        self.inner.write_blocks(block_ids, data)


def load_torch_model(spec: ExecutorSpec) -> Any:
    """The engine's `LoadedModel` (decoder and tokenizer) for `spec.model`."""
    from evinfra.serve.engine.factory import load_smollm2, make_tiny_model

    if spec.model == "tiny":
        return make_tiny_model(spec.seed)
    return load_smollm2()


def load_tokenizer(spec: ExecutorSpec) -> ChatTokenizer:
    """The tokenizer the frontend encodes prompts with. The timed executor has no model:
    it uses the byte-level test tokenizer."""
    from evinfra.serve.engine.tokenizer import ChatTokenizer, byte_level_spec

    if spec.kind == "torch":
        tok: ChatTokenizer = load_torch_model(spec).tokenizer
        return tok
    return ChatTokenizer.from_spec(byte_level_spec(max(spec.vocab_size, 259)))


def build_executor(spec: ExecutorSpec, num_blocks: int, block_size: int) -> Executor:
    if spec.kind == "torch":
        return TorchAdapter(spec, num_blocks, block_size)
    from evinfra.costmodel.node import NodeSpec
    from evinfra.costmodel.registry import make_cost_model
    from evinfra.serve.timed_executor import TimedExecutor

    node = NodeSpec.from_names(spec.model, spec.gpu, spec.num_gpus, block_size=block_size)
    cost = make_cost_model(spec.cost_model, node, **dict(spec.cost_options))
    return TimedExecutor(
        cost,
        num_blocks,
        block_size,
        spec.vocab_size,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        avoid_token_ids=spec.avoid_token_ids,
    )
