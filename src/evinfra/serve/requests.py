"""A request in flight at the frontend, and the handle its HTTP handler reads from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from evinfra.core.types import Request, Route
from evinfra.policy.base import RequestFinished
from evinfra.serve.protocol import FinishReason, Generation


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """New tokens of a request; `finish` or `error` on its last event."""

    token_ids: tuple[int, ...]
    finish: FinishReason | None = None
    error: str | None = None

    @property
    def is_last(self) -> bool:
        return self.finish is not None or self.error is not None


class RequestHandle:
    """What a caller of `LocalCluster.generate` holds: the events, and a way to abort."""

    def __init__(
        self, request_id: int, num_prompt_tokens: int, on_abort: Callable[[RequestHandle], None]
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.num_cached_tokens = 0
        self.num_transfer_bytes = 0
        """KV bytes moved between nodes for this request so far."""
        self.num_pulled_bytes = 0
        """Of `num_transfer_bytes`, a prefix pulled from another node before the prefill."""
        self.events: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.done = False
        self._on_abort = on_abort

    def push(self, event: StreamEvent) -> None:
        if event.is_last:
            self.done = True
        self.events.put_nowait(event)

    async def stream(self) -> AsyncIterator[StreamEvent]:
        """Events until the last one (inclusive)."""
        while True:
            event = await self.events.get()
            yield event
            if event.is_last:
                return

    def abort(self) -> None:
        """Drop the request if it is still running (idempotent)."""
        if not self.done:
            self.done = True
            self._on_abort(self)


@dataclass(slots=True)
class LiveRequest:
    request: Request
    generation: Generation
    handle: RequestHandle
    arrival_s: float
    route: Route | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_retries: int = 0


def finished_observation(live: LiveRequest, now_s: float) -> RequestFinished:
    """What the planner is told when a request's last token is out."""
    first = live.first_token_s if live.first_token_s is not None else now_s
    ttft = first - live.arrival_s
    e2e = now_s - live.arrival_s
    n = live.num_output_tokens
    tpot = (now_s - first) / (n - 1) if n > 1 else 0.0
    return RequestFinished(live.request, now_s, live.num_cached_tokens, ttft, e2e, tpot)
