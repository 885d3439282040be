"""`evinfra replay`: drive agent sessions against any OpenAI-compatible server.

Sessions come from the workload generators or a trace. Closed-loop: a session's next
call is sent when the previous one (and the sub-agents it forked) finished and its think
time passed, so a faster server finishes sessions sooner; trace rows, one-call sessions,
are sent at their timestamps (open-loop). Prompts go as token ids to `/v1/completions`,
streamed, with the `agent` hints object and an `X-Session-Id` header. The run stops
sending at `max_requests` or `max_duration_s`, waits for what is in flight (at most
`drain_s`), and summarises with the simulator's metric names (`sim.metrics.summarize`).

Prompt token ids are rendered from the workload's segments, outputs included: a later
call's copy of an earlier answer is the rendered answer, not the server's, so a server's
cache can hit it only when its output is forced to match (it is not here).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from evinfra.core.blocks import Segment
from evinfra.sim.metrics import KV_BYTES_KEYS, Metrics, RequestRecord, summarize
from evinfra.workloads.replay import CallRef, ClosedLoopTracker, ScheduledCall
from evinfra.workloads.requests import make_hints, render_tokens
from evinfra.workloads.types import SessionArrival, Workload


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    url: str
    model: str | None = None
    """None: the first model the server lists."""
    max_requests: int = 100
    max_duration_s: float = 60.0
    drain_s: float = 60.0
    request_timeout_s: float = 300.0
    hints: bool = True
    token_scale: float = 1.0
    """Multiplies every segment's and output's length (min 1): shrinks a workload for a
    small model while keeping its prefix structure."""
    max_context_tokens: int | None = None
    """The context limit every call is cut to (`cut_to_context`). Set, it takes precedence
    over whatever the server lists, so servers that list different limits (or none) get
    the same calls; a call within it but over the server's own limit is sent as it is and
    the server answers with its error. None: the server's `max_model_len` when it lists
    one, else no limit."""
    vocab_size: int | None = None
    """None: the server's `vocab_size` when it lists one, else 32000."""
    min_token_id: int = 16
    seed: int = 0
    warmup_s: float = 0.0
    num_gpus: int = 1
    label: str | None = None

    def __post_init__(self) -> None:
        if self.max_context_tokens is not None:
            check_max_context_tokens(self.max_context_tokens)


MIN_CONTEXT_TOKENS = 2


def check_max_context_tokens(value: int) -> int:
    """`value` as a context limit, or ValueError: a cut call keeps a prompt token and an
    output token."""
    if value < MIN_CONTEXT_TOKENS:
        raise ValueError(
            f"max_context_tokens must be at least {MIN_CONTEXT_TOKENS} (a prompt token and an"
            f" output token), got {value}"
        )
    return value


def cut_to_context(
    num_prompt_tokens: int, max_tokens: int, max_context_tokens: int | None
) -> tuple[int, int]:
    """(prompt tokens kept, max_tokens) of a call under a context limit. A call whose prompt
    and output fit is unchanged; a longer one keeps its output up to a quarter of the limit
    (at least 1) and the head of its prompt up to the rest, so the server is neither sent a
    prompt it must reject nor left without room to decode."""
    if max_context_tokens is None or num_prompt_tokens + max_tokens <= max_context_tokens:
        return num_prompt_tokens, max_tokens
    max_tokens = min(max_tokens, max(1, max_context_tokens // 4))
    return min(num_prompt_tokens, max_context_tokens - max_tokens), max_tokens


@dataclass(slots=True)
class Trace:
    """One request as the client saw it."""

    request_id: int
    session_id: str
    send_s: float
    num_prompt_tokens: int
    max_tokens: int
    chunk_s: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_handed_off_bytes: int | None = None
    """KV bytes the server moved for this call from its prefill node to its decode node,
    None where the server does not say (`usage.kv_transfer_details`, evinfra's own)."""
    num_pulled_bytes: int | None = None
    """KV bytes of a prefix the server pulled from another node for this call."""
    finish_s: float | None = None
    error: str | None = None

    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False)]

    def to_json(self) -> dict[str, Any]:
        ttft = self.chunk_s[0] - self.send_s if self.chunk_s else None
        e2e = self.finish_s - self.send_s if self.finish_s is not None else None
        return {
            "request_id": self.request_id, "session_id": self.session_id,
            "send_s": self.send_s, "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "num_handed_off_bytes": self.num_handed_off_bytes,
            "num_pulled_bytes": self.num_pulled_bytes, "ttft_s": ttft, "e2e_s": e2e,
            "itl_s": self.itl_s(), "error": self.error,
        }  # fmt: skip


@dataclass(slots=True)
class ReplayResult:
    summary: dict[str, Any]
    traces: list[Trace]


def _scale(n: int, factor: float) -> int:
    return n if factor == 1.0 else max(1, round(n * factor))


