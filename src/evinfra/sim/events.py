"""The event queue: one ordering, `(time_s, phase, seq)`, so ties are never accidental."""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable


class Phase(enum.IntEnum):
    """At equal times: work completes before new work arrives, before policies look."""

    STEP_DONE = 0
    TRANSFER_DONE = 1
    NODE_READY = 2
    CALL = 3
    SESSION_START = 4
    KV_TICK = 5
    PLAN = 6
    SAMPLE = 7


# (time_s, phase, seq, action): tuples compare in C; seq is unique, so the action is
# never compared
_Entry = tuple[float, int, int, Callable[[], None]]


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._seq = 0
        self.now_s = 0.0
        self.num_processed = 0

    def push(self, time_s: float, phase: Phase, action: Callable[[], None]) -> None:
        if time_s < self.now_s:
            raise ValueError(f"event at {time_s} is before now {self.now_s}")
        self._seq += 1
        heapq.heappush(self._heap, (time_s, int(phase), self._seq, action))

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_until(self, end_s: float, stop: Callable[[], bool] | None = None) -> None:
        """Pop, set the clock, handle; until the queue is empty, `end_s` or `stop()`."""
        heap = self._heap
        while heap and heap[0][0] <= end_s:
            time_s, _, _, action = heapq.heappop(heap)
            self.now_s = time_s
            action()
            self.num_processed += 1
            if stop is not None and stop():
                return
