"""A Llama-family decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU)
that reads and writes its keys and values through a paged KV cache.

Parameter names follow the Hugging Face `LlamaForCausalLM` layout (`model.layers.N.
self_attn.q_proj.weight`...), with Q and K rows in its rotate-half order, so a state dict
moves between the two without renaming. One forward pass runs a flat batch of tokens from
several sequences (prefill chunks and decodes mixed); attention is per sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from evinfra.serve.engine.config import LlamaConfig
from evinfra.serve.engine.paged_kv import PagedKVCache


@dataclass(frozen=True, slots=True)
class SeqSpan:
    """One sequence's rows in a flat batch and the context its queries attend to."""

    query_start: int  # first row of this sequence in the flat batch
    num_query_tokens: int
    num_context_tokens: int  # cached tokens plus the new ones
    block_table: torch.Tensor  # long, the sequence's block ids
    mask: torch.Tensor | None  # bool [queries, context]; None: no mask or plain causal
    is_causal: bool


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Sequences with one new token each, attended in one padded call."""

    rows: torch.Tensor  # long [num_seqs], their rows in the flat batch
    block_index: torch.Tensor  # long [num_seqs, max_blocks], block tables padded with block 0
    key_mask: torch.Tensor  # bool [num_seqs, 1, 1, max_blocks * block_size]: real context


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Where each new token's K/V go, and what each sequence attends to: prefill chunks
    one by one (`spans`), single-token decodes together (`decode`)."""

    write_blocks: torch.Tensor  # long [num_tokens]
    write_offsets: torch.Tensor  # long [num_tokens]
    spans: tuple[SeqSpan, ...]
    decode: DecodeGroup | None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in float32 whatever the model dtype, as the reference does
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """Rotate-half rotary embeddings; cos/sin computed for the batch's positions."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        # a plain attribute, not a buffer: `model.to(bfloat16)` must not round the
        # frequencies (angles at long positions would drift by whole radians)
        self.inv_freq = 1.0 / (theta**exponents)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: AttentionBatch,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        cos, sin = cos_sin
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        cache.write(self.layer, k, v, batch.write_blocks, batch.write_offsets)
        out = torch.empty_like(q)
        for span in batch.spans:
            rows = slice(span.query_start, span.query_start + span.num_query_tokens)
            ctx_k, ctx_v = cache.gather(self.layer, span.block_table, span.num_context_tokens)
            attn = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1).unsqueeze(0),
                ctx_k.to(q.dtype).transpose(0, 1).unsqueeze(0),
                ctx_v.to(q.dtype).transpose(0, 1).unsqueeze(0),
                attn_mask=span.mask,
                is_causal=span.is_causal,
                enable_gqa=True,
            )
            out[rows] = attn.squeeze(0).transpose(0, 1)
        if batch.decode is not None:
            group = batch.decode
            pad_k, pad_v = cache.gather_padded(self.layer, group.block_index)
            attn = F.scaled_dot_product_attention(
                q[group.rows].unsqueeze(2),  # [seqs, heads, 1, dim]
                pad_k.to(q.dtype).transpose(1, 2),
                pad_v.to(q.dtype).transpose(1, 2),
                attn_mask=group.key_mask,
                enable_gqa=True,
            )
            out[group.rows] = attn.squeeze(2)
        result: torch.Tensor = self.o_proj(out.reshape(n, self.num_heads * self.head_dim))
        return result


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return result


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: AttentionBatch,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, batch, cache)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Backbone(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaDecoder(nn.Module):
    """The decoder; `forward` returns final hidden states, `logits` projects chosen rows."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        cache: PagedKVCache,
    ) -> torch.Tensor:
        x: torch.Tensor = self.model.embed_tokens(token_ids)
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos_sin, batch, cache)
        result: torch.Tensor = self.model.norm(x)
        return result

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.lm_head(hidden).float()
        return result

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], assign: bool = False) -> None:
        """Copy a Hugging Face-named state dict in; every parameter must be present.

        With `assign`, the module takes the given tensors instead of copying them (a model
        built on the meta device becomes real this way).
        """
        expected = set(self.state_dict())
        if self.config.tie_word_embeddings:
            expected.discard("lm_head.weight")
        given = {k: v for k, v in state_dict.items() if k in expected}
        missing = expected - set(given)
        if missing:
            raise KeyError(f"state dict lacks {sorted(missing)[:5]} ({len(missing)} in all)")
        self.load_state_dict(given, strict=False, assign=assign)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if assign:
            # the rotary table is computed, not loaded: rebuild it on the weights' device
            device = self.model.embed_tokens.weight.device
            self.rotary = Rotary(self.config.head_dim, self.config.rope_theta).to(device)


def init_random_weights(model: LlamaDecoder, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) matrices and near-one norm weights from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(std * torch.randn(param.shape, generator=generator))