class Replayer:
    def __init__(self, settings: ReplaySettings, workload: Workload) -> None:
        self.s = settings
        self.workload = workload
        self.metrics = Metrics()
        self.traces: list[Trace] = []
        self.tracker = ClosedLoopTracker()
        self._arrivals: Iterator[SessionArrival] = workload.arrivals()
        self._num_sent = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._sending: set[asyncio.Task[None]] = set()
        self._t0 = 0.0
        self._stop_sending = False
        self._model = settings.model or ""
        self._vocab = settings.vocab_size or 32000
        self._max_context = settings.max_context_tokens
        self._server_max_context: int | None = None
        self._num_cut = 0

    def now_s(self) -> float:
        return time.monotonic() - self._t0

    async def run(self) -> ReplayResult:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(self.s.request_timeout_s, connect=30.0)
        async with httpx.AsyncClient(base_url=self.s.url, timeout=timeout, limits=limits) as c:
            await self._discover(c)
            self._t0 = time.monotonic()
            feeder = asyncio.create_task(self._feed_sessions(c))
            await self._wait_until_done(feeder)
        end_s = self.now_s()
        return ReplayResult(self._summary(end_s), self.traces)

    async def _discover(self, client: httpx.AsyncClient) -> None:
        resp = await client.get("/v1/models")
        resp.raise_for_status()
        cards = resp.json().get("data", [])
        if not cards and not self._model:
            raise RuntimeError(f"{self.s.url}/v1/models lists no model")
        card = next((c for c in cards if c.get("id") == self._model), cards[0] if cards else {})
        self._model = self._model or str(card["id"])
        if self.s.vocab_size is None and isinstance(card.get("vocab_size"), int):
            self._vocab = card["vocab_size"]
        if isinstance(card.get("max_model_len"), int):
            self._server_max_context = card["max_model_len"]
        if self._max_context is None:
            self._max_context = self._server_max_context

    async def _wait_until_done(self, feeder: asyncio.Task[None]) -> None:
        deadline = self.s.max_duration_s
        while self.now_s() < deadline and not (feeder.done() and not self._tasks):
            if self._num_sent >= self.s.max_requests and not self._sending:
                break
            await asyncio.sleep(0.02)
        self._stop_sending = True
        feeder.cancel()
        for task in self._tasks - self._sending:
            task.cancel()  # calls still waiting out their think time
        pending = [t for t in self._sending if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.s.drain_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await asyncio.gather(feeder, return_exceptions=True)

    async def _feed_sessions(self, client: httpx.AsyncClient) -> None:
        """Start sessions: `concurrency` at once (and one per finished one), or each at its
        `start_s` (open-loop arrivals)."""
        conc = self.workload.concurrency
        if conc is not None:
            for _ in range(conc):
                self._start_next(client)
            return
        for arrival in self._arrivals:
            wait = arrival.start_s - self.now_s()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._stop_sending or self.now_s() >= self.s.max_duration_s:
                return
            self._start(arrival, client)

    def _start_next(self, client: httpx.AsyncClient) -> None:
        if self._stop_sending:
            return
        arrival = next(self._arrivals, None)
        if arrival is not None:
            self._start(arrival, client)

    def _start(self, arrival: SessionArrival, client: httpx.AsyncClient) -> None:
        now = self.now_s()
        self.metrics.session_start_s[arrival.plan.session_id] = now
        self._schedule(self.tracker.start(arrival.plan, now), client)

    def _schedule(self, item: ScheduledCall, client: httpx.AsyncClient) -> None:
        task = asyncio.create_task(self._call(item, client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, item: ScheduledCall, client: httpx.AsyncClient) -> None:
        wait = item.send_at_s - self.now_s()
        if wait > 0:
            await asyncio.sleep(wait)
        if self._stop_sending or self._num_sent >= self.s.max_requests:
            return
        if self.now_s() >= self.s.max_duration_s:
            return
        rid = self._num_sent
        self._num_sent += 1
        me = asyncio.current_task()
        assert me is not None
        self._sending.add(me)
        try:
            trace = await self._send(rid, item.ref, client)
        finally:
            self._sending.discard(me)
        if self._stop_sending:
            return
        if trace.finish_s is None:
            if self.workload.concurrency is not None:
                self._start_next(client)  # the session is abandoned: keep the concurrency
            return
        progress = self.tracker.on_finished(item.ref, trace.finish_s)
        for sid in progress.finished_sessions:
            self.metrics.session_end_s[sid] = trace.finish_s
            if self.workload.concurrency is not None:
                self._start_next(client)
        for nxt in progress.scheduled:
            self._schedule(nxt, client)

    def _payload(self, ref: CallRef) -> tuple[dict[str, Any], dict[str, str], int]:
        call = ref.plan.calls[ref.call_index]
        k = self.s.token_scale
        segments = [Segment(s.content_id, _scale(s.num_tokens, k)) for s in call.segments]
        prompt = render_tokens(segments, self._vocab, self.s.seed, min_token_id=self.s.min_token_id)
        num_output = _scale(call.num_output_tokens, k)
        num_prompt, max_tokens = cut_to_context(len(prompt), num_output, self._max_context)
        if (num_prompt, max_tokens) != (len(prompt), num_output):
            self._num_cut += 1
        prompt = prompt[:num_prompt]
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        headers: dict[str, str] = {}
        if self.s.hints:
            hints = make_hints(ref.plan, ref.call_index)
            agent: dict[str, Any] = {
                "session_id": hints.session_id,
                "parent_session_id": hints.parent_session_id,
                "turn": hints.turn,
                "expected_tool_s": hints.expected_tool_s,
                "context_event": hints.context_event.value if hints.context_event else None,
                "is_last_turn": hints.is_last_turn,
            }
            body["agent"] = {k2: v for k2, v in agent.items() if v is not None}
            headers["X-Session-Id"] = hints.session_id
        return body, headers, len(prompt)

    async def _send(self, rid: int, ref: CallRef, client: httpx.AsyncClient) -> Trace:
        body, headers, num_prompt = self._payload(ref)
        trace = Trace(rid, ref.session_id, self.now_s(), num_prompt, body["max_tokens"])
        self.traces.append(trace)
        try:
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    trace.error = f"HTTP {r.status_code}: {text[:300]}"
                    return trace
                async for line in r.aiter_lines():
                    if self._on_line(trace, line):
                        break
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            trace.error = f"{type(exc).__name__}: {exc}"
            return trace
        if trace.error is None:
            trace.finish_s = self.now_s()
        return trace

    def _on_line(self, trace: Trace, line: str) -> bool:
        """Handle one SSE line; True at the end of the stream."""
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        obj = json.loads(data)
        if not isinstance(obj, dict):
            trace.error = f"stream chunk is not a JSON object: {data[:200]}"
            return True
        if "error" in obj:
            trace.error = str(obj["error"].get("message", obj["error"]))
            return True
        choices = obj.get("choices") or []
        # a closing chunk after tokens carries none (Dynamo); one that carries the only
        # token (its text may be empty) counts
        if choices and (not trace.chunk_s or any(not _finish_only(c) for c in choices)):
            trace.chunk_s.append(self.now_s())
        use = obj.get("usage")
        if use:
            try:
                _read_usage(trace, use)
            except (AttributeError, TypeError, ValueError) as exc:
                trace.error = f"malformed usage {json.dumps(use)[:200]}: {exc}"
                return True
        return False

    def _summary(self, end_s: float) -> dict[str, Any]:
        kind = self.workload.name
        for t in self.traces:
            rec = RequestRecord(
                t.request_id, t.session_id, kind, t.send_s, t.num_prompt_tokens,
                t.num_output_tokens or len(t.chunk_s),
            )  # fmt: skip
            if t.error is None and t.finish_s is not None:
                rec.first_token_s = t.chunk_s[0] if t.chunk_s else t.finish_s
                rec.finish_s = t.finish_s
            rec.num_cached_tokens = t.num_cached_tokens
            rec.num_pulled_bytes = t.num_pulled_bytes or 0
            rec.num_transfer_bytes = (t.num_handed_off_bytes or 0) + rec.num_pulled_bytes
            self.metrics.records[t.request_id] = rec
        summary: dict[str, Any] = {"system": self.s.label or self._model}
        summary.update(
            summarize(self.metrics, warmup_s=self.s.warmup_s, end_s=end_s, num_gpus=self.s.num_gpus)
        )
        if not any(t.num_handed_off_bytes is not None for t in self.traces):
            # a server that does not report its transfers (Dynamo): unknown, not zero
            for key in KV_BYTES_KEYS:
                summary[key] = math.nan
        itl = np.array([g for t in self.traces if t.error is None for g in t.itl_s()], dtype=float)
        for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
            summary[f"{name}_itl_s"] = float(np.percentile(itl, q)) if len(itl) else math.nan
        summary["mean_itl_s"] = float(itl.mean()) if len(itl) else math.nan
        summary["num_errors"] = sum(1 for t in self.traces if t.error is not None)
        summary["url"] = self.s.url
        summary["max_context_tokens"] = self._max_context
        summary["server_max_model_len"] = self._server_max_context
        summary["num_cut_calls"] = self._num_cut
        summary["wall_s"] = end_s
        return summary


def run_replay(settings: ReplaySettings, workload: Workload) -> ReplayResult:
    return asyncio.run(Replayer(settings, workload).run())


def _read_usage(trace: Trace, use: dict[str, Any]) -> None:
    """The counts of a response's `usage` into its trace (evinfra's `kv_transfer_details`
    where the server sends it); a field of the wrong type raises."""
    trace.num_output_tokens = int(use.get("completion_tokens", 0))
    details = use.get("prompt_tokens_details") or {}
    trace.num_cached_tokens = int(details.get("cached_tokens") or 0)
    kv = use.get("kv_transfer_details")
    if kv is not None:
        trace.num_handed_off_bytes = int(kv.get("handed_off_bytes") or 0)
        trace.num_pulled_bytes = int(kv.get("pulled_bytes") or 0)


def _finish_only(choice: dict[str, Any]) -> bool:
    """A chunk that only closes the stream (Dynamo sends `finish_reason` in a chunk of its
    own after the last token): no token, so not counted for TTFT or ITL."""
    delta = choice.get("delta") or {}
    text = choice.get("text") or delta.get("content") or ""
    return choice.get("finish_reason") is not None and not text and not choice.get("token_ids")
