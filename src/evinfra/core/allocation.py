"""When a node's scheduler gives a prefill its KV blocks: all at admission, or chunk by
chunk as vLLM does. The choice moves latency under KV pressure, so it is a setting of the
scheduler (`SchedulerConfig.allocation`), the same on the simulator and the servers."""

from __future__ import annotations

import enum


class Allocation(enum.Enum):
    PROMPT = "prompt"
    """Admission takes blocks for the whole prompt, so a prefill never runs short; a long
    prompt waits at the head of the queue until its whole KV is free (evinfra's default)."""
    CHUNK = "chunk"
    """Admission takes the cached prefix and the first chunk's blocks; each later chunk
    takes the blocks it needs before it is scheduled, preempting newer sequences when they
    run out (vLLM v1's `allocate_slots` per scheduled chunk)."""
    CHUNK_WHEN_PROMPT_FITS = "chunk-when-prompt-fits"
    """Blocks chunk by chunk as `CHUNK`, but a waiting sequence is admitted only once its
    whole prompt would fit the free blocks now (Dynamo 1.6.1's mocker, vLLM policy: its
    admission check counts the whole known sequence, its allocation the chunk)."""

    @property
    def per_chunk(self) -> bool:
        return self is not Allocation.PROMPT


ALLOCATIONS = tuple(a.value for a in Allocation)


def parse_allocation(value: str | Allocation) -> Allocation:
    """An `Allocation` from its name (a config file's or a flag's value)."""
    if isinstance(value, Allocation):
        return value
    try:
        return Allocation(value)
    except ValueError:
        names = ", ".join(ALLOCATIONS)
        raise ValueError(f"allocation must be one of {names}, got {value!r}") from None
