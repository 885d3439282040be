"""Iterator helpers for the policy core's hot loops."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

_SINK: deque[object] = deque(maxlen=0)

run_all: Callable[[Iterable[object]], None] = _SINK.extend
"""Runs an iterator to its end in C and keeps nothing: for the calls a `map` makes for
their effects (`run_all(map(table.pop, keys))`), where a Python loop costs a bytecode
round per item."""
