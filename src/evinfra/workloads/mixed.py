"""A mixed population of coding, math and computer-use sessions whose shares shift in
phases (coding-heavy, then math-heavy, then computer-use-heavy, then again): the case
where a PD split fixed for one composition is wrong most of the time."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from evinfra.workloads.arrivals import SessionGenerator
from evinfra.workloads.ids import mix64, text_key

_MIX_KEY = text_key("mixed")

Shares = tuple[float, float, float]
"""Shares of (coding, math, computer-use) sessions in a phase."""


@dataclass(frozen=True, slots=True)
class MixedParams:
    phases: tuple[Shares, ...] = ((0.7, 0.15, 0.15), (0.15, 0.7, 0.15), (0.15, 0.15, 0.7))
    phase_s: float = 600.0
    """Phase length when sessions arrive by rate; the phases then repeat."""
    phase_sessions: int = 200
    """Phase length in sessions when a fixed concurrency starts them (no clock to use)."""

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("phases must not be empty")
        for shares in self.phases:
            if len(shares) != 3 or min(shares) < 0 or sum(shares) <= 0:
                raise ValueError(f"phase shares must be three non-negative numbers: {shares}")
        if self.phase_s <= 0 or self.phase_sessions < 1:
            raise ValueError("phase_s and phase_sessions must be positive")


def parse_phases(text: str) -> tuple[Shares, ...]:
    """'0.7/0.15/0.15,0.15/0.7/0.15' -> ((0.7, 0.15, 0.15), (0.15, 0.7, 0.15))."""
    phases: list[Shares] = []
    for part in text.split(","):
        values = [float(v) for v in part.split("/")]
        if len(values) != 3:
            raise ValueError(f"phases: each phase is coding/math/computer-use shares: {part!r}")
        phases.append((values[0], values[1], values[2]))
    return tuple(phases)


class MixedPicker:
    """Chooses each session's kind from the shares of the phase it starts in."""

    def __init__(
        self,
        params: MixedParams,
        generators: Sequence[SessionGenerator],
        seed: int,
        *,
        by_time: bool,
    ) -> None:
        if len(generators) != 3:
            raise ValueError("mixed needs coding, math and computer-use generators")
        self.params = params
        self._generators = tuple(generators)
        self._seed = seed
        self._by_time = by_time

    def phase_index(self, index: int, start_s: float) -> int:
        p = self.params
        step = int(start_s // p.phase_s) if self._by_time else index // p.phase_sessions
        return step % len(p.phases)

    def __call__(self, index: int, start_s: float) -> SessionGenerator:
        shares = self.params.phases[self.phase_index(index, start_s)]
        u = random.Random(mix64(self._seed, _MIX_KEY, index)).random() * sum(shares)
        for generator, share in zip(self._generators, shares, strict=True):
            if u < share:
                return generator
            u -= share
        return self._generators[-1]
