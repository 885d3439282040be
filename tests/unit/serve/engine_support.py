"""Helpers for the engine tests: a tiny GGUF file written from a tiny model, laid out
as llama.cpp's converter lays it out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evinfra.serve.engine.model import LlamaDecoder
from evinfra.serve.engine.tokenizer import TokenizerSpec


def permute_for_gguf(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp converter's row order for Q/K: rotate-half pairs become adjacent rows."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols)


_TO_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_tiny_gguf(path: Path, model: LlamaDecoder, spec: TokenizerSpec) -> dict[str, np.ndarray]:
    """Write `model` and `spec` as a llama GGUF file: Q/K permuted and stored as Q8_0, the
    rest float32. Returns the float32 weights a correct loader must read back."""
    import gguf
    from gguf.quants import dequantize, quantize

    c = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(spec.pre)
    writer.add_token_list(list(spec.tokens))
    writer.add_token_types(list(spec.token_types))
    writer.add_token_merges(list(spec.merges))
    writer.add_eos_token_id(spec.eos_token_id)
    writer.add_add_bos_token(spec.add_bos)
    writer.add_chat_template(spec.chat_template)
    expected: dict[str, np.ndarray] = {}
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        values = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", values)
            expected[name] = values
            continue
        if name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", values)
            expected[name] = values
            continue
        _, _, layer, rest = name.split(".", 3)
        gguf_name = f"blk.{layer}.{_TO_GGUF_LAYER[rest]}"
        if rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            heads = c.num_heads if rest.startswith("self_attn.q") else c.num_kv_heads
            quantized = quantize(permute_for_gguf(values, heads), q8)
            writer.add_tensor(gguf_name, quantized, raw_dtype=q8)
            # quantisation works along rows, so it commutes with the row permutation
            expected[name] = dequantize(quantize(values, q8), q8)
        else:
            writer.add_tensor(gguf_name, values)
            expected[name] = values
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected
