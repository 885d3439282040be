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

from evinfra.costmodel.base import BatchShape, CostModel
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


SMOLLM2_NAME = "SmolLM2-135M-Instruct"
TIMED_MAX_CONTEXT_TOKENS = 1 << 20
FLOAT32_BYTES = 4


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the frontend needs to know about the served model."""

    name: str
    aliases: frozenset[str]
    tokenizer: ChatTokenizer
    vocab_size: int
    max_position_tokens: int
    kv_bytes_per_token: int


def describe_model(spec: ExecutorSpec) -> ModelInfo:
    """The served model's name, tokenizer and limits. Loads the torch model once in the
    calling process (which also fills the converted-model cache the workers then read).
    The timed executor has no model: it uses the byte-level test tokenizer."""
    from evinfra.serve.engine.tokenizer import ChatTokenizer, byte_level_spec

    if spec.kind == "torch":
        loaded = load_torch_model(spec)
        config = loaded.model.config
        name = "tiny" if spec.model == "tiny" else SMOLLM2_NAME
        return ModelInfo(
            name=name,
            aliases=frozenset({name, spec.model, name.lower()}),
            tokenizer=loaded.tokenizer,
            vocab_size=config.vocab_size,
            max_position_tokens=config.max_position_embeddings,
            kv_bytes_per_token=config.kv_elements_per_token() * FLOAT32_BYTES,
        )
    tokenizer = ChatTokenizer.from_spec(byte_level_spec(spec.vocab_size))
    name = f"timed-{spec.model}"
    return ModelInfo(
        name=name,
        aliases=frozenset({name, spec.model}),
        tokenizer=tokenizer,
        vocab_size=spec.vocab_size,
        max_position_tokens=TIMED_MAX_CONTEXT_TOKENS,
        kv_bytes_per_token=spec.kv_bytes_per_token,
    )


CATALOG_NAMES = {"smollm2": "smollm2-135m"}


def node_cost_model(spec: ExecutorSpec, block_size: int) -> CostModel:
    """The cost model of one node: the timed executor's clock, and what latency-predicting
    policies (planners) read. For the torch executor it prices the catalog's copy of the
    model on `spec.gpu`, not this machine's CPU: a stand-in until a measured profile."""
    from evinfra.costmodel.node import NodeSpec
    from evinfra.costmodel.registry import make_cost_model

    name = CATALOG_NAMES.get(spec.model, spec.model)
    node = NodeSpec.from_names(name, spec.gpu, spec.num_gpus, block_size=block_size)
    return make_cost_model(spec.cost_model, node, **dict(spec.cost_options))


def build_executor(spec: ExecutorSpec, num_blocks: int, block_size: int) -> Executor:
    if spec.kind == "torch":
        return TorchAdapter(spec, num_blocks, block_size)
    from evinfra.serve.timed_executor import TimedExecutor

    cost = node_cost_model(spec, block_size)
    return TimedExecutor(
        cost,
        num_blocks,
        block_size,
        spec.vocab_size,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        avoid_token_ids=spec.avoid_token_ids,
    )
