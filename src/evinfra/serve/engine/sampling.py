"""Next-token choice: greedy by default, or temperature and nucleus (top-p) sampling.

A sampled draw is seeded by `(seed, position)` alone, so a sequence draws the same token
at a position whatever it was batched with, and whichever node (prefill or decode) draws
it: no generator state has to follow the sequence around.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_SEED_STRIDE = 1_000_003  # odd prime: distinct (seed, position) pairs give distinct seeds


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def sample_token(logits: torch.Tensor, params: SamplingParams | None, position: int) -> int:
    """The token to place at `position` given the float logits `[vocab]` before it."""
    if params is None or params.is_greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = torch.where(before < params.top_p, sorted_probs, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = torch.Generator(device=probs.device)
    generator.manual_seed((params.seed * _SEED_STRIDE + position) % (2**63))
    return int(torch.multinomial(probs, 1, generator=generator).item())
