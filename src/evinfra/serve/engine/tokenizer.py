"""Byte-level BPE tokenizer built from a vocabulary and merges (as a GGUF file stores
them), with the model's own Jinja chat template and incremental decoding for streaming.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import decoders, models, pre_tokenizers

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# a ChatML template without a default system prompt, for models that ship none
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """What a BPE tokenizer is made of, as read from GGUF metadata."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]  # "left right"
    token_types: tuple[int, ...]
    pre: str  # pre-tokenizer family: "smollm" splits digits one by one, "gpt2" does not
    bos_token_id: int | None
    eos_token_id: int
    add_bos: bool
    chat_template: str


def byte_level_alphabet() -> dict[int, str]:
    """The byte -> printable character table byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    if pre in ("gpt2", "default"):
        return byte_level
    raise ValueError(f"unsupported pre-tokenizer {pre!r} (known: smollm, gpt2, default)")


def _split_merge(merge: str) -> tuple[str, str]:
    left, right = merge.split(" ", 1)
    return left, right


def build_backend(spec: TokenizerSpec) -> tokenizers.Tokenizer:
    vocab = {token: i for i, token in enumerate(spec.tokens)}
    merges = [_split_merge(m) for m in spec.merges]
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    backend = tokenizers.Tokenizer(bpe)
    backend.pre_tokenizer = _pre_tokenizer(spec.pre)
    backend.decoder = decoders.ByteLevel()
    specials = [
        tokenizers.AddedToken(tok, special=kind == TOKEN_TYPE_CONTROL, normalized=False)
        for tok, kind in zip(spec.tokens, spec.token_types, strict=True)
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    backend.add_tokens(specials)
    return backend


class ChatTokenizer:
    """Encode, decode and chat-format text for one model."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str,
        eos_token_id: int,
        bos_token_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(chat_template)
        stops = {eos_token_id}
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            token_id = backend.token_to_id(name)
            if token_id is not None:
                stops.add(token_id)
        self.stop_token_ids = frozenset(stops)

    @classmethod
    def from_spec(cls, spec: TokenizerSpec) -> ChatTokenizer:
        return cls(
            build_backend(spec),
            spec.chat_template,
            spec.eos_token_id,
            spec.bos_token_id,
            spec.add_bos,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        result = self.backend.token_to_id(token)
        return None if result is None else int(result)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text are recognised."""
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text: str = self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        return text

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        bos = self.backend.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""
        rendered: str = self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=self.backend.id_to_token(self.eos_token_id) or "",
        )
        return rendered

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        ids: list[int] = self.backend.encode(
            self.render_chat(messages, add_generation_prompt), add_special_tokens=False
        ).ids
        return ids

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)

    # -- persistence (the converted-model cache) -------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / "tokenizer.json"))
        meta = {
            "chat_template": self.chat_template,
            "eos_token_id": self.eos_token_id,
            "bos_token_id": self.bos_token_id,
            "add_bos": self.add_bos,
        }
        (directory / "tokenizer_meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, directory: Path) -> ChatTokenizer:
        backend = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        meta = json.loads((directory / "tokenizer_meta.json").read_text())
        return cls(
            backend,
            meta["chat_template"],
            meta["eos_token_id"],
            meta["bos_token_id"],
            meta["add_bos"],
        )


class StreamDecoder:
    """Turns generated ids into text deltas, holding back an incomplete UTF-8 character.

    Decodes a short window (from the last emitted boundary) rather than the whole output,
    so that byte-level merges across the boundary still come out right.
    """

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        """Append one generated id; returns the text it completes (maybe empty)."""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = decode(self._ids[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new_text[len(prefix_text) :]
        return ""


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def byte_level_spec(vocab_size: int = 512) -> TokenizerSpec:
    """A merge-free byte-level vocabulary: three ChatML control tokens, the 256 bytes, then
    reserved control tokens up to `vocab_size`; for tests with a random tiny model."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    num_reserved = vocab_size - len(specials) - 256
    if num_reserved < 0:
        raise ValueError(f"vocab_size must be at least {len(specials) + 256}, got {vocab_size}")
    alphabet = byte_level_alphabet()
    tokens = [*specials, *(alphabet[b] for b in range(256))]
    tokens += [f"<|reserved_{i}|>" for i in range(num_reserved)]
    types = [TOKEN_TYPE_CONTROL] * len(specials) + [TOKEN_TYPE_NORMAL] * 256
    types += [TOKEN_TYPE_CONTROL] * num_reserved
    return TokenizerSpec(
        tokens=tuple(tokens),
        merges=(),
        token_types=tuple(types),
        pre="gpt2",
        bos_token_id=None,
        eos_token_id=2,
        add_bos=False,
        chat_template=CHATML_TEMPLATE,
    )
