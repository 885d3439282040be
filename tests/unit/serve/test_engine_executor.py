"""The paged torch executor on the tiny random model: agreement with transformers, chunked
prefill, prefix reuse through shared block ids, mixed batches, KV transfer, sampling."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from evinfra.serve.engine.chat import generate  # noqa: E402
from evinfra.serve.engine.executor import SeqWork, TorchExecutor  # noqa: E402
from evinfra.serve.engine.factory import make_tiny_model  # noqa: E402
from evinfra.serve.engine.model import Rotary  # noqa: E402
from evinfra.serve.engine.sampling import SamplingParams  # noqa: E402

BLOCK_SIZE = 4
PROMPT = [(i * 37 + 11) % 500 + 3 for i in range(30)]


def make_executor(seed: int = 0, num_blocks: int = 64) -> TorchExecutor:
    return TorchExecutor(make_tiny_model(seed).model, num_blocks=num_blocks, block_size=BLOCK_SIZE)


def greedy_alone(prompt: list[int], num_tokens: int, seed: int = 0) -> list[int]:
    return list(generate(make_executor(seed), prompt, num_tokens).token_ids)


def test_greedy_decoding_matches_transformers_from_a_chat_prompt() -> None:
    pytest.importorskip("transformers")
    from evinfra.serve.engine.hf_reference import hf_greedy, hf_reference

    loaded = make_tiny_model(seed=3)
    prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": "Hello, tiny model!"}])
    hf = hf_reference(loaded.model)
    expected = hf_greedy(hf, prompt, 32)
    executor = TorchExecutor(loaded.model, num_blocks=32, block_size=BLOCK_SIZE)
    got = generate(executor, prompt, 32).token_ids
    assert list(got) == expected
    with torch.no_grad():
        hf_logits = hf(torch.tensor([prompt])).logits[0, -1]
    fresh = TorchExecutor(make_tiny_model(seed=3).model, num_blocks=32, block_size=BLOCK_SIZE)
    ours = fresh.forward([SeqWork(0, tuple(prompt), 0, tuple(range(32)), True)])[0]
    torch.testing.assert_close(ours, hf_logits, atol=1e-4, rtol=1e-4)


def test_chunked_prefill_gives_the_same_logits_and_tokens_as_one_shot() -> None:
    table = tuple(range(16))
    one_shot = make_executor().forward([SeqWork(0, tuple(PROMPT), 0, table, True)])[0]
    chunked_executor = make_executor()
    logits = None
    for start in range(0, len(PROMPT), 7):
        piece = tuple(PROMPT[start : start + 7])
        last = start + len(piece) == len(PROMPT)
        out = chunked_executor.forward([SeqWork(0, piece, start, table, last)])
        if last:
            logits = out[0]
        else:
            assert out == {}
    assert logits is not None
    torch.testing.assert_close(logits, one_shot, atol=1e-5, rtol=1e-5)
    chunked = generate(make_executor(), PROMPT, 20, prefill_chunk_tokens=7).token_ids
    assert list(chunked) == greedy_alone(PROMPT, 20)


def test_prefix_reuse_through_shared_blocks_matches_computing_from_scratch() -> None:
    prefix = PROMPT[:16]  # four full blocks
    suffix_a, suffix_b = [5, 6, 7, 8, 9], [300, 301, 302]
    executor = make_executor()
    generate(executor, prefix + suffix_a, 4, block_table=(0, 1, 2, 3, 4, 5, 6))
    # sequence B owns blocks 10.. for its suffix and reads blocks 0-3 as its prefix
    table_b = (0, 1, 2, 3, 10, 11, 12)
    reused = executor.execute([SeqWork(1, tuple(suffix_b), len(prefix), table_b, True)])[1]
    tokens = [reused]
    position = len(prefix) + len(suffix_b)
    for _ in range(7):
        work = SeqWork(1, (tokens[-1],), position, table_b, True)
        tokens.append(executor.execute([work])[1])
        position += 1
    assert tokens == greedy_alone(prefix + suffix_b, 8)
    # the suffix really read the cached prefix: spoil it and the answer changes
    spoiled = make_executor()
    logits = spoiled.forward([SeqWork(1, tuple(suffix_b), len(prefix), table_b, True)])[1]
    fresh = make_executor().forward([SeqWork(1, tuple(prefix + suffix_b), 0, table_b, True)])[1]
    assert not torch.allclose(logits, fresh, atol=1e-3)


def test_a_mixed_batch_gives_each_sequence_the_tokens_it_gets_alone() -> None:
    prompts = {1: PROMPT[:5], 2: PROMPT[3:16], 3: PROMPT, 4: [42, 43, 44, 45, 46, 47, 48, 49, 50]}
    num_tokens = 6
    alone = {seq: greedy_alone(p, num_tokens) for seq, p in prompts.items()}
    executor = make_executor()
    tables = {seq: tuple(range(seq * 12, seq * 12 + 12)) for seq in prompts}
    done = {seq: 0 for seq in prompts}
    out: dict[int, list[int]] = {seq: [] for seq in prompts}
    last: dict[int, int] = {}
    # step by step: sequence 4 prefills in chunks of 3 while the others already decode
    while any(len(v) < num_tokens for v in out.values()):
        works = []
        for seq, prompt in prompts.items():
            if len(out[seq]) >= num_tokens:
                continue
            if done[seq] < len(prompt):
                size = 3 if seq == 4 else len(prompt)
                piece = tuple(prompt[done[seq] : done[seq] + size])
                sample = done[seq] + len(piece) == len(prompt)
                works.append(SeqWork(seq, piece, done[seq], tables[seq], sample))
            else:
                works.append(SeqWork(seq, (last[seq],), done[seq], tables[seq], True))
        sampled = executor.execute(works)
        for work in works:
            done[work.seq_id] += len(work.token_ids)
            if work.seq_id in sampled:
                last[work.seq_id] = sampled[work.seq_id]
                out[work.seq_id].append(sampled[work.seq_id])
    assert out == alone


def test_kv_blocks_moved_to_another_executor_continue_decoding_identically() -> None:
    prompt = PROMPT[:22]
    expected = greedy_alone(prompt, 10)
    prefill_node = make_executor()
    prefill_table = (9, 3, 17, 5, 30, 2)
    first = prefill_node.execute([SeqWork(7, tuple(prompt), 0, prefill_table, True)])[7]
    num_prompt_blocks = -(-len(prompt) // BLOCK_SIZE)
    data = prefill_node.read_blocks(prefill_table[:num_prompt_blocks])
    assert data.shape == (num_prompt_blocks, prefill_node.kv_bytes_per_block)
    assert prefill_node.kv_bytes_per_token * BLOCK_SIZE == prefill_node.kv_bytes_per_block
    decode_node = make_executor()
    decode_table = (40, 41, 44, 43, 42, 50, 51, 52)
    decode_node.write_blocks(decode_table[:num_prompt_blocks], data.tobytes())
    tokens = [first]
    position = len(prompt)
    while len(tokens) < 10:
        work = SeqWork(7, (tokens[-1],), position, decode_table, True)
        tokens.append(decode_node.execute([work])[7])
        position += 1
    assert tokens == expected


def test_read_blocks_rejects_foreign_sizes_and_ids() -> None:
    executor = make_executor(num_blocks=8)
    data = executor.read_blocks([1, 2])
    with pytest.raises(ValueError):
        executor.write_blocks([1], data)
    with pytest.raises(IndexError):
        executor.read_blocks([8])


def test_invalid_steps_are_refused() -> None:
    executor = make_executor()
    with pytest.raises(ValueError, match="cannot hold"):
        executor.execute([SeqWork(0, tuple(PROMPT[:9]), 0, (0, 1), True)])
    with pytest.raises(ValueError, match="twice"):
        executor.execute([SeqWork(0, (1,), 0, (0,), True), SeqWork(0, (2,), 0, (1,), True)])
    with pytest.raises(ValueError, match="vocabulary"):
        executor.execute([SeqWork(0, (512,), 0, (0,), True)])
    assert executor.execute([SeqWork(0, (5, 6), 0, (0,), False)]) == {}


def test_sampling_is_seeded_per_position_and_independent_of_batching() -> None:
    hot = SamplingParams(temperature=1.5, top_p=0.95, seed=11)
    alone = generate(make_executor(), PROMPT, 12, sampling=hot).token_ids
    again = generate(make_executor(), PROMPT, 12, sampling=hot, prefill_chunk_tokens=5).token_ids
    assert alone == again
    other = SamplingParams(temperature=1.5, top_p=0.95, seed=12)
    assert generate(make_executor(), PROMPT, 12, sampling=other).token_ids != alone
    greedy = greedy_alone(PROMPT, 12)
    assert list(alone) != greedy  # the random weights give a flat enough distribution
    narrow = SamplingParams(temperature=1.0, top_p=1e-6, seed=5)
    assert list(generate(make_executor(), PROMPT, 12, sampling=narrow).token_ids) == greedy
    zero = SamplingParams(temperature=0.0, seed=5)
    assert list(generate(make_executor(), PROMPT, 12, sampling=zero).token_ids) == greedy


def test_bfloat16_executor_stays_close_to_float32() -> None:
    table = tuple(range(16))
    work = SeqWork(0, tuple(PROMPT), 0, table, True)
    exact = make_executor().forward([work])[0]
    model = make_tiny_model(seed=0).model
    executor = TorchExecutor(model, num_blocks=16, block_size=BLOCK_SIZE, dtype=torch.bfloat16)
    assert executor.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2  # layers, K/V, heads, dim, bytes
    approx = executor.forward([work])[0]
    assert approx.dtype == torch.float32
    assert float((approx - exact).abs().max()) < 0.1 * float(exact.std())
    # the bfloat16 choice is the float32 best or within the error bound of it (the tiny
    # model's top two logits can tie to a thousandth)
    assert float(exact[int(approx.argmax())]) >= float(exact.max()) - 0.1 * float(exact.std())


def test_rotary_frequencies_stay_float32_in_a_bfloat16_model() -> None:
    model = make_tiny_model(seed=0).model.to(torch.bfloat16)
    assert model.rotary.inv_freq.dtype == torch.float32
    positions = torch.tensor([100_000])
    cos, _ = model.rotary.cos_sin(positions, torch.float32)
    reference = Rotary(model.config.head_dim, model.config.rope_theta)
    expected, _ = reference.cos_sin(positions, torch.float32)
    assert torch.equal(cos, expected)


def test_stop_tokens_end_generation() -> None:
    tokens = greedy_alone(PROMPT, 10)
    stop = tokens[4]
    first = tokens.index(stop)
    result = generate(make_executor(), PROMPT, 10, stop_token_ids={stop})
    assert result.stopped
    assert list(result.token_ids) == tokens[:first]
