"""What a workload hands a runtime: session plans and when they start.

A session's calls are fixed in advance (their content does not depend on server timing);
*when* each call is sent is decided by the runtime, closed-loop: call k+1 is sent
`think_s` after call k finished (and after the sub-agents that call k forked have all
finished). Prompt content is a tuple of segments (core.blocks.Segment), so any block size
can hash it; a call's output is `Segment(output_content_id, num_output_tokens)`, and a
later call that resends it hits the KV the decode produced.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from evinfra.core.blocks import Segment
from evinfra.core.types import ContextEvent


@dataclass(frozen=True, slots=True)
class Call:
    segments: tuple[Segment, ...]
    num_output_tokens: int
    output_content_id: int
    think_s: float
    """Wait before this call is sent, counted from the end of its predecessor (tool or
    human time). For a session's first call: from the session's start."""
    context_event: ContextEvent = ContextEvent.APPEND
    expected_tool_s: float | None = None
    """The client's hint of the tool time after this call (None: no hint)."""
    forks: tuple[SessionPlan, ...] = ()
    """Sub-agent sessions started when this call finishes; the next call waits for them."""

    @property
    def num_prompt_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)


@dataclass(frozen=True, slots=True)
class SessionPlan:
    session_id: str
    kind: str
    calls: tuple[Call, ...]
    parent_session_id: str | None = None


@dataclass(frozen=True, slots=True)
class SessionArrival:
    start_s: float
    plan: SessionPlan


class Workload(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def concurrency(self) -> int | None:
        """When set, the runtime keeps this many sessions running, starting the next one
        from `arrivals()` when one ends, and ignores their `start_s`."""

    def arrivals(self) -> Iterator[SessionArrival]:
        """Sessions in order of `start_s` (lazily; may be endless: the runtime stops at its
        horizon)."""
