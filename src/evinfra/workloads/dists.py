"""Small, seeded distributions for the generators (values with a `draw(rng)` method).

Randomness always comes from a `random.Random` passed in: same seed, same workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

_STD_NORMAL = NormalDist()


class Dist(Protocol):
    def draw(self, rng: random.Random) -> float: ...


@dataclass(frozen=True, slots=True)
class Constant:
    value: float

    def draw(self, rng: random.Random) -> float:
        return self.value


@dataclass(frozen=True, slots=True)
class Uniform:
    lo: float
    hi: float

    def draw(self, rng: random.Random) -> float:
        return rng.uniform(self.lo, self.hi)


@dataclass(frozen=True, slots=True)
class UniformInt:
    """An integer in [lo, hi], both included."""

    lo: int
    hi: int

    def draw(self, rng: random.Random) -> float:
        return float(rng.randint(self.lo, self.hi))


@dataclass(frozen=True, slots=True)
class LogNormal:
    """exp(N(mu, sigma)), clipped to [lo, hi]."""

    mu: float
    sigma: float
    lo: float = 0.0
    hi: float = math.inf

    @classmethod
    def from_median(
        cls, median: float, sigma: float, lo: float = 0.0, hi: float = math.inf
    ) -> LogNormal:
        return cls(math.log(median), sigma, lo, hi)

    def draw(self, rng: random.Random) -> float:
        return min(max(rng.lognormvariate(self.mu, self.sigma), self.lo), self.hi)


@dataclass(frozen=True, slots=True)
class OneOrLogNormal:
    """A count: 1 with probability `p_one`, else ceil(exp(N(mu, sigma))) capped at `hi`.

    TraceLab's per-session counts have a median of 1 and a heavy tail, which a single
    lognormal cannot fit together with their p90 and p99; a point mass at 1 plus a
    lognormal body can.
    """

    p_one: float
    mu: float
    sigma: float
    hi: int

    def draw(self, rng: random.Random) -> float:
        if rng.random() < self.p_one:
            return 1.0
        return float(min(max(1, math.ceil(rng.lognormvariate(self.mu, self.sigma))), self.hi))


@dataclass(frozen=True, slots=True)
class LogNormalParetoTail:
    """A lognormal body whose top (above its `tail_quantile`) is replaced by a Pareto tail
    of index `alpha` starting there, clipped at `hi` (human think time: a lognormal fits
    the median and p90 but not the hours-long p99)."""

    mu: float
    sigma: float
    tail_quantile: float
    alpha: float
    hi: float = math.inf

    @property
    def tail_start(self) -> float:
        return math.exp(self.mu + self.sigma * _STD_NORMAL.inv_cdf(self.tail_quantile))

    def draw(self, rng: random.Random) -> float:
        x = rng.lognormvariate(self.mu, self.sigma)
        start = self.tail_start
        if x > start:
            x = start * rng.paretovariate(self.alpha)
        return min(x, self.hi)


def draw_tokens(dist: Dist, rng: random.Random, minimum: int = 1) -> int:
    """A token count drawn from `dist`, rounded, at least `minimum`."""
    return max(minimum, round(dist.draw(rng)))


def lognormal_quantile(mu: float, sigma: float, q: float) -> float:
    return math.exp(mu + sigma * _STD_NORMAL.inv_cdf(q))
