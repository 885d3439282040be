"""transformers' LlamaForCausalLM holding a decoder's config and weights: the reference
the hand-written decoder is tested and benchmarked against. Needs `transformers`; builds
the model from a config, so nothing is downloaded."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from evinfra.serve.engine.model import LlamaDecoder


def hf_reference(model: LlamaDecoder) -> Any:
    """transformers' LlamaForCausalLM with the same config and weights (nothing downloaded)."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    c = model.config
    # rope_theta as a plain keyword: transformers 4 reads it, 5 folds it into rope_parameters
    fields: dict[str, Any] = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "max_position_embeddings": c.max_position_embeddings,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "pad_token_id": c.eos_token_id,
    }
    hf_config = HFLlamaConfig(**fields)
    with _no_init_weights():
        hf = LlamaForCausalLM(hf_config)
    state = {k: v.detach().clone().float() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    hf.train(False)
    return hf


def hf_greedy(hf: Any, prompt_ids: Sequence[int], num_tokens: int) -> list[int]:
    """`num_tokens` greedy tokens after `prompt_ids` (no stop token ends them early)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([list(prompt_ids)]),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def _no_init_weights() -> contextlib.AbstractContextManager[Any]:
    """Skips the random initialisation the loaded weights overwrite (seconds at 135M)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: initialise, only slower
        return contextlib.nullcontext()
    manager: contextlib.AbstractContextManager[Any] = no_init_weights()
    return manager
