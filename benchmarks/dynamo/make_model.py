"""Write a local model directory for Dynamo's mocker and frontend: a small Llama-style
`config.json`, a word-level `tokenizer.json` over a synthetic vocabulary (built with the
`tokenizers` package), `tokenizer_config.json` with a plain chat template, and
`generation_config.json`. Nothing is downloaded; the mocker needs no weights.

The vocabulary is evinfra's timed-executor tokenizer (`byte_level_spec`) extended: ids 0-2
are ChatML control tokens, ids 3-258 the 256 bytes in GPT-2's byte-level alphabet, no
merges, so text is one token per byte on both servers (aiperf's text prompts have the same
length on each). Ids from 259 up are words `w<id>`: Dynamo's mocker samples output ids
in the thousands, and each must decode to non-empty text or the frontend drops its chunk.

    python make_model.py OUT_DIR [--vocab-size 1024]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 1, 2
VOCAB_SIZE = 49152  # above the ids the mocker samples
NUM_BYTES = 256
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte value 0-255."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(NUM_BYTES):
        if b not in chars:
            chars[b] = chr(NUM_BYTES + extra)
            extra += 1
    return [chars[b] for b in range(NUM_BYTES)]


def model_config(vocab_size: int, max_position_tokens: int) -> dict[str, Any]:
    """A SmolLM2-135M-shaped Llama config (30 layers, 3 KV heads of 64: 23,040 KV bytes per
    token in bfloat16), the shape of evinfra's `smollm2-135m` catalog entry."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_tokens,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def build_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    first_word = len(SPECIAL_TOKENS) + NUM_BYTES
    if vocab_size <= first_word:
        raise ValueError(f"vocab_size must be > {first_word}")
    tokens = [*SPECIAL_TOKENS, *byte_alphabet()]
    tokens += [f"w{i}" for i in range(first_word, vocab_size)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def write_model_dir(out: Path, vocab_size: int, max_position_tokens: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = model_config(vocab_size, max_position_tokens)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(vocab_size).save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "pad_token": SPECIAL_TOKENS[0],
        "model_max_length": max_position_tokens,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    p.add_argument("--max-position-tokens", type=int, default=131072)
    args = p.parse_args()
    write_model_dir(args.out, args.vocab_size, args.max_position_tokens)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
