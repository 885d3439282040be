"""Session arrivals: an open arrival process (Poisson or bursty) with a rate knob, or a
closed pool of concurrent sessions, and the workload object that the runtimes iterate."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from evinfra.workloads.ids import mix64, text_key
from evinfra.workloads.types import SessionArrival, SessionPlan

_ARRIVAL_KEY = text_key("arrivals")


class ArrivalKind(enum.Enum):
    POISSON = "poisson"
    BURSTY = "bursty"


@dataclass(frozen=True, slots=True)
class ArrivalProcess:
    """New sessions at `rate_per_s` on average. Poisson: exponential gaps. Bursty: gamma
    gaps with coefficient of variation `burstiness` (> 1: clumps of sessions separated by
    lulls; the long-run rate is unchanged)."""

    rate_per_s: float
    kind: ArrivalKind = ArrivalKind.POISSON
    burstiness: float = 4.0

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0:
            raise ValueError(f"session rate must be positive, got {self.rate_per_s}")
        if self.kind is ArrivalKind.BURSTY and self.burstiness <= 0:
            raise ValueError(f"burstiness must be positive, got {self.burstiness}")

    def gap_s(self, rng: random.Random) -> float:
        if self.kind is ArrivalKind.POISSON:
            return rng.expovariate(self.rate_per_s)
        shape = 1.0 / (self.burstiness * self.burstiness)
        return rng.gammavariate(shape, 1.0 / (self.rate_per_s * shape))


class SessionGenerator(Protocol):
    @property
    def kind(self) -> str: ...

    def session(self, index: int, session_id: str) -> SessionPlan:
        """Session number `index`; a pure function of the generator's seed and `index`."""


# Picks the generator of session `index` starting at `start_s`.
Picker = Callable[[int, float], SessionGenerator]


class GeneratedWorkload:
    """Sessions drawn lazily from generators. Iterating `arrivals()` twice gives the same
    sessions. With `concurrency` set the runtime keeps that many sessions running and the
    start times are all 0; otherwise sessions arrive by `process`."""

    def __init__(
        self,
        name: str,
        pick: Picker,
        seed: int,
        *,
        process: ArrivalProcess | None,
        concurrency: int | None,
        num_sessions: int | None,
        duration_s: float | None,
        hints: bool,
    ) -> None:
        if (process is None) == (concurrency is None):
            raise ValueError("give exactly one of a session rate and a concurrency")
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if num_sessions is not None and num_sessions < 0:
            raise ValueError(f"num_sessions must not be negative, got {num_sessions}")
        self._name = name
        self._pick = pick
        self._seed = seed
        self._process = process
        self._concurrency = concurrency
        self.num_sessions = num_sessions
        self.duration_s = duration_s
        self.hints = hints
        """Whether requests should carry agent hints (the runtime passes it to make_request)."""

    @property
    def name(self) -> str:
        return self._name

    @property
    def concurrency(self) -> int | None:
        return self._concurrency

    def arrivals(self) -> Iterator[SessionArrival]:
        rng = random.Random(mix64(self._seed, _ARRIVAL_KEY))
        start_s = 0.0
        index = 0
        while self.num_sessions is None or index < self.num_sessions:
            if self._process is not None and index > 0:
                start_s += self._process.gap_s(rng)
            if self.duration_s is not None and start_s > self.duration_s:
                return
            generator = self._pick(index, start_s)
            plan = generator.session(index, f"{generator.kind}-{index}")
            yield SessionArrival(start_s, plan)
            index += 1
