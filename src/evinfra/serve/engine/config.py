"""Shape of a Llama-family decoder, read from GGUF metadata or written by hand."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"hidden {self.hidden_size} not divisible by {self.num_heads} heads")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"{self.num_heads} heads not a multiple of {self.num_kv_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def kv_elements_per_token(self) -> int:
        """K and V elements one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        return cls(**data)
