"""Load a Llama-family GGUF file: config, tokenizer and float32 weights in the Hugging
Face layout, with a converted copy cached on disk so that a restart skips the parsing
and dequantisation.

GGUF stores Q and K projection rows permuted for llama.cpp's interleaved rotary
embeddings (rotating adjacent pairs); the decoder here, like Hugging Face's, rotates
halves, so those rows are put back in rotate-half order on load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from evinfra.serve.engine.config import LlamaConfig
from evinfra.serve.engine.model import LlamaDecoder
from evinfra.serve.engine.tokenizer import CHATML_TEMPLATE, ChatTokenizer, TokenizerSpec

CACHE_DIR_ENV = "EVINFRA_CACHE_DIR"
_CACHE_FORMAT = 1  # bump when the cached layout or conversion changes

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: LlamaDecoder
    tokenizer: ChatTokenizer
    from_cache: bool


def default_cache_dir() -> Path:
    """$EVINFRA_CACHE_DIR if set (read now, not at import), else ~/.cache/evinfra."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "evinfra"


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise KeyError(f"GGUF metadata lacks {key}")
    return field.contents()


def _field_or(reader: GGUFReader, key: str, default: Any) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader: GGUFReader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, got {arch!r}")
    scaling = reader.fields.get(f"{arch}.rope.scaling.type")
    if scaling is not None and scaling.contents() not in ("none", ""):
        raise ValueError(f"rope scaling {scaling.contents()!r} is not supported")
    num_heads = int(_field(reader, f"{arch}.attention.head_count"))
    num_tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    config = LlamaConfig(
        vocab_size=int(_field_or(reader, f"{arch}.vocab_size", num_tokens)),
        hidden_size=int(_field(reader, f"{arch}.embedding_length")),
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_layers=int(_field(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field_or(reader, f"{arch}.attention.head_count_kv", num_heads)),
        rope_theta=float(_field_or(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length")),
        bos_token_id=_optional_int(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_optional_int(reader, "tokenizer.ggml.eos_token_id"),
    )
    rope_dim = _optional_int(reader, f"{arch}.rope.dimension_count")
    if rope_dim is not None and rope_dim != config.head_dim:
        raise ValueError(f"partial rotary ({rope_dim} of {config.head_dim}) is not supported")
    return config


def _optional_int(reader: GGUFReader, key: str) -> int | None:
    field = reader.fields.get(key)
    return None if field is None else int(field.contents())


def read_tokenizer_spec(reader: GGUFReader) -> TokenizerSpec:
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"only byte-level BPE ('gpt2') tokenizers are supported, got {kind!r}")
    eos = _optional_int(reader, "tokenizer.ggml.eos_token_id")
    if eos is None:
        raise KeyError("GGUF metadata lacks tokenizer.ggml.eos_token_id")
    add_bos = reader.fields.get("tokenizer.ggml.add_bos_token")
    return TokenizerSpec(
        tokens=tuple(_field(reader, "tokenizer.ggml.tokens")),
        merges=tuple(_field_or(reader, "tokenizer.ggml.merges", ())),  # none: bytes only
        token_types=tuple(int(t) for t in _field(reader, "tokenizer.ggml.token_type")),
        pre=str(_field_or(reader, "tokenizer.ggml.pre", "default")),
        bos_token_id=_optional_int(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        add_bos=bool(add_bos.contents()) if add_bos is not None else False,
        chat_template=str(_field_or(reader, "tokenizer.chat_template", CHATML_TEMPLATE)),
    )


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorder a Q or K projection's rows from GGUF's interleaved rotary order to the
    rotate-half order: within each head, row 2i and 2i+1 become rows i and i + dim/2."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    per_head = weight.reshape(num_heads, head_dim // 2, 2, cols)
    return per_head.swapaxes(1, 2).reshape(rows, cols)


def read_state_dict(reader: GGUFReader, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor dequantised to float32, under Hugging Face Llama names."""
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if name.endswith("q_proj.weight"):
            values = unpermute_rotary_rows(values, config.num_heads)
        elif name.endswith("k_proj.weight"):
            values = unpermute_rotary_rows(values, config.num_kv_heads)
        if not values.flags.writeable or not values.flags.c_contiguous:
            values = np.array(values, order="C")  # unquantised tensors map the file
        state[name] = torch.from_numpy(values)
    return state


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise KeyError(f"unexpected GGUF tensor {gguf_name!r}")


def _cache_entry(gguf_path: Path, cache_dir: Path) -> Path:
    stat = gguf_path.stat()
    key = f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{_CACHE_FORMAT}"
    return cache_dir / "models" / key


def load_gguf(
    gguf_path: Path | str, cache_dir: Path | None = None, use_cache: bool = True
) -> LoadedModel:
    """The model (float32) and tokenizer of a GGUF file.

    With `use_cache`, a converted copy is kept under `cache_dir` (default
    `default_cache_dir()`), keyed by the file's name, size and modification time; an
    entry for another size or time of the same file is replaced.
    """
    path = Path(gguf_path)
    entry = _cache_entry(path, cache_dir or default_cache_dir()) if use_cache else None
    if entry is not None and (entry / "config.json").exists():
        config = LlamaConfig.from_dict(json.loads((entry / "config.json").read_text()))
        # read into anonymous memory, not mmap: decode streams every weight each step, and
        # file-backed pages measured up to 1.5x slower for that here
        state = torch.load(entry / "weights.pt", weights_only=True)
        tokenizer = ChatTokenizer.load(entry)
        return LoadedModel(model_from_state_dict(config, state), tokenizer, from_cache=True)
    reader = GGUFReader(path)
    config = read_config(reader)
    tokenizer = ChatTokenizer.from_spec(read_tokenizer_spec(reader))
    state = read_state_dict(reader, config)
    if entry is not None:
        _write_cache(entry, config, state, tokenizer)
    return LoadedModel(model_from_state_dict(config, state), tokenizer, from_cache=False)


def load_gguf_tokenizer(gguf_path: Path | str, cache_dir: Path | None = None) -> ChatTokenizer:
    """Only the tokenizer: from the converted copy when there is one (fast), else read from
    the GGUF metadata (the weights are left alone)."""
    path = Path(gguf_path)
    entry = _cache_entry(path, cache_dir or default_cache_dir())
    if (entry / "config.json").exists():
        return ChatTokenizer.load(entry)
    return ChatTokenizer.from_spec(read_tokenizer_spec(GGUFReader(path)))


def _write_cache(
    entry: Path, config: LlamaConfig, state: dict[str, torch.Tensor], tokenizer: ChatTokenizer
) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    stem = entry.name.rsplit("-", 3)[0]
    for stale in entry.parent.glob(f"{stem}-*"):
        if stale.is_dir() and stale.name.rsplit("-", 3)[0] == stem:
            shutil.rmtree(stale, ignore_errors=True)
    # written beside the entry and renamed into place: a reader never sees half a cache
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        torch.save(state, staging / "weights.pt")
        tokenizer.save(staging)
        (staging / "config.json").write_text(json.dumps(config.to_dict()))
        os.replace(staging, entry)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (entry / "config.json").exists():
            raise


def model_from_state_dict(config: LlamaConfig, state: dict[str, torch.Tensor]) -> LlamaDecoder:
    """A decoder holding `state`'s tensors (no copy, no random initialisation first)."""
    with torch.device("meta"):
        model = LlamaDecoder(config)
    model.load_weights(state, assign=True)
    return model
